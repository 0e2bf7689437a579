"""The training losses: label-smoothed cross-entropy from logits, and fused with the output projection."""

import pytest
import torch

from benchmarks.speed.reference_loss import label_smoothed_loss
from mt.model.loss import projected_label_smoothed_loss, projected_rdrop_loss
from mt.model.transformer import Transformer
from tests.conftest import tiny_model_config


def test_label_smoothed_loss_by_hand():
    logits = torch.tensor([[[1.0, 2.0, 0.5, 0.0]], [[0.0, 0.0, 3.0, 1.0]]])  # (B=2, T=1, V=4)
    target = torch.tensor([[1], [0]])  # the second is <pad>: ignored
    eps = 0.1
    logp = torch.log_softmax(torch.tensor([1.0, 2.0, 0.5, 0.0]), -1)
    # (1 - eps) * NLL + eps * mean over the vocabulary of -log p
    expected = (1 - eps) * -logp[1] + eps * -logp.mean()
    loss, nll = label_smoothed_loss(logits, target, eps)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert nll.item() == pytest.approx(-logp[1].item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_label_smoothed_loss_gradient_matches_autograd(dtype):
    """The closed-form backward equals autograd through log-softmax, gather and mean (pad rows get zero)."""
    torch.manual_seed(0)
    logits = (torch.randn(7, 11) * 3).to(dtype).requires_grad_()
    target = torch.tensor([3, 0, 5, 10, 1, 0, 2])  # two <pad> rows
    eps, scale = 0.1, 0.37
    loss, nll = label_smoothed_loss(logits, target, eps)
    (loss * scale).backward()
    assert not nll.requires_grad

    ref_logits = logits.detach().clone().requires_grad_()
    logp = torch.log_softmax(ref_logits.float(), -1)
    keep = target.ne(0)
    per_token = (1 - eps) * -logp.gather(1, target[:, None]).squeeze(1) + eps * -logp.mean(-1)
    ((per_token * keep).sum() * scale).backward()
    assert logits.grad.dtype == dtype
    assert loss.item() == pytest.approx((per_token * keep).sum().item(), rel=1e-6)
    torch.testing.assert_close(logits.grad.float(), ref_logits.grad.float(), rtol=1e-5, atol=1e-6)
    assert logits.grad[target.eq(0)].abs().max() == 0


def reference_grads(states, weight, target, eps, scale, dtype=None):
    """Project, then `label_smoothed_loss`, under autocast `dtype` if given: (loss, nll, d states, d weight)."""
    h, w = states.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss, nll = label_smoothed_loss(h @ w.t(), target, eps)
    (loss * scale).backward()
    return loss, nll, h.grad, w.grad


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])  # one row, partial last chunk, several, all rows in one
def test_projected_loss_equals_projecting_then_the_loss(eps, chunk):
    torch.manual_seed(0)
    states = (torch.randn(50, 16) * 2).requires_grad_()
    weight = (torch.randn(30, 16) * 0.5).requires_grad_()
    target = torch.randint(1, 30, (50,))
    target[[3, 17, 49]] = 0  # <pad>: no loss, no gradient
    scale = 0.37
    loss, nll = projected_label_smoothed_loss(states, weight, target, eps, chunk)
    (loss * scale).backward()
    ref_loss, ref_nll, ref_dh, ref_dw = reference_grads(states, weight, target, eps, scale)
    assert not nll.requires_grad
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-5)
    torch.testing.assert_close(states.grad, ref_dh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(weight.grad, ref_dw, rtol=1e-4, atol=1e-6)
    assert states.grad[target.eq(0)].abs().max() == 0


def test_projected_loss_under_bf16_autocast():
    """Matmuls in bf16 as autocast would run them, softmax in fp32, gradients in the inputs' dtypes."""
    torch.manual_seed(0)
    states, weight = torch.randn(40, 16).requires_grad_(), (torch.randn(30, 16) * 0.5).requires_grad_()
    target = torch.randint(1, 30, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = projected_label_smoothed_loss(states, weight, target, 0.1, 16)
    loss.backward()
    ref_loss, _, ref_dh, ref_dw = reference_grads(states, weight, target, 0.1, 1.0, torch.bfloat16)
    assert loss.dtype == torch.float32 and states.grad.dtype == weight.grad.dtype == torch.float32
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-3)
    torch.testing.assert_close(states.grad, ref_dh, rtol=0.05, atol=0.02)
    torch.testing.assert_close(weight.grad, ref_dw, rtol=0.05, atol=0.02)


def test_projected_loss_without_gradients_gives_the_same_sums():
    torch.manual_seed(0)
    states, weight = torch.randn(20, 8, requires_grad=True), torch.randn(12, 8, requires_grad=True)
    target = torch.randint(0, 12, (20,))
    with torch.no_grad():
        loss, nll = projected_label_smoothed_loss(states, weight, target, 0.1, 6)
    ref_loss, ref_nll = label_smoothed_loss(states @ weight.t(), target, 0.1)
    assert not loss.requires_grad
    assert (loss.item(), nll.item()) == pytest.approx((ref_loss.item(), ref_nll.item()), rel=1e-5)


def rdrop_by_autograd(h1, h2, weight, target, eps, alpha, mm_dtype=torch.float32):
    """R-Drop's loss written out from the full logits (autograd differentiates it): the reference for the fused one."""
    with torch.autocast("cpu", dtype=mm_dtype, enabled=mm_dtype != torch.float32):
        z1, z2 = h1 @ weight.t(), h2 @ weight.t()
    keep = target.ne(0)
    l1, l2 = z1.float().log_softmax(-1), z2.float().log_softmax(-1)
    ce = [(1 - eps) * -lp.gather(1, target.unsqueeze(1)).squeeze(1) - eps * lp.mean(-1) for lp in (l1, l2)]
    kl = (torch.nn.functional.kl_div(l2, l1, log_target=True, reduction="none")
          + torch.nn.functional.kl_div(l1, l2, log_target=True, reduction="none")).sum(-1)  # fmt: skip
    nll = -(l1.gather(1, target.unsqueeze(1)) + l2.gather(1, target.unsqueeze(1))).squeeze(1) / 2
    loss = ((ce[0] + ce[1]) / 2 + alpha * kl / 4).masked_fill(~keep, 0.0).sum()
    return loss, nll.masked_fill(~keep, 0.0).sum()


@pytest.mark.parametrize("eps,alpha", [(0.1, 3.0), (0.0, 5.0), (0.1, 0.0)])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_projected_rdrop_equals_its_loss_from_the_full_logits(eps, alpha, chunk):
    """The fused R-Drop loss (`train.rdrop_alpha`) and its hand-written gradients: the loss written out from the
    two passes' logits, differentiated by autograd, for both passes' states and the output weights."""
    torch.manual_seed(0)
    h1 = (torch.randn(50, 16) * 2).requires_grad_()
    h2 = (h1.detach() + torch.randn(50, 16) * 0.5).requires_grad_()  # the second dropout pass: near the first
    weight = (torch.randn(30, 16) * 0.5).requires_grad_()
    target = torch.randint(1, 30, (50,))
    target[[3, 17, 49]] = 0  # <pad>: no loss, no gradient
    loss, nll = projected_rdrop_loss(h1, h2, weight, target, eps, alpha, chunk)
    got = torch.autograd.grad(loss * 0.37, (h1, h2, weight))
    ref_loss, ref_nll = rdrop_by_autograd(h1, h2, weight, target, eps, alpha)
    want = torch.autograd.grad(ref_loss * 0.37, (h1, h2, weight))
    assert not nll.requires_grad
    assert (loss.item(), nll.item()) == pytest.approx((ref_loss.item(), ref_nll.item()), rel=1e-5)
    for name, a, b in zip(("h1", "h2", "weight"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    assert got[0][target.eq(0)].abs().max() == 0 == got[1][target.eq(0)].abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_projected_rdrop_under_autocast(dtype):
    """Matmuls in the autocast dtype, the softmax and KL in fp32, gradients in the inputs' dtypes (fp16: formed in
    fp32, as the plain loss's)."""
    torch.manual_seed(0)
    h1 = torch.randn(40, 16).requires_grad_()
    h2 = (h1.detach() + torch.randn(40, 16) * 0.5).requires_grad_()
    weight = (torch.randn(30, 16) * 0.5).requires_grad_()
    target = torch.randint(1, 30, (40,))
    with torch.autocast("cpu", dtype=dtype):
        loss, _ = projected_rdrop_loss(h1, h2, weight, target, 0.1, 3.0, 16)
    got = torch.autograd.grad(loss, (h1, h2, weight))
    ref_loss, _ = rdrop_by_autograd(h1, h2, weight, target, 0.1, 3.0, dtype)
    want = torch.autograd.grad(ref_loss, (h1, h2, weight))
    assert loss.dtype == torch.float32 and all(g.dtype == torch.float32 for g in got)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=2e-3)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.02)


@pytest.mark.parametrize("skip_padding", [True, False], ids=["cpu-rows-selected", "cuda-padding-masked"])
def test_model_loss_matches_its_logits_and_trains_the_tied_weights(skip_padding, monkeypatch):
    """`Transformer.loss` (fused) == `label_smoothed_loss` on `forward`'s logits, with the same gradient for every
    parameter, the tied embedding/output matrix included; both with padding rows dropped before the output layer
    (the CPU's way) and kept but masked in the loss (CUDA's way, no boolean indexing)."""
    monkeypatch.setattr("mt.model.transformer.skips_padding_rows", lambda device: skip_padding)
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), 40, 40)
    src = torch.randint(4, 40, (3, 7))
    src_pad = torch.zeros(3, 7, dtype=torch.bool)
    src_pad[1, 5:] = True
    tgt = torch.randint(4, 40, (3, 6))
    tgt[2, 4:] = 0
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]

    loss, nll = model.loss(src, src_pad, tgt_in, tgt_out, 0.1)
    loss.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    wanted = tgt_out.ne(0)
    ref_loss, ref_nll = label_smoothed_loss(model(src, src_pad, tgt_in, wanted), tgt_out[wanted], 0.1)
    ref_loss.backward()
    assert (loss.item(), nll.item()) == pytest.approx((ref_loss.item(), ref_nll.item()), rel=1e-5)
    assert model.output.weight is model.tgt_embed.tokens.weight
    for n, p in model.named_parameters():
        torch.testing.assert_close(fused[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
