"""The CPU dropout kernel (mt/model/dropout.py) against what dropout must do."""

import pytest
import torch

from mt.model.dropout import Dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_drops_at_the_rate_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    x = torch.rand(400, 1000) + 0.5  # no zeros of its own
    y = Dropout(p).train()(x)
    dropped = (y == 0).float().mean().item()
    assert dropped == pytest.approx(round(p * 256) / 256, abs=0.005)  # p rounded to a multiple of 1/256
    kept = y != 0
    scale = 256 / (256 - round(p * 256))
    torch.testing.assert_close(y[kept], x[kept] * scale)  # survivors scaled so that E[y] = x
    assert y.mean().item() == pytest.approx(x.mean().item(), rel=0.01)


def test_eval_and_p_zero_are_the_identity():
    x = torch.randn(50, 60)
    assert torch.equal(Dropout(0.3).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)


@pytest.mark.parametrize("p", [0.999, 0.001])
def test_p_near_0_or_1_uses_the_exact_kernel(p):
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = Dropout(p).train()(x)
    assert torch.isfinite(y).all()
    assert (y == 0).float().mean().item() == pytest.approx(p, abs=0.0003)


def test_the_mask_comes_from_the_global_rng():
    x = torch.ones(64, 64)
    torch.manual_seed(5)
    a = Dropout(0.3).train()(x)
    torch.manual_seed(5)
    b = Dropout(0.3).train()(x)
    assert torch.equal(a, b) and not torch.equal(a, Dropout(0.3).train()(x))
