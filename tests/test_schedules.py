"""Learning-rate schedules: pure functions of the update number and the budget spent."""

import pytest

from mt.train.schedules import constant_lr, cooldown_factor, inverse_sqrt_lr, linear_lr, noam_lr


def test_noam_schedule_values():
    # lr = d^-0.5 * min(step^-0.5, step * warmup^-1.5)
    assert noam_lr(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_lr(4000, 512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak, ~7.0e-4
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.9877e-4, rel=1e-4)
    assert noam_lr(16000, 512, 4000) == pytest.approx(512**-0.5 * 16000**-0.5)  # half the peak
    assert noam_lr(100, 512, 4000, scale=2.0) == pytest.approx(2 * 512**-0.5 * 100 * 4000**-1.5)


def test_inverse_sqrt_schedule_values():
    assert inverse_sqrt_lr(500, 1e-3, 1000, init=0.0) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(1000, 1e-3, 1000) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(4000, 1e-3, 1000) == pytest.approx(5e-4)


def test_linear_schedule_values():
    assert linear_lr(10, 1e-3, 20, budget_used=0.0) == pytest.approx(5e-4)  # halfway through warmup
    assert linear_lr(50, 1e-3, 20, budget_used=0.25) == pytest.approx(7.5e-4)
    assert linear_lr(90, 1e-3, 20, budget_used=1.0) == 0.0


def test_constant_schedule_values():
    assert constant_lr(10, 1e-3, 20) == pytest.approx(5e-4)  # halfway through warmup
    assert constant_lr(20, 1e-3, 20) == constant_lr(5000, 1e-3, 20) == pytest.approx(1e-3)
    assert constant_lr(1, 1e-3, 0) == pytest.approx(1e-3)  # no warmup


def test_cooldown_values():
    assert cooldown_factor(0.5, 0.0) == 1.0  # off
    assert cooldown_factor(0.7, 0.2) == 1.0  # before the last 20%
    assert cooldown_factor(0.9, 0.2) == pytest.approx(0.5)
    assert cooldown_factor(1.0, 0.2) == 0.0
