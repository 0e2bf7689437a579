"""Decoding token ids in batches: sources sorted and cut by a token budget, searched (mt/decode/search.py, or
the constrained search), returned in input order; each line's samples drawn from its own seed, so that batching
never changes them. `decode_ids` also serves CTranslate2 exports and a server's stop signal."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

import torch

from mt import runtime
from mt.config import ConfigError, DecodeConfig
from mt.data.batching import collate, pad
from mt.data.tokenizer import Framing, Specials, Vocabs
from mt.decode.constraints import Constraints, constrained_beam_search
from mt.decode.ct2 import CTranslate2Model
from mt.decode.search import Hypothesis, max_lengths, output_cap, search
from mt.model.quantize import is_int8, quantize_int8

log = logging.getLogger(__name__)


@dataclass
class Translations:
    hypotheses: list[list[Hypothesis]]  # per input line, best first
    texts: list[str]  # detokenized best hypothesis per input line
    seconds: float
    n_tokens: int  # output tokens (subwords, </s> excluded)

    def speed(self) -> dict:
        return {
            "sentences_per_s": len(self.texts) / max(self.seconds, 1e-9),
            "tokens_per_s": self.n_tokens / max(self.seconds, 1e-9),
            "seconds": self.seconds,
        }


def token_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices sorted by length, cut so that each batch has at most `max_tokens` padded source tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, cur, longest = [], [], 0
    for i in order:
        longest_new = max(longest, lengths[i])
        if cur and longest_new * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest_new = [], lengths[i]
        cur.append(i)
        longest = longest_new
    if cur:
        batches.append(cur)
    return batches


def sampling_uniforms(lines: list[int], limits: list[int], seed: int, n: int) -> torch.Tensor:
    """(len(lines) * n, max(limits)) uniforms in [0, 1): row i * n + j holds the draws of sample j of input line
    `lines[i]`, `limits[i]` of them (its length limit), from a generator seeded by (seed, line, j) alone, so that a
    line's samples do not depend on the batch, the order or the other lines it is decoded with."""
    out = torch.zeros(len(lines) * n, max(limits), dtype=torch.float64)
    for i, (line, limit) in enumerate(zip(lines, limits)):
        for j in range(n):
            key = hashlib.blake2b(f"{seed}:{line}:{j}".encode(), digest_size=8).digest()
            g = torch.Generator().manual_seed(int.from_bytes(key, "little") >> 1)
            out[i * n + j, :limit] = torch.rand(limit, generator=g, dtype=torch.float64)
    return out


def translate_ids(
    model,
    src_ids: list[list[int]],
    cfg: DecodeConfig,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    prefixes: list[list[int]] | None = None,
    line_numbers: list[int] | None = None,
    constraints: list[Constraints] | None = None,
    framing: Framing | None = None,
) -> list[list[Hypothesis]]:
    """Decode token-id sources (no specials) and return hypotheses in input order. An empty source gives
    `nbest` empty hypotheses (an empty line in, an empty line out). `prefixes`: target ids each line's
    hypotheses start with (empty = none). `line_numbers`: each source's number in its input (default 0, 1, ...),
    which with `cfg.seed` decides its samples. `constraints`: each line's target phrases (mt/decode/constraints.py).
    `framing`: the model's special ids and language tokens (default: the model's ids, no language tokens); a
    target-language token is forced first and left out of the hypotheses returned."""
    framing = framing or Framing(Specials.of(model.cfg))
    lead = list(framing.tgt_lead)
    if lead:  # forced first, then each line's prefix
        prefixes = [lead + (p if prefixes else []) for p in (prefixes or [[]] * len(src_ids))]
    out: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] * cfg.nbest for _ in src_ids]
    nonempty = [i for i, s in enumerate(src_ids) if s]
    lengths = [len(src_ids[i]) + 1 for i in nonempty]
    model.eval()
    if cfg.quantize == "int8" and not is_int8(model):  # a loaded translator is quantized once, at load
        if runtime.on_cuda(device):
            raise ConfigError(f"decode.quantize=int8 runs on the CPU only (device: {device}); set decode.quantize=none")
        model = quantize_int8(model)
    for batch_pos in token_batches(lengths, cfg.max_tokens):
        idx = [nonempty[p] for p in batch_pos]
        batch = collate([src_ids[i] for i in idx], None, idx, framing)
        pad_id = framing.specials.pad
        prefix = pad([prefixes[i] for i in idx], pad_id) if prefixes and any(prefixes[i] for i in idx) else None
        uniforms = None
        if cfg.sampling:
            limits = max_lengths(batch.src_pad_mask, cfg.max_len_a, cfg.max_len_b, output_cap(model, cfg))
            numbers = [line_numbers[i] if line_numbers else i for i in idx]
            uniforms = sampling_uniforms(numbers, limits.tolist(), cfg.seed, cfg.nbest)
            uniforms = uniforms.to(device)
        batch = batch.to(device)
        prefix = prefix.to(device) if prefix is not None else None
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            if constraints and any(constraints[i] for i in idx):
                hyps = constrained_beam_search(model, batch.src, batch.src_pad_mask, cfg, [constraints[i] for i in idx],
                                               prefix)  # fmt: skip
            else:
                hyps = search(model, batch.src, batch.src_pad_mask, cfg, prefix, uniforms)
        for i, h in zip(idx, hyps):
            out[i] = [Hypothesis(x.tokens[len(lead) :], x.score, x.logprob) for x in h] if lead else h
    return out


def translate_texts(
    model, vocabs: Vocabs, lines: list[str], cfg: DecodeConfig, device: torch.device, autocast_dtype=None
) -> Translations:
    start = time.perf_counter()
    src_ids = vocabs.src.encode_batch(lines)
    hyps = translate_ids(model, src_ids, cfg, device, autocast_dtype)
    texts = vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
    n_tokens = sum(len(h[0].tokens) for h in hyps)
    return Translations(hyps, texts, time.perf_counter() - start, n_tokens)


def encode_within_positions(vocabs: Vocabs, lines: list[str], limit: int, first_line: int = 0) -> list[list[int]]:
    """Source ids of each line, cut to `limit` tokens (the model's positions, less one for </s>) with a warning
    naming the line's number in its input (`first_line`: the 0-based number of `lines[0]`)."""
    src_ids = vocabs.src.encode_batch(lines)
    for i, ids in enumerate(src_ids):
        if len(ids) > limit:
            log.warning("line %d: %d tokens, truncated to the model's %d", first_line + i + 1, len(ids), limit)
            src_ids[i] = ids[:limit]
    return src_ids


class Stopped(Exception):
    """A decode stopped because no one waits for its answer any more (the server's clients went or timed out)."""


class Stoppable:
    """`model`, but its `decode` first asks `stop()` and raises `Stopped` when told to: a search over it ends at its
    next step (the constrained search's plain second pass too), whatever the search."""

    def __init__(self, model, stop):
        self._model, self._stop = model, stop

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def decode(self, *args, **kwargs):
        if self._stop():
            raise Stopped
        return self._model.decode(*args, **kwargs)


def decode_ids(
    model,
    src_ids: list[list[int]],
    cfg: DecodeConfig,
    device,
    amp,
    prefixes: list[list[int]] | None = None,
    line_numbers: list[int] | None = None,
    constraints: list[Constraints] | None = None,
    stop=None,
    framing: Framing | None = None,
) -> list[list[Hypothesis]]:
    """Hypotheses for token-id sources with this project's search, or CTranslate2's for an export (see
    `mt.decode.batched.translate_ids` for `prefixes`, `line_numbers` and `constraints`). `stop()`: asked before each
    decoder step (CTranslate2: before the batch), `Stopped` raised when it says so."""
    if isinstance(model, CTranslate2Model):
        if constraints is not None:
            raise ConfigError("constraints and glossaries need this project's search: CTranslate2 has no constrained "
                              "beam search; give the run dir or release instead of the CTranslate2 export")  # fmt: skip
        if stop is not None and stop():
            raise Stopped
        return model.translate_ids(src_ids, cfg, prefixes, framing)
    if stop is not None:
        model = Stoppable(model, stop)
    return translate_ids(model, src_ids, cfg, device, amp, prefixes, line_numbers, constraints, framing)
