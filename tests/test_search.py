"""Greedy and beam search: an oracle model with hand-written distributions, and equivalences on a trained model."""

import math
from types import SimpleNamespace

import pytest
import torch

from mt.config import DecodeConfig
from mt.data.tokenizer import BOS, EOS, PAD, UNK
from mt.decode.search import beam_search, greedy_search, length_penalty, max_lengths, topk_rows

A, B = 4, 5
V = 6


class OracleModel:
    """next-token probabilities by prefix (tokens after <s>); unknown prefixes end the sentence."""

    def __init__(self, table: dict[tuple, dict[int, float]]):
        self.table = table
        self.cfg = SimpleNamespace(max_positions=64)

    def encode(self, src, src_pad_mask):
        return torch.zeros(src.size(0), src.size(1), 1)

    def new_cache(self):
        raise AssertionError("the oracle is used without a cache")

    def decode(self, tgt_in, memory, src_pad_mask, cache=None):
        N, T = tgt_in.shape
        logits = torch.full((N, T, V), -1e9)
        for n in range(N):
            for t in range(T):
                prefix = tuple(tgt_in[n, 1 : t + 1].tolist())
                for tok, p in self.table.get(prefix, {EOS: 1.0}).items():
                    logits[n, t, tok] = math.log(p)
        return logits


TABLE = {
    (): {A: 0.5, B: 0.4, EOS: 0.1},
    (A,): {EOS: 0.6, A: 0.2, B: 0.2},
    (B,): {A: 0.9, B: 0.05, EOS: 0.05},
    (B, A): {EOS: 0.5, A: 0.25, B: 0.25},
    (A, A): {EOS: 0.5, A: 0.5},
}


def run(table, **kw):
    cfg = DecodeConfig(use_cache=False, max_len_a=0.0, max_len_b=10, **kw)
    src = torch.tensor([[7, 8, EOS]])
    return beam_search(OracleModel(table), src, src.eq(PAD), cfg)[0]


def test_best_hypothesis_finishes_early_and_wins():
    # After step 1 the live beam "B A" (0.36) is ahead of the finished "A" (0.3), but it ends at 0.18.
    hyps = run(TABLE, beam_size=2, nbest=2, length_penalty=0.0)
    assert [h.tokens for h in hyps] == [[A], [B, A]]
    assert hyps[0].score == pytest.approx(math.log(0.5 * 0.6))
    assert hyps[1].score == pytest.approx(math.log(0.4 * 0.9 * 0.5))


def test_length_penalty_changes_the_winner():
    # Average per token (alpha 1): "A </s>" log(.3)/2 = -0.602 < "B A </s>" log(.18)/3 = -0.572.
    hyps = run(TABLE, beam_size=2, nbest=2, length_penalty=1.0, length_penalty_type="average")
    assert [h.tokens for h in hyps] == [[B, A], [A]]
    assert hyps[0].score == pytest.approx(math.log(0.18) / 3) and hyps[0].logprob == pytest.approx(math.log(0.18))
    assert hyps[1].score == pytest.approx(math.log(0.3) / 2)
    # GNMT alpha 1: ((5+2)/6) vs ((5+3)/6): "A" keeps the lead.
    gnmt = run(TABLE, beam_size=2, nbest=1, length_penalty=1.0, length_penalty_type="gnmt")
    assert gnmt[0].tokens == [A] and gnmt[0].score == pytest.approx(math.log(0.3) / (7 / 6))


def test_never_selects_pad_and_optionally_not_unk():
    table = {(): {PAD: 0.5, UNK: 0.3, A: 0.2}, (A,): {PAD: 0.9, EOS: 0.1}, (UNK,): {EOS: 1.0}}
    assert run(table, beam_size=2, nbest=1, length_penalty=0.0)[0].tokens == [UNK]
    assert run(table, beam_size=2, nbest=1, length_penalty=0.0, no_unk=True)[0].tokens == [A]


def test_greedy_on_the_oracle():
    cfg = DecodeConfig(beam_size=1, use_cache=False, length_penalty=0.0)
    src = torch.tensor([[7, 8, EOS]])
    (h,) = greedy_search(OracleModel(TABLE), src, src.eq(PAD), cfg)[0]
    assert h.tokens == [A] and h.score == pytest.approx(math.log(0.3))


def test_output_length_is_capped():
    # A model that prefers to go on forever: greedy is cut at the limit, with a forced </s>.
    table = {tuple([A] * n): {A: 0.9, EOS: 0.1} for n in range(40)}
    cfg = DecodeConfig(beam_size=1, use_cache=False, max_len_a=1.0, max_len_b=2, length_penalty=0.0)
    src = torch.tensor([[7, 8, EOS]])  # 3 tokens -> at most 1 * 3 + 2 = 5 positions, </s> included
    (h,) = greedy_search(OracleModel(table), src, src.eq(PAD), cfg)[0]
    assert h.tokens == [A] * 4 and h.score == pytest.approx(4 * math.log(0.9) + math.log(0.1))
    cfg.beam_size = cfg.nbest = 3
    hyps = beam_search(OracleModel(table), src, src.eq(PAD), cfg)[0]
    assert max(len(h.tokens) for h in hyps) <= 4
    assert max_lengths(src.eq(PAD), 1.5, 10, cap=8).tolist() == [8]


@pytest.mark.parametrize("V,k", [(8000, 10), (8000, 1), (1000, 3), (997, 10), (130, 4)])
def test_topk_rows_equals_torch_topk(V, k):
    g = torch.Generator().manual_seed(V + k)
    x = torch.randn(37, V, generator=g)
    x[:, :5] = -math.inf  # forbidden tokens, as search sets them
    x[3, V - 1] = 100.0  # the best entry of a row in the last (partial) block
    x[4, :] = -math.inf
    x[4, 7] = 0.0  # only one finite entry (the length limit leaves only </s>)
    values, idx = topk_rows(x, k)
    ref_values, ref_idx = x.topk(k, dim=-1)
    assert torch.equal(values, ref_values)
    assert torch.equal(x.gather(1, idx), values)  # the indices point at those values
    finite = torch.isfinite(ref_values)
    assert torch.equal(idx[finite], ref_idx[finite])  # random floats have no ties


def test_length_penalty_formulas():
    assert length_penalty(7, 1.0, "gnmt") == pytest.approx(2.0)
    assert length_penalty(4, 0.5, "average") == pytest.approx(2.0)
    assert length_penalty(9, 0.0, "gnmt") == 1.0


def padded_sources():
    torch.manual_seed(1)
    src = torch.randint(4, 20, (6, 7))
    for i, n in enumerate([7, 5, 3, 6, 2, 7]):
        src[i, n - 1] = EOS
        src[i, n:] = PAD
    return src, src.eq(PAD)


def test_beam_size_1_equals_greedy(trained_model):
    src, mask = padded_sources()
    g = greedy_search(trained_model, src, mask, DecodeConfig(beam_size=1))
    b = beam_search(trained_model, src, mask, DecodeConfig(beam_size=1))
    assert [h[0].tokens for h in g] == [h[0].tokens for h in b]
    for x, y in zip(g, b):
        assert x[0].score == pytest.approx(y[0].score, abs=1e-5)


@pytest.mark.parametrize("beam", [1, 5])
def test_cached_search_equals_uncached(trained_model, beam):
    src, mask = padded_sources()
    cfg = dict(beam_size=beam, nbest=beam, length_penalty=1.0)
    search = greedy_search if beam == 1 else beam_search
    cached = search(trained_model, src, mask, DecodeConfig(use_cache=True, **cfg))
    uncached = search(trained_model, src, mask, DecodeConfig(use_cache=False, **cfg))
    assert [[h.tokens for h in hs] for hs in cached] == [[h.tokens for h in hs] for hs in uncached]
    for hs, us in zip(cached, uncached):
        for h, u in zip(hs, us):
            assert h.score == pytest.approx(u.score, abs=1e-4)


def test_batched_beam_equals_one_sentence_at_a_time(trained_model):
    src, mask = padded_sources()
    cfg = DecodeConfig(beam_size=4, nbest=2)
    batched = beam_search(trained_model, src, mask, cfg)
    for i in range(src.size(0)):
        n = int((~mask[i]).sum())
        single = beam_search(trained_model, src[i : i + 1, :n], mask[i : i + 1, :n], cfg)[0]
        assert [h.tokens for h in single] == [h.tokens for h in batched[i]]


def test_int8_model_stays_close_to_fp32(trained_model):
    """decode.quantize=int8: every Linear (output projection included) becomes int8, the fp32 model is untouched,
    the log-probabilities stay near fp32's, and every int8 search returns well-formed hypotheses scored near fp32's.

    Token-for-token equalities (cached == uncached, greedy == beam 1) are not asserted for int8: activations get one
    scale per call, those searches make different calls (a whole prefix vs one step; beam search drops finished
    sentences from the batch, greedy does not), and which of two near-tied hypotheses wins then depends on the CPU's
    int8 kernel (it flipped on an AVX2-only EPYC, not on an AVX-512 Xeon). Scores cannot flip that way: int8 moves
    a log-probability by ~0.07 on average here, so a best score moves by a fraction of the 0.5 allowed."""
    from mt.model.quantize import quantize_int8

    q = quantize_int8(trained_model)
    assert not any(type(m) is torch.nn.Linear for m in q.modules())
    assert any(type(m) is torch.nn.Linear for m in trained_model.modules())
    src, mask = padded_sources()
    tgt_in = torch.cat([torch.full((src.size(0), 1), BOS), src.flip(1).clamp(min=4)], 1)
    with torch.no_grad():
        diff = (q(src, mask, tgt_in).log_softmax(-1) - trained_model(src, mask, tgt_in).log_softmax(-1)).abs()
    # d_model 32 is the worst case for per-tensor int8 (measured mean 0.067); wrong weights give differences of ~1-10.
    assert diff.mean() < 0.1
    cfg = dict(beam_size=4, nbest=2, length_penalty=1.0)
    reference = beam_search(trained_model, src, mask, DecodeConfig(**cfg))
    cap = max_lengths(mask, DecodeConfig().max_len_a, DecodeConfig().max_len_b, 127)
    for hyps in (
        beam_search(q, src, mask, DecodeConfig(**cfg)),
        beam_search(q, src, mask, DecodeConfig(use_cache=False, **cfg)),
        greedy_search(q, src, mask, DecodeConfig(beam_size=1, length_penalty=1.0)),
    ):
        for i, (hs, ref) in enumerate(zip(hyps, reference)):
            scores = [h.score for h in hs]
            assert scores == sorted(scores, reverse=True) and all(math.isfinite(s) for s in scores)
            assert all(len(h.tokens) < cap[i] and not {PAD, BOS, EOS} & set(h.tokens) for h in hs)
            if len(hs) == 2:  # beam: two distinct hypotheses
                assert hs[0].tokens != hs[1].tokens
            # Measured on the EPYC: at most 0.14 between int8 and fp32 best scores (greedy can only be worse).
            assert abs(hs[0].score - ref[0].score) < 0.5 or (len(hs) == 1 and hs[0].score < ref[0].score)


@pytest.mark.parametrize("beam", [1, 4])
def test_min_len_beyond_the_length_cap_still_ends_every_hypothesis(trained_model, beam):
    """decode.min_len forbids </s> for longer than the length cap allows: the cap wins, every sentence gets its
    hypotheses at the cap's length (this crashed with an IndexError when no hypothesis could finish)."""
    src, mask = padded_sources()
    cfg = DecodeConfig(beam_size=beam, nbest=beam, min_len=100, max_len_a=0.0, max_len_b=5)
    hyps = (greedy_search if beam == 1 else beam_search)(trained_model, src, mask, cfg)
    assert [len(hs) for hs in hyps] == [beam] * len(src)
    assert all(len(h.tokens) == 4 and math.isfinite(h.score) for hs in hyps for h in hs)  # 4 tokens + </s> = 5


def hyps_of(results):
    return [[h.tokens for h in hs] for hs in results]


@pytest.mark.parametrize("beam", [1, 5])
def test_an_ensemble_of_one_or_of_a_model_with_itself_decodes_as_the_model(trained_model, beam):
    from mt.decode.ensemble import Ensemble

    src, mask = padded_sources()
    cfg = DecodeConfig(beam_size=beam, nbest=beam, length_penalty=1.0)
    search = greedy_search if beam == 1 else beam_search
    alone = search(trained_model, src, mask, cfg)
    for members in ([trained_model], [trained_model, trained_model]):
        together = search(Ensemble(members).eval(), src, mask, cfg)
        assert hyps_of(together) == hyps_of(alone)
        for hs, us in zip(together, alone):
            assert [h.score for h in hs] == pytest.approx([u.score for u in us], abs=1e-4)


def test_an_ensemble_scores_the_mean_of_its_models_log_probabilities(trained_model):
    import copy

    from mt.decode.ensemble import Ensemble

    other = copy.deepcopy(trained_model)
    with torch.no_grad():
        other.output.weight.mul_(1.7)  # another model: other next-token distributions
    src, mask = padded_sources()
    tgt = torch.randint(4, 20, (src.size(0), 4))
    ensemble = Ensemble([trained_model, other]).eval()
    with torch.no_grad():
        got = ensemble.decode(tgt, ensemble.encode(src, mask), mask)
        a, b = (m.decode(tgt, m.encode(src, mask), mask).log_softmax(-1) for m in (trained_model, other))
    torch.testing.assert_close(got, (a + b) / 2)
    cfg = DecodeConfig(beam_size=4, length_penalty=1.0)
    cached = beam_search(ensemble, src, mask, cfg)  # one KV cache per model, reordered together
    assert hyps_of(cached) == hyps_of(beam_search(ensemble, src, mask, DecodeConfig(beam_size=4, use_cache=False)))
    assert hyps_of(cached) != hyps_of(beam_search(other, src, mask, cfg))


def test_an_ensemble_of_models_with_other_vocabularies_is_refused_in_one_line(trained_model, monkeypatch):
    from mt.config import ConfigError
    from mt.decode.loading import load_ensemble
    from mt.model import saved

    def vocabs(src, tgt):
        side = lambda d: SimpleNamespace(digest=lambda: d)  # noqa: E731
        return SimpleNamespace(src=side(src), tgt=side(tgt))

    built = iter([(trained_model, vocabs("s", "t")), (trained_model, vocabs("s", "other"))])
    monkeypatch.setattr(saved, "build_model", lambda ckpt: next(built))
    ckpts = [{"format": 1, "path": "runs/a"}, {"format": 1, "path": "runs/b"}]
    with pytest.raises(ConfigError, match=r"^runs/b: its target vocabulary differs from runs/a's"):
        load_ensemble(ckpts, DecodeConfig(), "fp32", torch.device("cpu"))
