"""Label-smoothed cross-entropy (5.4), the training loss, fused with the output projection.

It sums over non-padding targets and returns (loss, nll), the NLL for reporting only. The smoothed target puts
1 - eps on the reference token and eps spread uniformly over the vocabulary (as
`F.cross_entropy(label_smoothing=eps)` does), so per token

    loss = (1 - eps) * (lse - z_y) + eps * (lse - mean(z)),    d loss / d z = softmax(z) - q

with z the logits, lse their log-sum-exp and q the smoothed target.
"""

from __future__ import annotations

import torch

from mt import runtime
from mt.tokenizer import PAD


class _ProjectedLabelSmoothedCE(torch.autograd.Function):
    """The output projection and the loss together, a chunk of rows at a time, gradients computed in the forward.

    The (N, V) logits are the largest tensor of a training step, and a plain projection + loss writes and reads
    them several times. Here one chunk of rows exists at a time (sized to stay in a CPU's cache): its logits, the
    loss terms, the gradient softmax - q in place, then that chunk's share of both input gradients (states and
    weight). Backward only scales the stored gradients by the incoming one. Same sums and gradients as projecting
    and then taking the loss, up to float rounding (tests/test_loss.py; speed in benchmarks/RESULTS.md). The extra
    work in the forward is skipped when no input needs a gradient. Under autocast the three matmuls run in the
    autocast dtype (as they would in the model) and the softmax in fp32.
    """

    @staticmethod
    def forward(ctx, states, weight, target, eps: float, chunk: int, want_grad: bool):
        device = states.device.type
        mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        with torch.autocast(device, enabled=False):
            h, w = states.to(mm_dtype), weight.to(mm_dtype)
            n_vocab = w.size(0)
            loss = torch.zeros((), device=states.device)
            nll_sum = torch.zeros((), device=states.device)
            grad_h = torch.empty_like(states) if want_grad else None
            grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_grad else None
            for start in range(0, h.size(0), chunk):
                h_c, t_c = h[start : start + chunk], target[start : start + chunk]
                keep = t_c.ne(PAD)
                z = (h_c @ w.t()).float()  # (n, V)
                lse = torch.logsumexp(z, dim=-1)
                nll = (lse - z.gather(1, t_c.unsqueeze(1)).squeeze(1)).masked_fill(~keep, 0.0)
                smooth = (lse - z.mean(dim=-1)).masked_fill(~keep, 0.0)
                loss += ((1 - eps) * nll + eps * smooth).sum()
                nll_sum += nll.sum()
                if not want_grad:
                    continue
                g = z.sub_(lse.unsqueeze(1)).exp_().sub_(eps / n_vocab)  # softmax - eps / V, in place
                g.scatter_add_(1, t_c.unsqueeze(1), g.new_full((g.size(0), 1), -(1 - eps)))
                g = g.mul_(keep.unsqueeze(1))
                if mm_dtype == torch.float16:
                    # formed before the loss scale applies: in fp16 its small entries would underflow to 0
                    grad_h[start : start + chunk] = g @ w.float()
                    grad_w.addmm_(g.t(), h_c.float())
                    continue
                g = g.to(mm_dtype)
                grad_h[start : start + chunk] = g @ w
                if mm_dtype == torch.float32:
                    grad_w.addmm_(g.t(), h_c)
                else:
                    grad_w += (g.t() @ h_c).float()
        ctx.mark_non_differentiable(nll_sum)
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype), None, None, None, None


def projected_label_smoothed_loss(
    states: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, eps: float, chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed loss and NLL of the logits `states @ weight.T` without materialising them.

    states (N, D), weight (V, D) (the output projection's, bias-free), target (N,); `chunk` rows at a time: by
    default 256 on the CPU (the fastest on the recipe's shapes, `benchmarks/loss.py`, its logits stay in cache) and
    8,192 on CUDA (large matmuls keep the GPU busy; memory stays bounded for large vocabularies). Under
    `train.compile` it runs eagerly (`run_eagerly_under_compile`)."""
    chunk = chunk or (8192 if runtime.on_cuda(states.device) else 256)
    # forward() runs with autograd off, so whether gradients will be wanted is decided here
    want_grad = torch.is_grad_enabled() and (states.requires_grad or weight.requires_grad)
    states = states.reshape(-1, states.size(-1))
    return _ProjectedLabelSmoothedCE.apply(states, weight, target.reshape(-1), eps, chunk, want_grad)


def run_eagerly_under_compile() -> None:
    """`train.compile`: keep the fused loss out of the compiled graph. It is fused by hand already, and its loop
    over row chunks would make torch.compile specialise on the number of rows: a recompile for every batch. (Not a
    decorator: that would import dynamo, 0.75 s, into every entry point, which Transformer.loss avoids by calling
    this module's function by name.)"""
    global projected_label_smoothed_loss
    if not getattr(projected_label_smoothed_loss, "_torchdynamo_disable", False):
        projected_label_smoothed_loss = torch.compiler.disable(projected_label_smoothed_loss)
