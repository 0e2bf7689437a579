"""Token-bucket batching: exactly once, budget, determinism, mid-epoch resume, sharding, padding efficiency."""

import hashlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mt.config import DataConfig, TokenizerConfig
from mt.data import read
from mt.data.batching import TokenBucketSampler, collate, make_batches
from mt.data.corpus import build_vocabs, tokenize
from mt.data.tokenizer import BOS, EOS, PAD
from tests.conftest import MULTI30K, needs_multi30k

lengths = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=300)


def sampler_for(pairs, max_tokens=200, **kw):
    return TokenBucketSampler([s for s, _ in pairs], [t for _, t in pairs], max_tokens, **kw)


@settings(max_examples=60, deadline=None)
@given(lengths, st.integers(0, 5), st.integers(60, 400))
def test_every_example_exactly_once_and_within_budget(pairs, epoch, max_tokens):
    s = sampler_for(pairs, max_tokens, seed=3)
    s.set_epoch(epoch)
    seen = [i for b in s for i in b]
    assert sorted(seen) == list(range(len(pairs)))
    for b in s.batches():
        padded = len(b) * max(max(pairs[i][0], pairs[i][1]) for i in b)
        assert padded <= max_tokens or len(b) == 1


def test_oversized_example_gets_its_own_batch():
    s = sampler_for([(5, 5), (500, 3), (6, 6)], max_tokens=100)
    assert s.oversized() == 1
    assert [1] in [list(b) for b in s.batches()]


@settings(max_examples=30, deadline=None)
@given(lengths, st.integers(0, 3))
def test_deterministic_for_seed_and_epoch(pairs, epoch):
    a, b = sampler_for(pairs, seed=7), sampler_for(pairs, seed=7)
    a.set_epoch(epoch)
    b.set_epoch(epoch)
    assert list(a) == list(b)


def test_epochs_and_seeds_differ():
    pairs = [(i % 37 + 1, i % 23 + 1) for i in range(500)]
    e0 = list(sampler_for(pairs, seed=1))
    s = sampler_for(pairs, seed=1)
    s.set_epoch(1)
    assert list(s) != e0 and list(sampler_for(pairs, seed=2)) != e0


@settings(max_examples=30, deadline=None)
@given(lengths, st.integers(0, 50))
def test_resume_mid_epoch_gives_the_rest_of_the_epoch(pairs, k):
    full = list(sampler_for(pairs, seed=5))
    first = sampler_for(pairs, seed=5)
    it = iter(first)
    head = [next(it) for _ in range(min(k, len(full)))]
    state = first.state_dict()
    resumed = sampler_for(pairs, seed=0)  # the seed comes back from the state
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


def test_iterating_to_the_end_moves_to_the_next_epoch():
    s = sampler_for([(3, 3)] * 50, seed=1)
    list(s)
    assert s.state_dict() == {"epoch": 1, "position": 0, "seed": 1}


@settings(max_examples=30, deadline=None)
@given(lengths, st.integers(2, 4))
def test_shards_are_disjoint_cover_the_epoch_and_have_equal_counts(pairs, world):
    full = sampler_for(pairs, seed=9).batches()
    shards = [sampler_for(pairs, seed=9, num_replicas=world, rank=r).batches() for r in range(world)]
    assert len({len(s) for s in shards}) == 1
    covered = {i for s in shards for b in s for i in b}
    assert covered == set(range(len(pairs)))
    # Disjoint up to the wrap-around that evens out the counts: the first len(full) batches are a partition.
    interleaved = [shards[j % world][j // world] for j in range(len(full))]
    assert sorted(i for b in interleaved for i in b) == list(range(len(pairs)))


def _greedy_cut(src_lens, tgt_lens, max_tokens, order):
    """The batching rule written as the plain loop it replaces: extend while n * longest fits the budget."""
    batches, start, longest = [], 0, 0
    for i, idx in enumerate(order):
        new_longest = max(longest, src_lens[idx], tgt_lens[idx])
        if i > start and new_longest * (i - start + 1) > max_tokens:
            batches.append(list(order[start:i]))
            start, new_longest = i, max(src_lens[idx], tgt_lens[idx])
        longest = new_longest
    return batches + ([list(order[start:])] if start < len(order) else [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=400),
       st.integers(1, 300), st.booleans())  # small figures: budgets hit exactly, windows outgrown  # fmt: skip
def test_numpy_cuts_equal_the_greedy_loop(pairs, max_tokens, sort):
    src, tgt = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    order = np.random.default_rng(len(pairs)).permutation(len(pairs))
    if sort:
        order = order[np.lexsort((src[order], tgt[order]))]
    got = [b.tolist() for b in make_batches(src, tgt, max_tokens, order)]
    assert got == _greedy_cut(src, tgt, max_tokens, order)


# sha256 of two epochs' batches, recorded with the per-sentence Python loop and np.lexsort that cut them before
# batching was vectorized (commit 63d53b5): the same seed must give the same batches, or a resumed run would not.
RECORDED_BATCHES = {"one rank": "170f2797c5c52298", "rank 2 of 3": "7b6ce8c51b1aaf12", "in order": "db507333d0651f7c"}


def test_batches_are_those_the_loop_cut_for_the_same_seed():
    rng = np.random.default_rng(2024)
    src = np.clip(rng.lognormal(3.0, 0.8, 50_000), 1, 300).astype(int)
    tgt = np.clip(src + rng.integers(-6, 7, 50_000), 1, 300)
    setups = {"one rank": {}, "rank 2 of 3": dict(num_replicas=3, rank=2), "in order": dict(shuffle=False)}
    for name, kw in setups.items():
        sampler = TokenBucketSampler(src, tgt, 3000, seed=7, pool_size=1 << 14, **kw)
        h = hashlib.sha256()
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for b in sampler.batches():
                h.update(np.asarray(b, dtype=np.int64).tobytes() + b"|")
        assert h.hexdigest()[:16] == RECORDED_BATCHES[name], name


def test_collate_builds_teacher_forcing_pairs():
    b = collate([[5, 6], [7]], [[8, 9, 10], [11]], [0, 1])
    assert b.src.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert b.tgt_in.tolist() == [[BOS, 8, 9, 10], [BOS, 11, PAD, PAD]]
    assert b.tgt_out.tolist() == [[8, 9, 10, EOS], [11, EOS, PAD, PAD]]
    assert b.src_pad_mask.tolist() == [[False, False, False], [False, False, True]]
    assert (b.n_src_tokens, b.n_tgt_tokens) == (5, 6)
    assert b.src.dtype == torch.long


@needs_multi30k()
def test_padding_efficiency_on_multi30k_train(tmp_path, capsys):
    cfg = DataConfig(name="multi30k", dir=str(MULTI30K), src_lang="en", tgt_lang="de")
    train = read.load_split(cfg, "train")
    ds = tokenize(train, build_vocabs(TokenizerConfig(vocab_size=8000), read.TextPairs.of_table(train), tmp_path))
    src = np.array([len(s) + 1 for s in ds["src_ids"]])
    tgt = np.array([len(t) + 1 for t in ds["tgt_ids"]])
    bucketed = TokenBucketSampler(src, tgt, 4096, seed=1).padding_efficiency()
    # The same budget without length grouping: shuffled order cut greedily.
    random_batches = make_batches(src, tgt, 4096, np.random.default_rng(1).permutation(len(src)))
    real = sum(int(src[b].sum() + tgt[b].sum()) for b in random_batches)
    padded = sum(len(b) * int(src[b].max() + tgt[b].max()) for b in random_batches)
    with capsys.disabled():
        print(f"\nMulti30k train, 8k BPE, 4096 tokens: padding efficiency {bucketed:.3f} (random {real / padded:.3f})")
    assert bucketed >= 0.90 and real / padded < 0.8


def test_prefetching_loader_gives_the_same_batches_and_resumes_exactly(toy_corpus, tmp_path):
    """Batches collated ahead in a thread: the same batches in the same order, and the sampler's position counts
    only those handed out, so a checkpoint between two of them resumes where a plain loader would."""
    from mt.data.batching import BatchLoader
    from mt.data.corpus import make_sampler
    from tests.test_training import make_config, prepare_data

    cfg = make_config(toy_corpus, tmp_path / "run")
    train = prepare_data(cfg, tmp_path / "run", 128).train
    ids = train.select_columns(["src_ids", "tgt_ids"])
    sampler = lambda: make_sampler(read.length_columns(train), 150, seed=1, shuffle=True)  # noqa: E731
    s_plain = sampler()
    plain = [b.ids for b in BatchLoader(ids, s_plain)] + [b.ids for b in BatchLoader(ids, s_plain)]
    s_ahead = sampler()
    it, ahead = iter(BatchLoader(ids, s_ahead, prefetch=3)), []
    for _ in range(5):
        ahead.append(next(it).ids)
    assert s_ahead.position == 5  # not 5 + what the thread has collated
    state = s_ahead.state_dict()
    it.close()  # a stop mid-epoch: the worker ends
    resumed = sampler()
    resumed.load_state_dict(state)
    ahead += [b.ids for b in BatchLoader(ids, resumed, prefetch=3)]
    assert resumed.epoch == 1 and resumed.position == 0
    ahead += [b.ids for b in BatchLoader(ids, resumed, prefetch=3)]
    assert ahead == plain and len(plain) > 10


def test_prefetching_loader_raises_what_the_worker_hit():
    from mt.data.batching import BatchLoader, TokenBucketSampler

    class Broken:
        def __getitem__(self, idx):
            raise OSError("disk gone")

    sampler = TokenBucketSampler([5] * 10, [5] * 10, 20, seed=0, shuffle=False)
    with pytest.raises(OSError, match="disk gone"):
        list(BatchLoader(Broken(), sampler, prefetch=2))


# ---------------------------------------------------------------- fairseq's batch formation (data.batching=fixed)


def test_fairseq_batches_cut_as_fairseq_batch_by_size():
    """A hand-made case of fairseq's rule: sentences taken in order while (n + 1) x the longest fits; a full batch
    keeps its largest multiple of 8 sentences and the rest begin the next one; fewer than 8 stay whole."""
    from mt.data.batching import fairseq_batches

    lens = np.array([10] * 11 + [20] * 3)
    order = np.arange(len(lens))
    batches = fairseq_batches(lens, lens, 110, order)
    # 11 x 10 = 110 fits; the 12th would make 120: cut at 8, the 3 left go on; with the 20s, (3 + 1) x 20 = 80,
    # (4 + 1) x 20 = 100, (5 + 1) x 20 = 120 > 110: 5 < 8, so all 5 are a batch; the last 20 alone.
    assert [b.tolist() for b in batches] == [list(range(8)), [8, 9, 10, 11, 12], [13]]
    assert [b.tolist() for b in fairseq_batches(lens, lens, 1000, order)] == [list(range(14))]  # all fit


@pytest.fixture
def caption_lengths() -> tuple[np.ndarray, np.ndarray]:
    """(source, target) lengths of 2,000 made-up pairs, 3-40 tokens, the target near the source."""
    rng = np.random.default_rng(0)
    src = rng.integers(3, 41, 2000)
    return src, np.clip(src + rng.integers(-4, 5, 2000), 3, 44)


@pytest.mark.parametrize("max_tokens", [200, 700, 3000])
def test_fixed_batches_sort_by_source_then_target_and_come_in_multiples_of_8(caption_lengths, max_tokens):
    from mt.data.batching import fairseq_batches, fairseq_order

    src, tgt = caption_lengths
    order = fairseq_order(src, tgt, seed=3)
    keys = list(zip(src[order].tolist(), tgt[order].tolist()))
    assert keys == sorted(keys)  # source length first, target length second
    assert not np.array_equal(order, fairseq_order(src, tgt, seed=4))  # ties in the seed's shuffled order
    batches = fairseq_batches(src, tgt, max_tokens, order)
    assert np.array_equal(np.concatenate(batches), order)  # every sentence once, in that order
    full = batches[:-1]  # (the last holds what was left)
    assert all(len(b) % 8 == 0 or len(b) < 8 for b in full)
    if max_tokens >= 700:  # (room for 8 of the longest: every full batch a multiple of 8)
        assert all(len(b) % 8 == 0 for b in full)


def test_fixed_batches_are_the_same_every_epoch_in_a_new_order_and_resume_exactly(caption_lengths):
    src, tgt = caption_lengths
    sampler = TokenBucketSampler(src, tgt, max_tokens=1500, seed=7, formation="fixed")
    first = [tuple(b) for b in sampler]  # epoch 0, then the sampler is at epoch 1
    second = [tuple(b) for b in sampler]
    assert sorted(first) == sorted(second) and first != second  # the same batches, shuffled by (seed, epoch)
    pools = TokenBucketSampler(src, tgt, max_tokens=1500, seed=7)
    assert sorted(tuple(b) for b in pools) != sorted(tuple(b) for b in pools)  # (the default re-forms them)
    again = TokenBucketSampler(src, tgt, max_tokens=1500, seed=7, formation="fixed")
    again.set_epoch(1)
    it = iter(again)
    head = [tuple(next(it)) for _ in range(5)]
    resumed = TokenBucketSampler(src, tgt, max_tokens=1500, seed=7, formation="fixed")
    resumed.load_state_dict(again.state_dict())
    assert head + [tuple(b) for b in resumed] == second
    shards = [TokenBucketSampler(src, tgt, 1500, seed=7, formation="fixed", num_replicas=2, rank=r) for r in (0, 1)]
    assert {b for s in shards for b in map(tuple, s)} == set(first)  # two ranks share the epoch's batches
