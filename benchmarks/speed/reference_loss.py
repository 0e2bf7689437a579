"""The label-smoothed loss from full logits with a closed-form backward: the reference that `mt.model.loss`'s fused
projection + loss is tested against (tests/test_loss.py) and measured against (benchmarks/speed/loss.py). The package
itself trains with the fused version only."""

from __future__ import annotations

import torch

from mt.data.tokenizer import PAD


class _LabelSmoothedCE(torch.autograd.Function):
    """Forward: one log-softmax. Backward: the gradient in closed form, softmax - smoothed target, per kept row.

    Autograd's chain for the same loss (log-softmax backward, the mean's divide over V, the gather's zero-filled
    scatter, and their sum) walks the (N, V) logits several times more; this writes the gradient in four in-place
    passes. Forward + backward at (2400, 8000): 162 -> 86 ms (`benchmarks/speed/loss.py`), which made a training step of
    the Multi30k recipe model ~14% faster (profiled: 4,145 -> 4,729 target tokens/s).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, eps: float):
        logp = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        keep = target.ne(PAD)
        nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
        smooth = -logp.mean(dim=-1)  # (N,) cross-entropy with the uniform distribution
        loss = ((1 - eps) * nll + eps * smooth).masked_fill(~keep, 0.0).sum()
        nll_sum = nll.masked_fill(~keep, 0.0).sum()
        ctx.save_for_backward(logp, target, keep)
        ctx.eps, ctx.in_dtype = eps, logits.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        logp, target, keep = ctx.saved_tensors
        eps, n_vocab = ctx.eps, logp.size(-1)
        grad = logp.exp()  # softmax
        grad.sub_(eps / n_vocab)
        grad.scatter_add_(1, target.unsqueeze(1), grad.new_full((grad.size(0), 1), -(1 - eps)))
        grad.mul_((grad_loss * keep).unsqueeze(1))
        return grad.to(ctx.in_dtype), None, None


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy (5.4) and summed NLL over non-pad targets, in fp32.

    The smoothed target puts 1 - eps on the reference token and eps spread uniformly over the vocabulary (as
    `F.cross_entropy(label_smoothing=eps)` does); one log-softmax serves both sums. The NLL sum is for reporting
    and carries no gradient.
    """
    return _LabelSmoothedCE.apply(logits.reshape(-1, logits.size(-1)), target.reshape(-1), eps)


def rdrop_loss_from_logits(model, src, src_pad_mask, tgt_in, tgt_out, eps: float, alpha: float):
    """R-Drop's (loss, nll) as the trainer computed it before the fused `mt.model.loss.projected_rdrop_loss`: the batch
    stacked twice through the model, both passes' full logits (padding included), then the formula left to
    autograd. The reference `benchmarks/speed/rdrop_step.py` times the fused version against."""

    def twice(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t], dim=0)

    keep = tgt_out.ne(PAD)
    states = model.decoder_states(twice(tgt_in), model.encode(twice(src), twice(src_pad_mask)), twice(src_pad_mask))
    logp = (states @ model.output.weight.t()).float().log_softmax(dim=-1)
    nll = -logp.gather(-1, twice(tgt_out).unsqueeze(-1)).squeeze(-1)
    ce = (1 - eps) * nll - eps * logp.mean(dim=-1)
    lp1, lp2 = logp.chunk(2, dim=0)
    kl = ((lp1.exp() - lp2.exp()) * (lp1 - lp2)).sum(dim=-1)
    both = twice(keep)
    loss = ce.masked_fill(~both, 0.0).sum() / 2 + alpha * kl.masked_fill(~keep, 0.0).sum() / 4
    return loss, nll.masked_fill(~both, 0.0).sum().detach() / 2
