"""A confidence for every translation: its score (the mean log-probability of the output's tokens) and its flags
(mt/decode/flags.py), as translate.py's `output_format=jsonl`, `Translator.translate(..., scores=True)` and the
server give them.

The score is the model's log-probability of the output's tokens and </s> (natural log; a target-language token
an imported multilingual model forces first is not counted) divided by their number, whatever length penalty
ranked the beam: near 0 is a confident line, -1.5 a doubtful one. For this project's models it is the search's
own sum; forced decoding of the same translation (`Translator.score`, `python -m mt.score`) gives the same
number. Where the search did not score every token at the model's probability (an imported model's search gives
forced tokens 0, as transformers does; a CTranslate2 export keeps only a length-normalised score), the lines are
scored by forced decoding: one more pass of the decoder.
"""

from __future__ import annotations

import math

import torch

from mt.config import ConfigError, DecodeConfig
from mt.data.batching import collate
from mt.decode.batched import token_batches
from mt.decode.ct2 import CTranslate2Model
from mt.decode.flags import line_flags
from mt.decode.search import Hypothesis, output_cap
from mt.runtime import autocast


def line_limit(translator, src_ids: list[int], decode: DecodeConfig) -> int:
    """The output length limit (</s> counted) the search held the line with source ids `src_ids` to."""
    model = translator.model
    n_src = len(src_ids) + 1  # </s>
    if not isinstance(model, CTranslate2Model):
        n_src += len(translator.framing().src_lead)
    return max(1, min(math.floor(n_src * decode.max_len_a + decode.max_len_b), output_cap(model, decode)))


def length_ratio_range(translator) -> list[float] | None:
    """The output/source length range of the model's training pairs, where its run kept one."""
    ckpt = translator.checkpoint
    return ckpt.get("length_ratio") or (ckpt.get("config") or {}).get("length_ratio")


def hypothesis_logprobs(translator, src_ids: list[list[int]], hyps: list[Hypothesis], decode: DecodeConfig,
                        lead: int, tgt_lang: str | None = None) -> list[float]:  # fmt: skip
    """Each best hypothesis's summed token log-probability (</s> included, a forced language token not): the
    search's own where it scored every token at the model's probability (this project's models), else by forced
    decoding (an imported model's search scores forced tokens 0, as transformers does; CTranslate2 keeps only a
    normalised score under a length penalty, and leaves out </s> at the length limit)."""
    out = [h.logprob for h in hyps]
    again = []
    if lead or not decode.score_forced or isinstance(translator.model, CTranslate2Model):
        again = [i for i, ids in enumerate(src_ids) if ids]
    if again:
        framing = translator.framing(tgt_lang)  # the target language these lines were translated into
        forced = forced_logprobs(translator, [src_ids[i] for i in again], [hyps[i].tokens for i in again], framing)
        for i, x in zip(again, forced):
            out[i] = x
    return out


@torch.no_grad()
def forced_logprobs(translator, src_ids: list[list[int]], tgt_ids: list[list[int]], framing) -> list[float]:
    """The summed log-probability of each target and </s> given its source (forced decoding; a target-language
    token the model forces first is framed but not counted), in the model's current mode (eval, or train for MC
    dropout); CTranslate2's `score_batch` for an export."""
    model = translator.model
    if isinstance(model, CTranslate2Model):
        return model.score_ids(src_ids, tgt_ids)
    out = [0.0] * len(src_ids)
    lengths = [len(s) + len(t) + 2 for s, t in zip(src_ids, tgt_ids)]
    for idx in token_batches(lengths, translator.decode.max_tokens):
        b = collate([src_ids[i] for i in idx], [tgt_ids[i] for i in idx], idx, framing).to(translator.device)
        with autocast(translator.device, translator.amp):
            logits = model.decode(b.tgt_in, model.encode(b.src, b.src_pad_mask), b.src_pad_mask)
        logp = logits.float().log_softmax(-1).gather(-1, b.tgt_out[..., None]).squeeze(-1)
        logp = logp.masked_fill(b.tgt_out == framing.specials.pad, 0.0)[:, len(framing.tgt_lead) :]
        sums = logp.sum(1).tolist()
        for i, value in zip(idx, sums):
            out[i] = value
    return out


def check_confidence_model(translator, confidence: str) -> None:
    """`confidence=mc_dropout` needs dropout in the model: refused for a CTranslate2 export, before any input."""
    if confidence == "mc_dropout" and isinstance(translator.model, CTranslate2Model):
        raise ConfigError("confidence=mc_dropout needs this project's model (CTranslate2 runs no dropout at "
                          "inference); give the run dir or release instead of the CTranslate2 export")  # fmt: skip


def mc_dropout(translator, src_ids: list[list[int]], tgt_ids: list[list[int]], framing, passes: int,
               seed: int) -> list[list[float]]:  # fmt: skip
    """Per pair, `passes` summed token log-probabilities (`forced_logprobs`) with the model's dropout on (Monte
    Carlo dropout, Gal & Ghahramani 2016): each pass another random subnetwork of the model. Empty sources: []."""
    check_confidence_model(translator, "mc_dropout")
    rows = [i for i, s in enumerate(src_ids) if s]
    out: list[list[float]] = [[] for _ in src_ids]
    torch.manual_seed(seed)
    translator.model.train()  # dropout on; nothing here updates a weight
    try:
        for _ in range(passes):
            sums = forced_logprobs(translator, [src_ids[i] for i in rows], [tgt_ids[i] for i in rows], framing)
            for i, x in zip(rows, sums):
                out[i].append(x)
    finally:
        translator.model.eval()
    return out


def mc_signals(passes: list[float]) -> dict:
    """Fomicheva et al. (2020)'s D-TP and D-Var: the mean and variance over the passes of each pass's sentence
    probability (exp of its mean token log-probability); 0 and 0 for an empty line."""
    if not passes:
        return {"mc_mean": 0.0, "mc_var": 0.0}
    probs = [math.exp(x) for x in passes]
    mean = sum(probs) / len(probs)
    return {"mc_mean": round(mean, 6), "mc_var": round(sum((p - mean) ** 2 for p in probs) / len(probs), 8)}


def records(
    translator,
    sources: list[str],
    src_ids: list[list[int]],
    hyps: list[Hypothesis],
    texts: list[str],
    decode: DecodeConfig,
    tgt_lang: str | None = None,
    flag_below: float | None = None,
    line_of: list[int] | None = None,
    mc_passes: int = 0,
) -> list[dict]:
    """{"text", "score", "flags"} per line. `hyps`/`src_ids`: each translated piece's best hypothesis and source
    ids; `line_of[k]`: the line piece k belongs to (a line over the model's positions is translated in pieces: its
    score is over all their tokens, its length limit reached if any piece's was); by default one piece a line.
    `mc_passes`: also the MC-dropout signals (`mc_signals`) of that many passes, per line (of its first piece)."""
    line_of = line_of if line_of is not None else list(range(len(sources)))
    lead = len(translator.framing(tgt_lang).tgt_lead)
    ratio = length_ratio_range(translator)
    logprobs = hypothesis_logprobs(translator, src_ids, hyps, decode, lead, tgt_lang)
    sums, counts, src_n, out_n = ([0.0] * len(sources), [0] * len(sources), [0] * len(sources), [0] * len(sources))
    capped = [False] * len(sources)
    for k, (ids, h, lp) in enumerate(zip(src_ids, hyps, logprobs)):
        i = line_of[k]
        if not ids:  # an empty line in, an empty line out: nothing was decoded
            continue
        sums[i], counts[i] = sums[i] + lp, counts[i] + len(h.tokens) + 1
        src_n[i], out_n[i] = src_n[i] + len(ids), out_n[i] + len(h.tokens)
        capped[i] = capped[i] or lead + len(h.tokens) + 1 >= line_limit(translator, ids, decode)
    lang = tgt_lang or translator.tgt_lang or translator.direction().split("->")[-1]
    out = []
    for i, (source, text) in enumerate(zip(sources, texts)):
        score = sums[i] / counts[i] if counts[i] else 0.0
        flags = line_flags(source, text, tgt_lang=lang, src_tokens=src_n[i], out_tokens=out_n[i], capped=capped[i],
                           score=score, ratio=ratio, flag_below=flag_below)  # fmt: skip
        out.append({"text": text, "score": round(score, 6), "flags": flags})
    if mc_passes:
        framing = translator.framing(tgt_lang)
        passes = mc_dropout(translator, src_ids, [h.tokens for h in hyps], framing, mc_passes, decode.seed)
        pieces_of: list[list[int]] = [[] for _ in sources]
        for k, i in enumerate(line_of):
            if passes[k]:
                pieces_of[i].append(k)
        for i, r in enumerate(out):  # per pass, the line's mean over all its pieces' tokens
            pieces = pieces_of[i]
            means = [sum(passes[k][p] for k in pieces) / counts[i] for p in range(mc_passes)] if pieces else []
            r.update(mc_signals(means))
    return out


def scored_lines(
    translator,
    lines: list[str],
    decode: DecodeConfig,
    *,
    prefixes=None,
    constraints=None,
    first_line: int = 0,
    tgt_lang: str | None = None,
    flag_below: float | None = None,
    where: str = "prefix",
    tally=None,
    glossary=None,
    constraints_where: str = "constraints",
    mc_passes: int = 0,
) -> tuple[list[dict], int]:
    """(a record per line, output tokens) for a chunk of input lines: the lines translated as `Translator.translate`
    does (one over the model's positions in pieces, unless prefixes or constraints hold it whole), then scored and
    flagged."""
    doc = None
    if prefixes is None and constraints is None and translator.too_long(lines, tgt_lang):
        doc = translator.split(lines, tgt_lang, first_line, whole_lines=True)
    inputs = doc.sentences if doc is not None else lines
    src_ids, hyps = translator.hypotheses(inputs, decode, prefixes, first_line=first_line, where=where,
                                          tgt_lang=tgt_lang, constraints=constraints, tally=tally,
                                          glossary=glossary,
                                          constraints_where=constraints_where)  # fmt: skip
    best = [h[0] for h in hyps]
    texts = translator.vocabs.tgt.decode_batch([h.tokens for h in best])
    line_of = None
    if doc is not None:
        texts, line_of = doc.join(texts), [doc.line_of(k) for k in range(len(inputs))]
    found = records(translator, lines, src_ids, best, texts, decode, tgt_lang, flag_below, line_of, mc_passes)
    return found, sum(len(h.tokens) for h in best)
