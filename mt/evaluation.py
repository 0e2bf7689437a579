"""Translating a corpus in length-sorted token batches, and scoring it with sacreBLEU against raw references.

Hypotheses are detokenized by the BPE decoder and scored against the untouched reference text, so the BLEU
here is the standard sacreBLEU number (13a tokenization inside sacreBLEU), with its signature.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch

from mt import data, runtime
from mt.batching import BatchLoader, collate, pad
from mt.config import ConfigError, DecodeConfig
from mt.constraints import Constraints, constrained_beam_search
from mt.corpus import make_sampler
from mt.quantize import is_int8, quantize_int8
from mt.runtime import autocast
from mt.search import Hypothesis, max_lengths, output_cap, search
from mt.tokenizer import Vocabs


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
) -> list[list[Hypothesis]]:
    """Decode token-id sources (no specials) and return hypotheses in input order. An empty source gives
    `nbest` empty hypotheses (an empty line in, an empty line out). `prefixes`: target ids each line's
    hypotheses start with (empty = none). `line_numbers`: each source's number in its input (default 0, 1, ...),
    which with `cfg.seed` decides its samples. `constraints`: each line's target phrases (mt/constraints.py)."""
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
        batch = collate([src_ids[i] for i in idx], None, idx)
        prefix = pad([prefixes[i] for i in idx]) if prefixes and any(prefixes[i] for i in idx) else None
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
            out[i] = h
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


@torch.no_grad()
def validation_loss(model, valid, max_tokens: int, label_smoothing: float, device, amp) -> dict:
    """Label-smoothed loss, NLL and perplexity per target token of a tokenized split (teacher-forced)."""
    model.eval()
    loss_sum = nll_sum = n = 0.0
    sampler = make_sampler(data.length_columns(valid), max_tokens, 0, False)
    for b in BatchLoader(valid.select_columns(["src_ids", "tgt_ids"]), sampler):
        b = b.to(device)
        with autocast(device, amp):
            loss, nll = model.loss(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, label_smoothing)
        loss_sum, nll_sum, n = loss_sum + loss.item(), nll_sum + nll.item(), n + b.n_tgt_tokens
    return {"valid_loss": loss_sum / n, "valid_nll": nll_sum / n, "valid_ppl": math.exp(min(nll_sum / n, 50))}


def validation_bleu(model, ds, vocabs: Vocabs, decode_cfg: DecodeConfig, device, amp) -> dict:
    """BLEU and chrF of the search's translations of a tokenized split's `src_ids` against its raw `tgt`."""
    start = time.perf_counter()
    hyps = translate_ids(model, list(ds["src_ids"]), decode_cfg, device, amp)
    s = score(vocabs.tgt.decode_batch([h[0].tokens for h in hyps]), list(ds["tgt"]))
    bleu = s["bleu_lowercase"] if vocabs.tgt.lowercases else s["bleu"]  # a lowercased model's capitals are all missing
    return {"valid_bleu": bleu, "valid_chrf": s["chrf"], "valid_decode_s": time.perf_counter() - start}


def score(hyps: list[str], refs: list[str]) -> dict:
    """Corpus BLEU (cased and lowercased), chrF, with sacreBLEU signatures."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    bleu, bleu_lc, chrf = sacrebleu.BLEU(), sacrebleu.BLEU(lowercase=True), sacrebleu.CHRF()
    b, blc, c = bleu.corpus_score(hyps, [refs]), bleu_lc.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {
        "bleu": round(b.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_lowercase": round(blc.score, 2),
        "bleu_lowercase_signature": str(bleu_lc.get_signature()),
        "chrf": round(c.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "length_ratio": round(b.sys_len / max(b.ref_len, 1), 4),
        "bleu_detail": str(b),
    }


def sentence_examples(srcs: list[str], hyps: list[str], refs: list[str], k: int = 5) -> dict:
    """The k best and worst sentences by sentence BLEU (sentences of 5+ reference words, to skip trivia)."""
    scored = [
        (sacrebleu.sentence_bleu(h, [r]).score, s, h, r) for s, h, r in zip(srcs, hyps, refs) if len(r.split()) >= 5
    ]
    scored.sort(key=lambda x: x[0])
    row = lambda x: {"sentence_bleu": round(x[0], 1), "source": x[1], "hypothesis": x[2], "reference": x[3]}  # noqa: E731
    return {"best": [row(x) for x in scored[::-1][:k]], "worst": [row(x) for x in scored[:k]]}


def write_report(
    out_dir: Path, name: str, srcs: list[str], hyps: list[str], refs: list[str], extra: dict, lowercased: bool = False
) -> dict:
    """Score and write `report.json` and `report.md` (named `{name}.report.*` when name is given). `lowercased`: the
    model translates into lowercase (its tokenizer lowercases), which the report says beside its cased scores."""
    report = {"name": name, "sentences": len(hyps), **score(hyps, refs), **extra}
    if lowercased:
        report["lowercased_model"] = True
    report["examples"] = sentence_examples(srcs, hyps, refs)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{name}.report" if name else "report"
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out_dir / f"{stem}.md").write_text(report_markdown(report))
    return report


def report_markdown(r: dict) -> str:
    lines = [
        f"# Translation report: {r['name'] or 'hypotheses'}",
        "",
        "| metric | value | sacreBLEU signature |",
        "|---|---|---|",
        f"| BLEU | {r['bleu']:.2f} | `{r['bleu_signature']}` |",
        f"| BLEU (lowercased) | {r['bleu_lowercase']:.2f} | `{r['bleu_lowercase_signature']}` |",
        f"| chrF | {r['chrf']:.2f} | `{r['chrf_signature']}` |",
        f"| length ratio (hyp/ref) | {r['length_ratio']:.3f} | |",
        "",
        f"`{r['bleu_detail']}`",
        "",
    ]
    if r.get("lowercased_model"):
        lines += ["The model lowercases (`tokenizer.normalization`): its lowercased BLEU is its score; the cased",
                  "BLEU and chrF also count the capitals it cannot produce.", ""]  # fmt: skip
    for key in ("sentences", "sentences_per_s", "tokens_per_s", "decode", "precision", "checkpoint"):
        if key in r:
            val = f"{r[key]:.1f}" if isinstance(r[key], float) else r[key]
            lines.append(f"- {key.replace('_', ' ')}: {val}")
    for which in ("best", "worst"):
        lines += ["", f"## {which.capitalize()} sentences by sentence BLEU", ""]
        for ex in r["examples"][which]:
            lines += [
                f"- **{ex['sentence_bleu']}** SRC: {ex['source']}",
                f"  HYP: {ex['hypothesis']}",
                f"  REF: {ex['reference']}",
            ]
    return "\n".join(lines) + "\n"
