"""Lexically constrained beam search: translations that contain given target phrases (terminology).

Dynamic beam allocation (Post & Vilar 2018, "Fast Lexically Constrained Decoding with Dynamic Beam Allocation";
vectorised by Hu et al. 2019, which fairseq's `--constraints` implements). Each hypothesis carries how far it has
got through its line's constraint phrases. At each step the candidates are each beam's 2K best tokens plus every
token that would advance its constraints (the next token of the phrase it is inside, the first token of each phrase
it has not met), and they are divided into banks by the number of constraint tokens met. The K beams are filled
from the banks in turn, the best of the fullest bank first ("stripes": the best of every bank, then the second
best of every bank, ...), so that hypotheses that have met more constraints survive next to higher-scoring ones that
have met fewer. A hypothesis may end only when it has met all its constraints.

A phrase is met wherever its tokens occur in the output, also inside or overlapping another phrase: ["cat",
"cat dog"] and ["dog", "cat dog"] are both met by "cat dog" (a phrase given twice must occur twice); ordered
phrases must occur one after the other, without overlapping (["cat dog", "dog"] needs "cat dog ... dog"). A phrase
is met as whole words: given the vocabulary's word boundaries (tokens that begin a word, punctuation, </s>), a
phrase counts only once the token after it is one, so
"Zaun" is not met by "Zauns" or "Zaunpfahl" (a subword model would otherwise complete the phrase's tokens and go
on inside the same word). A line whose
constraints no hypothesis meets within its length limit is translated again without them (the caller warns:
`count_met` counts what each output holds).

What differs from fairseq: the candidates and banks are kept on the host (the step already reads its candidates
there), phrases are matched by a small state machine per line instead of a trie of token ids, a phrase must end at
a word boundary, an unordered phrase may overlap another, and a line whose constraints cannot be met falls back
to plain beam search rather than returning the best hypothesis that missed them.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from mt.config import DecodeConfig
from mt.data.tokenizer import EOS
from mt.decode.search import (
    BeamState,
    Hypothesis,
    _constrain,
    _next_logits,
    beam_search,
    drop_done,
    finalize,
    is_done,
    renormalized,
    topk_rows,
)

State = tuple[tuple[int, ...], tuple[int, ...]]  # (per phrase: 1 = still to meet, tokens of the phrase being met)
BOUNDARY = -1  # a phrase's last element with word boundaries: any token of `boundary`


class Constraints:
    """One line's target phrases (token ids), unordered (any order) or ordered (in the given order), as a state
    machine over the tokens a hypothesis emits; with `boundary` (the token ids that end a word before them), each
    phrase must be followed by one of them."""

    def __init__(self, phrases: list[list[int]], ordered: bool = False, boundary: frozenset[int] | None = None,
                 eos: int = EOS):  # fmt: skip
        end = (BOUNDARY,) if boundary is not None else ()
        self.eos = eos
        self.phrases = tuple(tuple(p) + end for p in phrases if p)
        self.ordered = ordered
        self.boundary = boundary | {eos} if boundary is not None else frozenset()
        self.total = sum(len(p) for p in self.phrases)  # constraint elements: the highest bank
        self.tokens = self.total - len(end) * len(self.phrases)  # the output tokens the phrases take
        self.start: State = (tuple(1 for _ in self.phrases), ())
        self._full_advance = lru_cache(maxsize=None)(self._advance)
        self._starts = lru_cache(maxsize=None)(lambda need: {p[0] for p in self.active(need)})
        self.met = lru_cache(maxsize=None)(self._met)  # per state, asked for every candidate of a step
        self.wanted = lru_cache(maxsize=None)(self._wanted)

    def __bool__(self) -> bool:
        return bool(self.phrases)

    def active(self, need: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The phrases that may be met next: all unmet ones, or (ordered) the first unmet one."""
        unmet = [p for p, n in zip(self.phrases, need) if n]
        return unmet[:1] if self.ordered else unmet

    def advance(self, state: State, token: int) -> State:
        """The state after `token`. Most tokens of a search neither continue a phrase nor start one: those leave a
        state with no phrase under way as it is, without a look at the phrases."""
        if not state[1] and token not in self._starts(state[0]):
            return state
        return self._full_advance(state, token)

    def _matches(self, phrase: tuple[int, ...], seq: tuple[int, ...]) -> bool:
        """Whether `seq` is the start of `phrase` (all of it if as long)."""
        if len(seq) > len(phrase):
            return False
        return all(e == t or (e == BOUNDARY and t in self.boundary) for e, t in zip(phrase, seq))

    def _advance(self, state: State, token: int) -> State:
        need, progress = state
        seq = progress + (token,)
        # Unordered, every phrase that ends here is met, one inside or overlapping another too (`progress` is the
        # longest ending that begins a phrase, so it holds every shorter one), a phrase given twice once per place;
        # ordered, the one active phrase.
        met_here: set[tuple[int, ...]] = set()
        while not (self.ordered and met_here):
            j = next((j for j, (p, n) in enumerate(zip(self.phrases, need)) if n and p not in met_here
                      and len(p) <= len(seq) and self._matches(p, seq[len(seq) - len(p) :])
                      and p in self.active(need)), None)  # fmt: skip
            if j is None:
                break
            need, met_here = need[:j] + (0,) + need[j + 1 :], met_here | {self.phrases[j]}
        active = self.active(need)
        first = 0
        if self.ordered and met_here:  # the next phrase starts after this one's tokens (at its boundary token)
            (p,) = met_here
            first = len(seq) - (1 if p[-1] == BOUNDARY else 0)
        for start in range(first, len(seq) + 1):  # the longest ending of seq that begins an active phrase: going
            part = seq[start:]
            if not part or any(len(p) > len(part) and self._matches(p, part) for p in active):
                return need, tuple(t for t in part)
        return need, ()

    def _met(self, state: State) -> int:
        """Constraint tokens met: the phrases met and the part of one under way (the state's bank)."""
        need, progress = state
        return sum(len(p) for p, n in zip(self.phrases, need) if not n) + len(progress)

    def done(self, state: State) -> bool:
        return not any(state[0])

    def _wanted(self, state: State) -> frozenset[int]:
        """Tokens that advance `state`: the next token of the phrase under way, the first of each active phrase."""
        need, progress = state
        active, n = self.active(need), len(progress)
        going = {p[n] for p in active if len(p) > n and self._matches(p, progress) and p[n] != BOUNDARY}
        return frozenset(going | {p[0] for p in active})

    def may_end(self, state: State) -> bool:
        """Whether </s> may follow: it meets every phrase not yet met (</s> ends the last word)."""
        return self.done(self.advance(state, self.eos))

    def count_met(self, tokens: list[int]) -> int:
        """How many of the phrases the hypothesis `tokens` (without </s>) contains, in this object's order rule."""
        state = self.start
        for t in [*tokens, self.eos]:
            state = self.advance(state, t)
        return len(self.phrases) - sum(state[0])


def stripes(cands: list[tuple[float, int, int, int]]) -> list[tuple[float, int, int, int]]:
    """Candidates (score, bank, beam, token) in dynamic-beam-allocation order: rank within its bank first, then the
    bank, highest first; within a bank by score."""
    cands = sorted(cands, key=lambda c: -c[0])
    seen: dict[int, int] = {}
    ranked = []
    for c in cands:
        rank = seen.get(c[1], 0)
        seen[c[1]] = rank + 1
        ranked.append((rank, -c[1], c))
    return [c for _, _, c in sorted(ranked, key=lambda r: (r[0], r[1]))]


def _select(state: BeamState, lines: list[Constraints], states: list[State], scores: np.ndarray, tokens: np.ndarray,
            extra: list[tuple[int, int, float]]):  # fmt: skip
    """Per live sentence: its K best candidates in stripe order (for those ending in </s>) and its K beams (the
    first K that do not end), as host arrays (n, K) of scores, parent beams and tokens, and the beams' states."""
    n, K, EOS = len(state.sentence), state.K, state.sp.eos
    by_sentence: list[dict[tuple[int, int], float]] = [{} for _ in range(n)]
    for row, c in zip(*np.nonzero(np.isfinite(scores))):
        by_sentence[row // K][(row % K, int(tokens[row, c]))] = float(scores[row, c])
    for row, token, score in extra:
        if math.isfinite(score):
            by_sentence[row // K][(row % K, token)] = score
    top = np.full((3, n, K), -math.inf)
    kept = np.zeros((3, n, K))
    kept[0] = -math.inf
    kept_states: list[State] = []
    for i, cands in enumerate(by_sentence):
        rule = lines[i]
        ranked = []
        for (beam, token), score in cands.items():
            parent = states[i * K + beam]
            if token == EOS and not rule.may_end(parent):
                continue
            ranked.append((score, rule.met(rule.advance(parent, token)), beam, token))
        ordered = stripes(ranked)
        for j, (score, _, beam, token) in enumerate(ordered[:K]):
            top[:, i, j] = (score, beam, token)
        live = [c for c in ordered if c[3] != EOS][:K]
        for j in range(K):
            if j < len(live):
                score, _, beam, token = live[j]
                kept[:, i, j] = (score, beam, token)
                kept_states.append(rule.advance(states[i * K + beam], token))
            else:  # fewer live candidates than beams: a dead beam (score -inf) that nothing continues
                kept_states.append(rule.start)
    return top, kept, kept_states


@torch.no_grad()
def constrained_beam_search(
    model, src: Tensor, src_pad_mask: Tensor, cfg: DecodeConfig, lines: list[Constraints], prefix: Tensor | None = None
) -> list[list[Hypothesis]]:
    """Beam search whose hypotheses contain each sentence's constraint phrases (`lines`, one per sentence; an empty
    one constrains nothing); sentences whose constraints no hypothesis meets are searched again without them."""
    state, K, device = BeamState(model, src, src_pad_mask, cfg, prefix), cfg.beam_size, src.device
    lines = [c if c.tokens < limit else Constraints([]) for c, limit in zip(lines, state.limits)]  # cannot fit
    states = [lines[i].start for i in range(len(lines)) for _ in range(K)]  # per decoder row
    live_lines = list(lines)
    for step in range(max(state.limits)):
        logits, log_norm = _next_logits(model, state.tokens, state.memory, state.src_pad_mask, state.cache)
        forced = state.prefix.repeat_interleave(K, 0) if state.prefix is not None else None
        at_limit = min(state.limits) <= step + 1
        logits = _constrain(logits, step, state.max_len.repeat_interleave(K), cfg, at_limit, forced, state.sp)
        log_norm = renormalized(logits, log_norm, cfg, at_limit or (forced is not None and step < forced.size(1)))
        unmet = [not live_lines[r // K].may_end(s) for r, s in enumerate(states)]
        logits[torch.tensor(unmet, device=device), state.sp.eos] = -math.inf  # no ending before all are met
        C = min(2 * K, logits.size(-1))
        cand_logits, cand_tokens = topk_rows(logits, C)  # (n*K, C)
        cand_scores = state.scores.view(-1, 1) + cand_logits - log_norm
        wanted = [(r, t) for r, s in enumerate(states) for t in sorted(live_lines[r // K].wanted(s))]
        rows = torch.tensor([r for r, _ in wanted], dtype=torch.long, device=device)
        toks = torch.tensor([t for _, t in wanted], dtype=torch.long, device=device)
        extra_scores = state.scores.view(-1)[rows] + logits[rows, toks] - log_norm[rows, 0]
        # The step's one read: every beam's candidates and the scores of its constraint tokens.
        read = torch.cat([cand_scores.view(-1).double(), cand_tokens.view(-1).double(), extra_scores.double()]).cpu()
        read = read.numpy()
        m = cand_scores.numel()
        scores, tokens = read[:m].reshape(-1, C), read[m : 2 * m].reshape(-1, C).astype(np.int64)
        extra = [(r, t, float(s)) for (r, t), s in zip(wanted, read[2 * m :])]
        top, kept, states = _select(state, live_lines, states, scores, tokens, extra)
        finalize(state, step, top[0], top[1], top[2])
        n = len(state.sentence)
        beams = torch.from_numpy(kept[1].astype(np.int64)).to(device)
        parents = (torch.arange(n, device=device)[:, None] * K + beams).view(-1)
        new_tokens = torch.from_numpy(kept[2].astype(np.int64)).to(device).view(-1, 1)
        state.tokens = torch.cat([state.tokens[parents], new_tokens], dim=1)
        state.scores = torch.from_numpy(kept[0]).to(device=device, dtype=state.scores.dtype)
        if state.cache is not None:
            state.cache.reorder(parents)
        links, host_parents = state.links, parents.tolist()
        state.links = [(t, links[p]) for t, p in zip(kept[2].astype(np.int64).ravel().tolist(), host_parents)]
        best_live = kept[0].max(axis=1)
        # A sentence is also done when none of its beams is alive (no candidate could meet its constraints).
        done = [d or not math.isfinite(b) for d, b in zip(is_done(state, step, best_live.tolist()), best_live)]
        if all(done):
            break
        if any(done):
            live = [i for i, d in enumerate(done) if not d]
            states = [states[i * K + k] for i in live for k in range(K)]
            live_lines = [live_lines[i] for i in live]
            drop_done(state, done)
    out = [sorted(h, key=lambda h: -h.score)[: cfg.nbest] for h in state.finished]
    unmet = [i for i, h in enumerate(out) if not h]
    if unmet:  # no hypothesis met the constraints within the length limit: the plain search's translation
        rows = torch.tensor(unmet, device=device)
        again = beam_search(model, src[rows], src_pad_mask[rows], cfg, prefix[rows] if prefix is not None else None)
        for i, h in zip(unmet, again):
            out[i] = h
    return out
