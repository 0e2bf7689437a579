"""The training losses: label-smoothed cross-entropy from logits, and fused with the output projection."""

import pytest
import torch

from benchmarks.reference_loss import label_smoothed_loss
from mt.loss import projected_label_smoothed_loss
from mt.model import Transformer
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


@pytest.mark.parametrize("skip_padding", [True, False], ids=["cpu-rows-selected", "cuda-padding-masked"])
def test_model_loss_matches_its_logits_and_trains_the_tied_weights(skip_padding, monkeypatch):
    """`Transformer.loss` (fused) == `label_smoothed_loss` on `forward`'s logits, with the same gradient for every
    parameter, the tied embedding/output matrix included; both with padding rows dropped before the output layer
    (the CPU's way) and kept but masked in the loss (CUDA's way, no boolean indexing)."""
    monkeypatch.setattr("mt.model.skips_padding_rows", lambda device: skip_padding)
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
