"""Greedy and beam search over a model's `encode` / `decode` (and its incremental-decoding cache).

Both search all sentences of a batch at once. Beam search keeps the B sentences x K beams as one (B*K, ...)
batch, and each step is three small functions: `expand` (score every continuation), `prune` (the K best that do
not end in </s> survive, their caches reordered) and `finalize` (hypotheses that chose </s> leave the beam).
Sentences whose search is over are dropped from the batch so later steps only compute what is still live.

A step reads the device once (on a GPU every read waits for the work queued before it): greedy whether every
sentence has ended, beam search the step's candidates in one `tolist`, from which the host keeps each beam's
tokens as a chain of (token, parent) links, finished hypotheses and stopping decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from mt import runtime
from mt.config import DecodeConfig
from mt.data.tokenizer import Specials


@dataclass
class Hypothesis:
    tokens: list[int]  # without <s> and </s>
    score: float  # log-probability after the length penalty (what hypotheses are ranked by)
    logprob: float  # raw sum of token log-probabilities, </s> included


def output_cap(model, cfg: DecodeConfig) -> int:
    """The most output tokens (</s> included) any line may get: the model's positions, or `cfg.max_len`."""
    return min(model.cfg.max_positions - 1, cfg.max_len or model.cfg.max_positions)


def max_lengths(src_pad_mask: Tensor, a: float, b: int, cap: int) -> Tensor:
    """(B,) output length limits `a * src_len + b` (</s> included), at most `cap` (`output_cap`)."""
    src_len = (~src_pad_mask).sum(1)
    return (src_len.float() * a + b).floor().long().clamp(min=1, max=cap)


def length_penalty(length: Tensor | int, alpha: float, kind: str) -> Tensor | float:
    """GNMT (Wu et al. 2016): ((5 + len) / 6)^alpha; "average": len^alpha. Scores are divided by it."""
    if alpha == 0:
        return 1.0 if isinstance(length, int) else torch.ones_like(length, dtype=torch.float)
    if kind == "gnmt":
        return ((5 + length) / 6) ** alpha
    return length**alpha if isinstance(length, int) else length.float() ** alpha


def _next_logits(model, tokens: Tensor, memory: Tensor, src_pad_mask: Tensor, cache) -> tuple[Tensor, Tensor]:
    """Logits (N, V) of the next token after `tokens` (N, t), in fp32, and their log-normaliser (N, 1).

    Scores are `logit - logsumexp(logits)`, the model's log-probability. Only the few tokens a search keeps
    are normalised, instead of writing a full (N, V) log-softmax at every step.
    """
    if cache is not None:
        logits = model.decode(tokens[:, -1:], memory, src_pad_mask, cache)
    else:
        logits = model.decode(tokens, memory, src_pad_mask)
    logits = logits[:, -1].float()
    return logits, torch.logsumexp(logits, dim=-1, keepdim=True)


def renormalized(logits: Tensor, log_norm: Tensor, cfg: DecodeConfig, forcing: bool = False) -> Tensor:
    """The log-normaliser scores are taken against: the model's (`_next_logits`), or with `decode.renormalize`
    the restricted logits' own (transformers' renormalize_logits: a forced token scores 0, a banned one's
    probability goes to the others). With `decode.score_forced=false`, a row forced to one token (a prefix's,
    </s> at the length limit; `forcing`: whether this step forces any) scores 0 for it, as transformers' forced
    BOS and EOS do."""
    if cfg.renormalize:
        return torch.logsumexp(logits, dim=-1, keepdim=True)
    if forcing and not cfg.score_forced:
        one = torch.isfinite(logits).sum(dim=-1, keepdim=True) == 1
        return torch.where(one, torch.logsumexp(logits, dim=-1, keepdim=True), log_norm)
    return log_norm


def topk_rows(x: Tensor, k: int, block: int = 64) -> tuple[Tensor, Tensor]:
    """torch.topk(x, k, dim=-1) for (N, V) logits with V >> k, in two cheap passes on the CPU.

    The k largest entries of a row lie in the k blocks (of `block` columns) with the largest maxima: k entries
    can occupy at most k blocks, and each of those blocks' maximum is at least the k-th largest entry. So:
    block maxima (`amax`, vectorised), the top k blocks, then topk over those k * block columns. On the CPU
    torch's topk over a whole vocabulary costs more than the output projection that made the logits
    (benchmarks/RESULTS.md).
    Equal values may come back in a different order than torch.topk's.
    """
    n, V = x.shape
    n_blocks = V // block
    if runtime.on_cuda(x.device) or n_blocks <= k:
        return x.topk(k, dim=-1)
    best_blocks = x[:, : n_blocks * block].view(n, n_blocks, block).amax(dim=-1).topk(k, dim=-1).indices
    cols = (best_blocks[:, :, None] * block + torch.arange(block, device=x.device)).view(n, k * block)
    if V > n_blocks * block:  # the last, partial block is always a candidate
        tail = torch.arange(n_blocks * block, V, device=x.device).expand(n, -1)
        cols = torch.cat([cols, tail], dim=1)
    values, j = x.gather(1, cols).topk(k, dim=-1)
    return values, cols.gather(1, j)


def _forbid(logp: Tensor, step: int, max_len: Tensor, cfg: DecodeConfig, limit_reached: bool, sp: Specials) -> Tensor:
    """Never <pad> or <s> (`Specials.never`; optionally <unk>), no </s> before `min_len`; at the length limit
    `max_len` (N,) only </s> (even before `min_len`). `limit_reached`: whether any row is at its limit, which the
    host knows. Works in place on logits or log-probabilities (N, V), without reading them back (no boolean
    indexing)."""
    EOS = sp.eos
    if limit_reached:
        at_limit = (max_len <= step + 1)[:, None]  # (N, 1) this step writes the last allowed position
        eos = logp[:, EOS : EOS + 1].clone()
    for token in sp.never:
        logp[:, token] = -math.inf
    if cfg.no_unk:
        logp[:, sp.unk] = -math.inf
    if step < cfg.min_len:
        logp[:, EOS] = -math.inf
    if limit_reached:  # the length cap wins over min_len: a hypothesis must end somewhere
        logp.masked_fill_(at_limit, -math.inf)
        logp[:, EOS : EOS + 1] = torch.where(at_limit, eos, logp[:, EOS : EOS + 1])
    return logp


def _constrain(
    logits: Tensor,
    step: int,
    max_len: Tensor,
    cfg: DecodeConfig,
    limit_reached: bool,
    prefix: Tensor | None,
    sp: Specials,
) -> Tensor:
    """`_forbid`, then the target prefix: a row whose prefix (N, P), padded with <pad>, has a token at `step` may
    only take that token, at the model's own score for it (even where `_forbid` would ban it, e.g. <unk>)."""
    forcing = prefix is not None and step < prefix.size(1)
    if forcing:
        token = prefix[:, step : step + 1]  # (N, 1)
        score = logits.gather(1, token)
    logits = _forbid(logits, step, max_len, cfg, limit_reached, sp)
    if forcing:
        forced = torch.full_like(logits, -math.inf).scatter_(1, token, score)
        logits = torch.where(token != sp.pad, forced, logits)
    return logits


def sample_tokens(logits: Tensor, uniform: Tensor, cfg: DecodeConfig) -> Tensor:
    """(N,) tokens drawn from softmax(logits / temperature), restricted to the `topk` most probable and then to the
    smallest set whose mass is at least `topp` (both renormalised), by inverting the distribution's CDF at each
    row's own `uniform` (N,) in [0, 1): a row's token depends on its logits and its uniform alone."""
    logits = logits / cfg.temperature
    if cfg.topk or cfg.topp < 1.0:  # candidates in descending order (ties by token id), so that topp can cut
        k = min(cfg.topk or logits.size(-1), logits.size(-1))
        logits, candidates = logits.topk(k, dim=-1) if cfg.topk else logits.sort(dim=-1, descending=True, stable=True)
    else:
        candidates = None
    probs = logits.softmax(dim=-1)
    if cfg.topp < 1.0:
        before = probs.cumsum(dim=-1) - probs  # mass of the more probable candidates
        probs = probs.masked_fill(before >= cfg.topp, 0.0)  # keep the smallest set reaching topp
    cdf = probs.cumsum(dim=-1)
    pick = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).clamp(max=probs.size(-1) - 1)
    return pick.squeeze(1) if candidates is None else candidates.gather(1, pick).squeeze(1)


@torch.no_grad()
def greedy_search(
    model, src: Tensor, src_pad_mask: Tensor, cfg: DecodeConfig, prefix: Tensor | None = None
) -> list[list[Hypothesis]]:
    """Pick the most probable token at each step, for the whole batch, until every sentence has emitted </s>."""
    choose = lambda logits, step: topk_rows(logits, 1)[1].squeeze(1)  # noqa: E731
    return _one_token_per_row(model, src, src_pad_mask, cfg, choose, prefix)


@torch.no_grad()
def sample_search(
    model, src: Tensor, src_pad_mask: Tensor, cfg: DecodeConfig, uniforms: Tensor, prefix: Tensor | None = None
) -> list[list[Hypothesis]]:
    """`cfg.nbest` samples per sentence (`sample_tokens`), sample j of sentence i drawn with the uniforms of row
    i * nbest + j of `uniforms` (B * nbest, steps), one per step; best first by their model score."""
    N = cfg.nbest
    src, src_pad_mask = src.repeat_interleave(N, 0), src_pad_mask.repeat_interleave(N, 0)
    prefix = prefix.repeat_interleave(N, 0) if prefix is not None else None
    choose = lambda logits, step: sample_tokens(logits, uniforms[:, step], cfg)  # noqa: E731
    samples = _one_token_per_row(model, src, src_pad_mask, cfg, choose, prefix)
    return [sorted((s[0] for s in samples[i : i + N]), key=lambda h: -h.score) for i in range(0, len(samples), N)]


def _one_token_per_row(model, src, src_pad_mask, cfg: DecodeConfig, choose, prefix) -> list[list[Hypothesis]]:
    """Greedy search and sampling: `choose(logits, step)` picks each row's next token until every row has emitted
    </s>; a row's score is the model's log-probability of its tokens."""
    B, device, sp = src.size(0), src.device, Specials.of(model.cfg)
    memory = model.encode(src, src_pad_mask)
    max_len = max_lengths(src_pad_mask, cfg.max_len_a, cfg.max_len_b, output_cap(model, cfg))
    shortest, longest = torch.stack(max_len.aminmax()).tolist()
    cache = model.new_cache() if cfg.use_cache else None
    tokens = torch.full((B, 1), sp.start, dtype=torch.long, device=device)
    logprob = torch.zeros(B, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    for step in range(longest):
        logits, log_norm = _next_logits(model, tokens, memory, src_pad_mask, cache)
        logits = _constrain(logits, step, max_len, cfg, shortest <= step + 1, prefix, sp)
        forcing = shortest <= step + 1 or (prefix is not None and step < prefix.size(1))
        log_norm = renormalized(logits, log_norm, cfg, forcing)
        next_tok = choose(logits, step)
        best = logits.gather(1, next_tok[:, None]).squeeze(1) - log_norm.squeeze(1)
        next_tok = next_tok.masked_fill(finished, sp.pad)
        logprob += best.masked_fill(finished, 0.0)
        tokens = torch.cat([tokens, next_tok[:, None]], dim=1)
        finished |= next_tok == sp.eos
        if finished.all():  # the step's one read
            break
    out = []
    for seq, raw in zip(tokens[:, 1:].tolist(), logprob.tolist()):
        n = seq.index(sp.eos) if sp.eos in seq else len(seq)
        lp = length_penalty(n + 1, cfg.length_penalty, cfg.length_penalty_type)
        out.append([Hypothesis(seq[:n], raw / lp, raw)])
    return out


class BeamState:
    """The live part of a batched beam search: `n` sentences still searching, K beams each. The device holds what
    the model reads (tokens, cache, encoder output) and the beams' scores; the host holds each beam's tokens as
    links, the finished hypotheses and the length limits."""

    def __init__(self, model, src: Tensor, src_pad_mask: Tensor, cfg: DecodeConfig, prefix: Tensor | None = None):
        B, K, device = src.size(0), cfg.beam_size, src.device
        self.K, self.cfg, self.prefix = K, cfg, prefix  # prefix (B, P): target tokens forced first, <pad> after
        self.sp = Specials.of(model.cfg)
        # (B, S, D): the K beams of a sentence (rows i*K .. i*K+K-1 of the decoder batch) share its encoder output.
        self.memory, self.src_pad_mask = model.encode(src, src_pad_mask), src_pad_mask
        self.max_len = max_lengths(src_pad_mask, cfg.max_len_a, cfg.max_len_b, output_cap(model, cfg))
        self.limits: list[int] = self.max_len.tolist()  # the same on the host, per live sentence
        self.cache = model.new_cache() if cfg.use_cache else None
        self.tokens = torch.full((B * K, 1), self.sp.start, dtype=torch.long, device=device)
        # Only beam 0 is live at the start, so the first expansion does not pick K copies of the same token.
        self.scores = torch.full((B, K), -math.inf, device=device)
        self.scores[:, 0] = 0.0
        self.sentence: list[int] = list(range(B))  # original index of each live sentence
        # Per decoder row: its tokens after <s> as nested (token, previous link) pairs, None = none yet.
        self.links: list[tuple | None] = [None] * (B * K)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(B)]
        self.nbest_score = [-math.inf] * B  # per original sentence: the nbest-th best finished score


def unlink(link: tuple | None) -> list[int]:
    """The tokens of a chain of (token, previous link) pairs, first to last."""
    out = []
    while link is not None:
        out.append(link[0])
        link = link[1]
    return out[::-1]


def expand(state: BeamState, logits: Tensor, log_norm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Score the continuations of each sentence's beams; return the 2K best: scores, beam, token, each (n, 2K).

    The 2K best of all K*V continuations are among each beam's own 2K best tokens, so only those K*2K
    candidates are scored. 2K guarantee K that do not end in </s> (at most one </s> per beam).
    """
    n, K = state.scores.shape
    C = min(2 * K, logits.size(-1))
    cand_logits, cand_tokens = topk_rows(logits, C)  # (n*K, C)
    total = state.scores[:, :, None] + (cand_logits - log_norm).view(n, K, C)  # (n, K, C)
    top_scores, top_idx = total.view(n, K * C).topk(C, dim=1)  # (n, C)
    return top_scores, top_idx // C, cand_tokens.view(n, K * C).gather(1, top_idx)


def prune(state: BeamState, scores: Tensor, beams: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Keep the K best candidates not ending in </s> as the new beams; reorder tokens and cache to match. Returns
    the kept candidates' parent beams and tokens (n, K)."""
    n, K = state.scores.shape
    live_scores = scores.masked_fill(tokens == state.sp.eos, -math.inf)
    keep_scores, keep = live_scores.topk(K, dim=1)  # (n, K) positions among the 2K candidates
    beam, token = beams.gather(1, keep), tokens.gather(1, keep)
    rows = (torch.arange(n, device=beam.device)[:, None] * K + beam).view(-1)  # (n*K,) parent rows
    state.tokens = torch.cat([state.tokens[rows], token.view(-1, 1)], dim=1)
    state.scores = keep_scores
    if state.cache is not None:  # parents are beams of the same sentence: its encoder rows stay as they are
        state.cache.reorder(rows)
    return beam, token


def finalize(state: BeamState, step: int, scores: np.ndarray, beams: np.ndarray, tokens: np.ndarray) -> None:
    """Move candidates that end in </s> among the top K of their sentence (host arrays (n, K)) to the finished
    hypotheses; their tokens are their parent beam's."""
    K, cfg = state.K, state.cfg
    lp = length_penalty(step + 1, cfg.length_penalty, cfg.length_penalty_type)  # step + 1 tokens, </s> included
    for i, j in zip(*np.nonzero((tokens == state.sp.eos) & np.isfinite(scores))):  # row-major, as candidates rank
        raw, sent = float(scores[i, j]), state.sentence[i]
        hyps, hyp = state.finished[sent], Hypothesis(unlink(state.links[i * K + int(beams[i, j])]), raw / lp, raw)
        if len(hyps) < K:
            hyps.append(hyp)
        else:  # K kept already (a search without length penalty goes on while it can improve): keep the K best
            worst = min(range(K), key=lambda h: hyps[h].score)
            if hyp.score <= hyps[worst].score:
                continue
            hyps[worst] = hyp
        if len(hyps) >= cfg.nbest:
            state.nbest_score[sent] = sorted((h.score for h in hyps), reverse=True)[cfg.nbest - 1]


def is_done(state: BeamState, step: int, best_live: list[float]) -> list[bool]:
    """Whether each live sentence is finished (`best_live`: its best live beam's raw score): the length limit is
    reached, or no live beam can still beat the nbest-th finished one (raw scores only fall as tokens are added, and
    the length penalty divides them by at most its value at the length limit), or, with a length penalty, K
    hypotheses ended (fairseq's rule: that bound is loose there, and waiting for it would decode most sentences to
    the limit). Without a penalty the bound is exact and the search never stops while a live beam could still win
    (CTranslate2 stops likewise). With `decode.early_stopping=false` and a penalty, transformers' default rule: K
    hypotheses ended and the best live beam, scored at its current length, does not beat the worst of them."""
    cfg, done = state.cfg, []
    heuristic = not cfg.early_stopping and cfg.length_penalty > 0
    for sent, limit, bound in zip(state.sentence, state.limits, best_live):
        n_finished = len(state.finished[sent])
        if heuristic:
            hyps = state.finished[sent]
            now = bound / length_penalty(step + 1, cfg.length_penalty, cfg.length_penalty_type)
            done.append(limit <= step + 1 or (n_finished >= state.K and now <= min(h.score for h in hyps)))
            continue
        if cfg.length_penalty > 0:
            bound = bound / length_penalty(limit, cfg.length_penalty, cfg.length_penalty_type)
        k_ended = cfg.length_penalty > 0 and n_finished >= state.K
        done.append(k_ended or limit <= step + 1 or (n_finished >= cfg.nbest and bound <= state.nbest_score[sent]))
    return done


def drop_done(state: BeamState, done: list[bool]) -> None:
    """Remove finished sentences from the live batch (their K rows in every tensor and in the cache)."""
    K, kept = state.K, [i for i, d in enumerate(done) if not d]
    kept_rows = [i * K + k for i in kept for k in range(K)]
    state.sentence, state.limits = [state.sentence[i] for i in kept], [state.limits[i] for i in kept]
    state.links = [state.links[r] for r in kept_rows]
    keep = torch.tensor(kept).to(state.scores.device, non_blocking=True)  # (n',) host to device, no wait
    rows = torch.tensor(kept_rows).to(state.scores.device, non_blocking=True)
    state.scores, state.max_len = state.scores[keep], state.max_len[keep]
    state.prefix = state.prefix[keep] if state.prefix is not None else None
    state.tokens, state.memory, state.src_pad_mask = state.tokens[rows], state.memory[keep], state.src_pad_mask[keep]
    if state.cache is not None:
        state.cache.reorder(rows, keep)


@torch.no_grad()
def beam_search(
    model, src: Tensor, src_pad_mask: Tensor, cfg: DecodeConfig, prefix: Tensor | None = None
) -> list[list[Hypothesis]]:
    """Batched beam search; returns, per sentence, its `cfg.nbest` best hypotheses by length-penalised score.
    `prefix` (B, P): target tokens each sentence's hypotheses start with, padded with <pad>."""
    state, K = BeamState(model, src, src_pad_mask, cfg, prefix), cfg.beam_size
    for step in range(max(state.limits)):
        logits, log_norm = _next_logits(model, state.tokens, state.memory, state.src_pad_mask, state.cache)
        limit_reached = min(state.limits) <= step + 1
        forced = state.prefix.repeat_interleave(K, 0) if state.prefix is not None else None
        logits = _constrain(logits, step, state.max_len.repeat_interleave(K), cfg, limit_reached, forced, state.sp)
        forcing = limit_reached or (forced is not None and step < forced.size(1))
        log_norm = renormalized(logits, log_norm, cfg, forcing)
        scores, beams, tokens = expand(state, logits, log_norm)
        kept_beams, kept_tokens = prune(state, scores, beams, tokens)
        # The step's one read: the top K candidates (for those ending in </s>), the kept beams, their scores.
        best_live = state.scores[:, :1].expand(-1, K)
        parts = (scores[:, :K], beams[:, :K], tokens[:, :K], kept_beams, kept_tokens, best_live)
        read = torch.stack([t.double() for t in parts]).cpu().numpy()  # (6, n, K); ids are exact in float64
        finalize(state, step, read[0], read[1], read[2])
        parents = (np.arange(len(state.sentence))[:, None] * K + read[3]).astype(np.int64).ravel().tolist()
        links = state.links
        state.links = [(t, links[p]) for t, p in zip(read[4].astype(np.int64).ravel().tolist(), parents)]
        done = is_done(state, step, read[5][:, 0].tolist())
        if all(done):
            break
        if any(done):
            drop_done(state, done)
    return [sorted(h, key=lambda h: -h.score)[: cfg.nbest] for h in state.finished]


def search(
    model,
    src: Tensor,
    src_pad_mask: Tensor,
    cfg: DecodeConfig,
    prefix: Tensor | None = None,
    uniforms: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Sampling with `cfg.sampling` (`uniforms`: see `sample_search`), greedy for beam size 1 (the same result as
    beam search with K=1, faster), else beam search; hypotheses start with `prefix` (B, P) where it has tokens."""
    if cfg.sampling:
        if uniforms is None:
            raise ValueError("sampling needs each row's uniforms (mt.decode.batched.sampling_uniforms)")
        return sample_search(model, src, src_pad_mask, cfg, uniforms, prefix)
    if cfg.beam_size == 1:
        return greedy_search(model, src, src_pad_mask, cfg, prefix)
    return beam_search(model, src, src_pad_mask, cfg, prefix)
