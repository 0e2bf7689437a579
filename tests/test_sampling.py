"""Sampling (decode.sampling: temperature, top-k, top-p, a seed per line) and target prefixes (forced first tokens),
in greedy search, beam search and sampling."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from mt.config import ConfigError, DecodeConfig, validate_decode
from mt.data.tokenizer import BOS, EOS, PAD
from mt.decode.batched import translate_ids
from mt.decode.search import greedy_search, sample_search, sample_tokens
from mt.model.transformer import Transformer
from tests.conftest import tiny_model_config, train_tiny
from tests.test_export import sources

SAMPLE = DecodeConfig(beam_size=1, sampling=True, length_penalty=0.0, max_len_a=1.2, max_len_b=3)


@pytest.fixture(scope="module")
def toy(toy_vocab):
    pairs, vocabs = toy_vocab
    return train_tiny(vocabs, pairs), vocabs


def tokens(hyps) -> list[list[list[int]]]:
    return [[h.tokens for h in hs] for hs in hyps]


def test_top1_sampling_and_a_cold_temperature_are_greedy(toy):
    model, vocabs = toy
    src = sources(vocabs, 200)
    greedy = tokens(translate_ids(model, src, replace(SAMPLE, sampling=False), torch.device("cpu"), None))
    top1 = tokens(translate_ids(model, src, replace(SAMPLE, topk=1, seed=3), torch.device("cpu"), None))
    cold = tokens(translate_ids(model, src, replace(SAMPLE, temperature=1e-4, seed=4), torch.device("cpu"), None))
    warm = tokens(translate_ids(model, src, replace(SAMPLE, temperature=2.0, seed=4), torch.device("cpu"), None))
    assert top1 == greedy and cold == greedy and warm != greedy


def test_a_lines_samples_depend_on_the_seed_and_its_line_number_alone(toy):
    """Other batch sizes (one line a batch .. all at once), the line decoded with other lines or alone: the same
    samples; another seed: others."""
    model, vocabs = toy
    src, cpu = sources(vocabs, 120), torch.device("cpu")
    cfg = replace(SAMPLE, nbest=3, seed=11)
    whole = tokens(translate_ids(model, src, cfg, cpu, None))
    assert tokens(translate_ids(model, src, replace(cfg, max_tokens=8), cpu, None)) == whole
    assert tokens(translate_ids(model, src, replace(cfg, max_tokens=100_000), cpu, None)) == whole
    assert tokens(translate_ids(model, src, replace(cfg, use_cache=False), cpu, None)) == whole  # with or without KV
    assert tokens(translate_ids(model, src[40:60], cfg, cpu, None, line_numbers=list(range(40, 60)))) == whole[40:60]
    order = list(range(len(src)))[::-1]  # the lines in another order, each keeping its number
    shuffled = tokens(translate_ids(model, [src[i] for i in order], cfg, cpu, None, line_numbers=order))
    assert [shuffled[order.index(i)] for i in range(len(src))] == whole
    alone = [tokens(translate_ids(model, [src[i]], cfg, cpu, None, line_numbers=[i]))[0] for i in (0, 7, 99)]
    assert alone == [whole[0], whole[7], whole[99]]
    other = tokens(translate_ids(model, src, replace(cfg, seed=12), cpu, None))
    assert other != whole
    assert sum(len({tuple(t) for t in line}) > 1 for line in whole) > 30  # the 3 samples of a line differ


def first_token_distribution(model, cfg: DecodeConfig, draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts, expected probabilities) of the first sampled token of one source, `draws` samples of it."""
    src = torch.tensor([[7, 9, 11, EOS]])
    mask = src.eq(PAD)
    cfg = replace(cfg, nbest=draws, max_len_a=0.0, max_len_b=3)
    # Seed 3: its p-values (0.94 and 0.91 on an AMD EPYC) leave room for another CPU's rounding of the logits
    uniforms = torch.rand(draws, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    hyps = sample_search(model, src, mask, cfg, uniforms)[0]
    counts = torch.bincount(torch.tensor([h.tokens[0] if h.tokens else EOS for h in hyps]), minlength=model.tgt_vocab)
    with torch.no_grad():
        logits = model.decode(torch.tensor([[BOS]]), model.encode(src, mask), mask)[0, -1].float()
    logits[[PAD, BOS]] = -math.inf
    return counts.double(), (logits / cfg.temperature).softmax(-1).double()


@pytest.fixture(scope="module")
def spread():
    """An untrained model: its next-token distribution is spread over most of the vocabulary."""
    torch.manual_seed(0)
    return Transformer(tiny_model_config(), 40, 40).eval()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_first_tokens_drawn_follow_the_tempered_softmax(spread, temperature):
    """20,000 draws at a fixed seed: chi-square against softmax(logits / T) over the tokens expected at least 5
    times (the rest pooled)."""
    model = spread
    counts, p = first_token_distribution(model, replace(SAMPLE, temperature=temperature), 20_000)
    expected = p * counts.sum()
    big = expected >= 5
    pooled = expected[~big].sum() > 0
    observed = torch.cat([counts[big], counts[~big].sum().view(1)[:pooled]])
    expect = torch.cat([expected[big], expected[~big].sum().view(1)[:pooled]])
    chi2 = float(((observed - expect) ** 2 / expect).sum())
    dof = len(observed) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(chi2 / 2)))
    print(f"temperature {temperature}: chi2 {chi2:.1f} on {dof} degrees of freedom, p = {p_value:.3f}")
    assert dof >= 10 and p_value > 0.01, f"chi2 {chi2:.1f} on {dof} degrees of freedom, p = {p_value:.4f}"
    assert counts[PAD] == counts[BOS] == 0


def test_top_k_and_top_p_draw_only_from_their_set(spread):
    model = spread
    _, p = first_token_distribution(model, SAMPLE, 1)
    counts, _ = first_token_distribution(model, replace(SAMPLE, topk=3), 3000)
    assert set(counts.nonzero().flatten().tolist()) == set(p.topk(3).indices.tolist())
    counts, _ = first_token_distribution(model, replace(SAMPLE, topp=0.6), 3000)
    ranked = p.sort(descending=True).indices.tolist()
    smallest = next(k for k in range(1, len(ranked) + 1) if p[ranked[:k]].sum() >= 0.6)
    assert set(counts.nonzero().flatten().tolist()) == set(ranked[:smallest])


@pytest.mark.parametrize("topp, kept", [(0.4, {0}), (0.7, {0, 1}), (0.8, {0, 1, 2}), (0.9, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_with_that_mass(topp, kept):
    """Probabilities 0.5, 0.25, 0.125, 0.125 (tokens 0-3); a sweep of uniforms over [0, 1) draws from exactly the
    kept set, each token in proportion to its renormalised probability."""
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    u = (torch.arange(8000, dtype=torch.float64) + 0.5) / 8000
    drawn = sample_tokens(probs.log().expand(8000, -1), u, replace(SAMPLE, topp=topp))
    counts = torch.bincount(drawn, minlength=4).double()
    assert set(counts.nonzero().flatten().tolist()) == kept
    share = probs[sorted(kept)] / probs[sorted(kept)].sum()
    assert counts[sorted(kept)] / 8000 == pytest.approx(share.double(), abs=1e-3)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(topk=-1), "decode.topk=-1"),
        (dict(topp=0.0), r"decode.topp=0.0 is outside \(0, 1\]"),
        (dict(topp=1.5), r"decode.topp=1.5 is outside \(0, 1\]"),
        (dict(temperature=0.0), "decode.temperature=0.0 must be above 0"),
        (dict(beam_size=4), "decode.sampling=true draws each token: it needs decode.beam_size=1, not 4"),
    ],
)
def test_bad_sampling_settings_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_decode(replace(SAMPLE, **overrides))


# ------------------------------------------------------------------ target prefixes


@pytest.mark.parametrize("how", ["greedy", "beam", "sampling"])
def test_hypotheses_start_with_the_prefix(toy, how):
    model, vocabs = toy
    src = sources(vocabs, 60)
    prefixes = vocabs.tgt.encode_batch(["red house", "", "the big dog"] * 20)
    cfg = {"greedy": replace(SAMPLE, sampling=False), "beam": DecodeConfig(beam_size=4, nbest=2),
           "sampling": replace(SAMPLE, nbest=2)}[how]  # fmt: skip
    hyps = translate_ids(model, src, cfg, torch.device("cpu"), None, prefixes)
    for hs, prefix in zip(hyps, prefixes):
        assert all(h.tokens[: len(prefix)] == prefix for h in hs)
    free = translate_ids(model, src, cfg, torch.device("cpu"), None)
    assert [hyps[i] == free[i] for i in range(1, 60, 3)] and tokens(hyps)[1::3] == tokens(free)[1::3]


def test_a_prefix_of_the_greedy_output_gives_the_same_output(toy):
    model, vocabs = toy
    src = [s for s in sources(vocabs, 80)]
    cfg = replace(SAMPLE, sampling=False)
    free = translate_ids(model, src, cfg, torch.device("cpu"), None)
    prefixes = [h[0].tokens[: len(h[0].tokens) // 2] for h in free]
    forced = translate_ids(model, src, cfg, torch.device("cpu"), None, prefixes)
    assert tokens(forced) == tokens(free)
    assert [h[0].score for h in forced] == pytest.approx([h[0].score for h in free], abs=1e-5)


def test_a_forced_token_is_scored_by_the_model(toy):
    """A prefix the model would not choose: its tokens are taken at the model's log-probability, not at 0."""
    model, vocabs = toy
    src = torch.tensor([vocabs.src.encode("the cat") + [EOS]])
    cfg = replace(SAMPLE, sampling=False, max_len_a=0.0, max_len_b=8)
    free = greedy_search(model, src, src.eq(PAD), cfg)[0][0]
    prefix = torch.tensor([[t for t in range(4, model.tgt_vocab) if t != free.tokens[0]][:1]])
    forced = greedy_search(model, src, src.eq(PAD), cfg, prefix)[0][0]
    assert forced.tokens[0] == prefix[0, 0] and math.isfinite(forced.logprob) and forced.logprob < free.logprob
