"""Label-smoothed cross-entropy (5.4), the training loss, fused with the output projection.

It sums over non-padding targets and returns (loss, nll), the NLL for reporting only. The smoothed target puts
1 - eps on the reference token and eps spread uniformly over the vocabulary (as
`F.cross_entropy(label_smoothing=eps)` does), so per token

    loss = (1 - eps) * (lse - z_y) + eps * (lse - mean(z)),    d loss / d z = softmax(z) - q

with z the logits, lse their log-sum-exp and q the smoothed target. R-Drop's loss
(`train.rdrop_alpha`, mt/train/regularize.py) is fused the same way: the two dropout passes' logits of a token side
by side, a chunk at a time.
"""

from __future__ import annotations

import torch

from mt import runtime
from mt.data.tokenizer import PAD


def _add_chunk_gradients(g, h, w, mm_dtype, grad_h, rows: slice, grad_w) -> None:
    """A chunk's share of both input gradients from g = d loss / d logits (fp32): its rows of grad_h = g @ W and
    g^T h added to grad_w, the matmuls in the projection's dtype, except in fp16: g is formed before the loss scale
    applies, and its small entries would underflow to 0 there."""
    if mm_dtype == torch.float16:
        grad_h[rows] = g @ w.float()
        grad_w.addmm_(g.t(), h.float())
        return
    g = g.to(mm_dtype)
    grad_h[rows] = g @ w
    if mm_dtype == torch.float32:
        grad_w.addmm_(g.t(), h)
    else:
        grad_w += (g.t() @ h).float()


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
    def forward(ctx, states, weight, target, eps: float, chunk: int, want_grad: bool, pad: int, shift):
        device = states.device.type
        mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        with torch.autocast(device, enabled=False):
            h, w = states.to(mm_dtype), weight.to(mm_dtype)
            # With a logit shift (an output bias, -inf at masked ids) the smoothing spreads over the ids left.
            masked = torch.isinf(shift) if shift is not None else None
            n_vocab = w.size(0) - (int(masked.sum()) if masked is not None else 0)
            loss = torch.zeros((), device=states.device)
            nll_sum = torch.zeros((), device=states.device)
            grad_h = torch.empty_like(states) if want_grad else None
            grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_grad else None
            for start in range(0, h.size(0), chunk):
                h_c, t_c = h[start : start + chunk], target[start : start + chunk]
                keep = t_c.ne(pad)
                z = (h_c @ w.t()).float()  # (n, V)
                if shift is not None:
                    z += shift
                lse = torch.logsumexp(z, dim=-1)
                nll = (lse - z.gather(1, t_c.unsqueeze(1)).squeeze(1)).masked_fill(~keep, 0.0)
                mean = z.mean(dim=-1) if masked is None else z.masked_fill(masked, 0.0).sum(dim=-1) / n_vocab
                smooth = (lse - mean).masked_fill(~keep, 0.0)
                loss += ((1 - eps) * nll + eps * smooth).sum()
                nll_sum += nll.sum()
                if not want_grad:
                    continue
                g = z.sub_(lse.unsqueeze(1)).exp_().sub_(eps / n_vocab)  # softmax - eps / V, in place
                if masked is not None:
                    g.masked_fill_(masked, 0.0)
                g.scatter_add_(1, t_c.unsqueeze(1), g.new_full((g.size(0), 1), -(1 - eps)))
                g = g.mul_(keep.unsqueeze(1))
                _add_chunk_gradients(g, h_c, w, mm_dtype, grad_h, slice(start, start + chunk), grad_w)
        ctx.mark_non_differentiable(nll_sum)
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        grads = grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype)
        return (*grads, None, None, None, None, None, None)


def projected_label_smoothed_loss(
    states: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    eps: float,
    chunk: int | None = None,
    pad: int = PAD,
    shift: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed loss and NLL of the logits `states @ weight.T (+ shift)` without materialising them.

    states (N, D), weight (V, D) (the output projection's), target (N,) with `pad` where nothing is scored;
    `shift` (V,): a fixed output bias, -inf at ids never predicted (`Transformer.logit_shift`); `chunk` rows at a
    time: by default 256 on the CPU (the fastest on the recipe's shapes, `benchmarks/speed/loss.py`: its logits stay in
    cache) and 8,192 on CUDA (large matmuls keep the GPU busy; memory stays bounded for large vocabularies). Under
    `train.compile` it runs eagerly (`run_eagerly_under_compile`)."""
    chunk = chunk or (8192 if runtime.on_cuda(states.device) else 256)
    # forward() runs with autograd off, so whether gradients will be wanted is decided here
    want_grad = torch.is_grad_enabled() and (states.requires_grad or weight.requires_grad)
    states = states.reshape(-1, states.size(-1))
    shift = shift.float() if shift is not None else None
    return _ProjectedLabelSmoothedCE.apply(states, weight, target.reshape(-1), eps, chunk, want_grad, pad, shift)


class _ProjectedRDrop(torch.autograd.Function):
    """R-Drop's loss with the output projection, as `_ProjectedLabelSmoothedCE` does the plain one: a chunk of
    tokens at a time, both dropout passes' logits of those tokens side by side, gradients computed in the forward.
    Per kept token, with z_i the logits of pass i, l_i = log softmax(z_i), p_i = exp(l_i), d = l_1 - l_2 and the two
    KL divergences K_12 = sum(p_1 d), K_21 = -sum(p_2 d):

        loss = (CE(z_1) + CE(z_2)) / 2 + alpha / 4 * (K_12 + K_21)
        d loss / d z_1 = (p_1 - q) / 2 + alpha / 4 * (p_1 (d - K_12) + p_1 - p_2)
        d loss / d z_2 = (p_2 - q) / 2 + alpha / 4 * (p_2 (-d - K_21) + p_2 - p_1)

    (d K_12 / d z_1 = p_1 (d - K_12), d K_21 / d z_1 = p_1 - p_2.) A recipe step runs at 0.47x a plain step's
    target tokens/s, against 0.50x for two plain passes and 0.32x with both passes' logits in full left to autograd
    (`benchmarks/speed/rdrop_step.py`)."""

    @staticmethod
    def forward(ctx, h1, h2, weight, target, eps: float, alpha: float, chunk: int, want_grad: bool):
        device = h1.device.type
        mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        a = alpha / 4
        with torch.autocast(device, enabled=False):
            w = weight.to(mm_dtype)
            n_vocab = w.size(0)
            loss = torch.zeros((), device=h1.device)
            nll_sum = torch.zeros((), device=h1.device)
            grads = [torch.empty_like(h1), torch.empty_like(h2)] if want_grad else None
            grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_grad else None
            for start in range(0, h1.size(0), chunk):
                rows = slice(start, start + chunk)
                h_c = [h1[rows].to(mm_dtype), h2[rows].to(mm_dtype)]
                t_c = target[rows]
                keep = t_c.ne(PAD)
                logp = []
                for h in h_c:
                    z = (h @ w.t()).float()
                    logp.append(z.sub_(torch.logsumexp(z, dim=-1, keepdim=True)))
                nll = [-lp.gather(1, t_c.unsqueeze(1)).squeeze(1) for lp in logp]
                smooth = [-lp.mean(dim=-1) for lp in logp]
                p1, p2 = logp[0].exp(), logp[1].exp()
                d = logp[0].sub_(logp[1])  # l_1 - l_2, in l_1's memory
                k12, k21 = (p1 * d).sum(dim=-1), -(p2 * d).sum(dim=-1)
                ce = (1 - eps) * (nll[0] + nll[1]) + eps * (smooth[0] + smooth[1])
                loss += (ce / 2 + a * (k12 + k21)).masked_fill(~keep, 0.0).sum()
                nll_sum += ((nll[0] + nll[1]) / 2).masked_fill(~keep, 0.0).sum()
                if not want_grad:
                    continue
                g1 = (a * d).add_((a * (1 - k12) + 0.5).unsqueeze(1)).mul_(p1).sub_(a * p2)
                g2 = (-a * d).add_((a * (1 - k21) + 0.5).unsqueeze(1)).mul_(p2).sub_(a * p1)
                # - q / 2: -(1 - eps) / 2 at the reference token, -eps / 2V everywhere
                reference = g1.new_full((g1.size(0), 1), -(1 - eps) / 2)
                for g, h, grad_h in ((g1, h_c[0], grads[0]), (g2, h_c[1], grads[1])):
                    g = g.sub_(eps / (2 * n_vocab)).scatter_add_(1, t_c.unsqueeze(1), reference).mul_(keep.unsqueeze(1))
                    _add_chunk_gradients(g, h, w, mm_dtype, grad_h, rows, grad_w)
        ctx.mark_non_differentiable(nll_sum)
        if want_grad:
            ctx.save_for_backward(grads[0], grads[1], grad_w.to(weight.dtype))
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):
        g1, g2, grad_w = ctx.saved_tensors
        return (g1 * grad_loss.to(g1.dtype), g2 * grad_loss.to(g2.dtype), grad_w * grad_loss.to(grad_w.dtype),
                None, None, None, None, None)  # fmt: skip


def projected_rdrop_loss(
    h1: torch.Tensor, h2: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, eps: float, alpha: float,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """R-Drop's (loss, nll) of the two passes' final states h1, h2 (N, D) for the same targets (N,), without the
    logits in full: (CE_1 + CE_2) / 2 + alpha * (KL(p_1 || p_2) + KL(p_2 || p_1)) / 4 and (NLL_1 + NLL_2) / 2, summed
    over non-padding targets. Chunks as `projected_label_smoothed_loss`."""
    chunk = chunk or (8192 if runtime.on_cuda(h1.device) else 256)
    want_grad = torch.is_grad_enabled() and (h1.requires_grad or h2.requires_grad or weight.requires_grad)
    return _ProjectedRDrop.apply(h1, h2, weight, target, eps, alpha, chunk, want_grad)


def run_eagerly_under_compile() -> None:
    """`train.compile`: keep the fused loss out of the compiled graph. It is fused by hand already, and its loop
    over row chunks would make torch.compile specialise on the number of rows: a recompile for every batch. (Not a
    decorator: that would import dynamo, 0.75 s, into every entry point, which Transformer.loss avoids by calling
    this module's function by name.)"""
    global projected_label_smoothed_loss, projected_rdrop_loss
    if not getattr(projected_label_smoothed_loss, "_torchdynamo_disable", False):
        projected_label_smoothed_loss = torch.compiler.disable(projected_label_smoothed_loss)
        projected_rdrop_loss = torch.compiler.disable(projected_rdrop_loss)
