"""Learning-rate schedules as pure functions of the update number, and the run's budget they may follow.

Every schedule returns the learning rate itself (the optimizer's base lr is 1). `train.cooldown` multiplies any of
them by a linear fall to 0 over the last fraction of the budget (warmup-stable-decay).
"""

from __future__ import annotations

import math
import time

from mt.config import TrainConfig


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """5.3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for step >= 1."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt_lr(step: int, peak: float, warmup: int, init: float = 1e-7) -> float:
    """fairseq's inverse_sqrt: linear warmup from `init` to `peak`, then peak * sqrt(warmup / step)."""
    step = max(step, 1)
    if step < warmup:
        return init + (peak - init) * step / warmup
    return peak * math.sqrt(warmup / step)


def linear_lr(step: int, peak: float, warmup: int, budget_used: float) -> float:
    """Linear warmup to `peak`, times a linear decay to 0 when the budget (0..1 spent) is used up, so that a
    time-limited run ends at lr 0 whatever speed the machine has."""
    return peak * min(1.0, max(step, 1) / warmup) * max(0.0, 1.0 - budget_used)


def constant_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warmup to `peak` over `warmup` updates (none if 0), then `peak` (fairseq's "fixed" with warmup)."""
    return peak * min(1.0, max(step, 1) / warmup) if warmup > 0 else peak


def cooldown_factor(budget_used: float, cooldown: float) -> float:
    """1 until the last `cooldown` fraction of the budget, then linear down to 0 at its end."""
    if cooldown <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - budget_used) / cooldown))


def lr_at(step: int, cfg: TrainConfig, d_model: int, budget_used: float = 0.0) -> float:
    """The learning rate of update `step` (1-based) under `train.schedule` and `train.cooldown`."""
    if cfg.schedule == "noam":
        lr = noam_lr(step, d_model, cfg.warmup, cfg.noam_scale)
    elif cfg.schedule == "inverse_sqrt":
        lr = inverse_sqrt_lr(step, cfg.lr, cfg.warmup, cfg.warmup_init_lr)
    elif cfg.schedule == "linear":
        lr = linear_lr(step, cfg.lr, cfg.warmup, budget_used)
    else:
        lr = constant_lr(step, cfg.lr, cfg.warmup)
    return lr * cooldown_factor(budget_used, cfg.cooldown)


class Budget:
    """The run's budget, `max_updates` and/or `max_time` minutes of wall-clock, counted over resumed stretches."""

    def __init__(self, max_updates: int, max_time_min: float):
        self.max_updates, self.max_seconds = max_updates, max_time_min * 60
        self.elapsed = 0.0  # seconds of earlier stretches (restored on resume)
        self.clock_start = time.time()  # start of the stretch not yet added to `elapsed`

    def seconds(self) -> float:
        """Wall-clock seconds spent so far, over all stretches."""
        return self.elapsed + time.time() - self.clock_start

    def bank(self) -> None:
        """Add the current stretch to `elapsed` (before a checkpoint records it)."""
        self.elapsed, self.clock_start = self.seconds(), time.time()

    def used(self, update: int, seconds: float | None = None) -> float:
        """Fraction spent: of max_updates or of max_time, whichever is further along (0 without a budget).
        `seconds`: the clock's reading to use (under DDP the ranks' agreed one), default now."""
        used = update / self.max_updates if self.max_updates else 0.0
        if self.max_seconds:
            used = max(used, (self.seconds() if seconds is None else seconds) / self.max_seconds)
        return min(used, 1.0)

    def reached(self, update: int, seconds: float | None = None) -> str | None:
        if self.max_updates and update >= self.max_updates:
            return "max_updates"
        if self.max_seconds and (self.seconds() if seconds is None else seconds) >= self.max_seconds:
            return "max_time"
        return None
