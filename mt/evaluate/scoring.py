"""Validation scores during training: the loss of a tokenized split, and the BLEU and chrF of its translations
(sacreBLEU, report.py)."""

from __future__ import annotations

import math
import time

import torch

from mt.config import DecodeConfig
from mt.data import read
from mt.data.batching import BatchLoader
from mt.data.corpus import make_sampler
from mt.data.tokenizer import PAPER_FRAMING, Framing, Vocabs
from mt.decode.batched import translate_ids
from mt.evaluate.report import score
from mt.runtime import autocast


@torch.no_grad()
def validation_loss(model, valid, max_tokens: int, label_smoothing: float, device, amp,
                    framing: Framing = PAPER_FRAMING) -> dict:  # fmt: skip
    """Label-smoothed loss, NLL and perplexity per target token of a tokenized split (teacher-forced); `framing`:
    the model's special ids and language tokens."""
    model.eval()
    loss_sum = nll_sum = n = 0.0
    sampler = make_sampler(read.length_columns(valid), max_tokens, 0, False)
    for b in BatchLoader(valid.select_columns(["src_ids", "tgt_ids"]), sampler, framing=framing):
        b = b.to(device)
        with autocast(device, amp):
            loss, nll = model.loss(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, label_smoothing)
        loss_sum, nll_sum, n = loss_sum + loss.item(), nll_sum + nll.item(), n + b.n_tgt_tokens
    return {"valid_loss": loss_sum / n, "valid_nll": nll_sum / n, "valid_ppl": math.exp(min(nll_sum / n, 50))}


def validation_bleu(model, ds, vocabs: Vocabs, decode_cfg: DecodeConfig, device, amp,
                    framing: Framing | None = None) -> dict:  # fmt: skip
    """BLEU and chrF of the search's translations of a tokenized split's `src_ids` against its raw `tgt`."""
    start = time.perf_counter()
    hyps = translate_ids(model, list(ds["src_ids"]), decode_cfg, device, amp, framing=framing)
    s = score(vocabs.tgt.decode_batch([h[0].tokens for h in hyps]), list(ds["tgt"]))
    bleu = s["bleu_lowercase"] if vocabs.tgt.lowercases else s["bleu"]  # a lowercased model's capitals are all missing
    return {"valid_bleu": bleu, "valid_chrf": s["chrf"], "valid_decode_s": time.perf_counter() - start}
