"""Regularizers for small corpora that change what one update computes (the recipe trials):

- R-Drop (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks"): the batch goes through the model
  twice with independent dropout masks, and the loss adds the symmetric KL divergence between the two predicted
  distributions of every target token, `train.rdrop_alpha` times. Twice the compute of an update.
- Target-side word dropout (`train.tgt_word_dropout`): each real token of the decoder's input is replaced by
  <unk> with that probability, so the decoder leans less on its own history (the references it predicts are
  untouched). Both draw from the global RNG, so an exact resume draws the same.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mt.config import ConfigError
from mt.data.tokenizer import EOS, PAPER_FRAMING, UNK, Specials
from mt.model import loss as fused_loss
from mt.model.transformer import skips_padding_rows


def rdrop_loss(model, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor, tgt_out: Tensor, eps: float,
               alpha: float) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(loss, nll) summed over the non-padding targets, on the plain loss's scale:

        loss = (CE_1 + CE_2) / 2 + alpha * (KL(p_1 || p_2) + KL(p_2 || p_1)) / 4,    nll = (NLL_1 + NLL_2) / 2

    that is the paper's (eq. 3) and fairseq's `label_smoothed_cross_entropy_with_rdrop` objective, CE_1 + CE_2 +
    alpha * (KL(p_1 || p_2) + KL(p_2 || p_1)) / 2, halved: an alpha means what it means there. CE is the
    label-smoothed cross-entropy of `mt.model.loss` and p_1, p_2 the two passes' distributions (one forward of the batch
    stacked twice: each row draws its own dropout masks). The loss is fused with the output projection
    (`mt.model.loss.projected_rdrop_loss`), and the CPU skips padding positions before it, as the plain loss does."""

    def twice(t: Tensor) -> Tensor:
        return torch.cat([t, t], dim=0)

    if model.logit_shift() is not None:
        raise ConfigError("train.rdrop_alpha: R-Drop's fused loss has no output bias or masked <pad> logit, which "
                          "this (imported) model has; set train.rdrop_alpha=0")  # fmt: skip
    keep = tgt_out.ne(model.specials.pad)
    wanted = twice(keep) if skips_padding_rows(tgt_out.device) else None
    memory = model.encode(twice(src), twice(src_pad_mask))
    states = model.decoder_states(twice(tgt_in), memory, twice(src_pad_mask), wanted=wanted)
    h1, h2 = states.reshape(-1, states.size(-1)).chunk(2)  # pass 1's tokens, then pass 2's, in the same order
    target = tgt_out[keep] if wanted is not None else tgt_out.reshape(-1)
    return fused_loss.projected_rdrop_loss(h1, h2, model.output.weight, target, eps, alpha)


def drop_target_words(tgt_in: Tensor, p: float, specials: Specials = PAPER_FRAMING.specials) -> Tensor:
    """`tgt_in` with each token but the special ones (the decoder's first token, </s>, padding, and the tokens
    before this project's first subword) replaced by <unk> with probability `p`."""
    drop = torch.rand(tgt_in.shape, device=tgt_in.device) < p
    if specials == Specials():
        return tgt_in.masked_fill(drop & tgt_in.gt(EOS), UNK)
    fixed = torch.tensor([specials.pad, specials.start, specials.eos], device=tgt_in.device)
    return tgt_in.masked_fill(drop & ~torch.isin(tgt_in, fixed), specials.unk)
