"""An exponential moving average of the weights (Marian's --exponential-smoothing, fairseq's --ema-decay,
OpenNMT's -average_decay): the raw weights train, the average is what is validated and kept.

After each update, ema <- d * ema + (1 - d) * weights with a decay warmed up as in TensorFlow's
ExponentialMovingAverage, d = min(decay, (1 + t) / (10 + t)), t = the updates averaged before this one, so the
first updates' near-random weights fade quickly. The average starts as the weights after the first update. It lives
in torch's AveragedModel: a copy of the model in fp32 on the training device.
"""

from __future__ import annotations

import torch
from torch.optim.swa_utils import AveragedModel

from mt.model import Transformer


def warmed_decay(decay: float, t: int) -> float:
    """The decay used for the update after `t` averaged ones."""
    return min(decay, (1 + t) / (10 + t))


def _ema_step(decay: float):
    @torch.no_grad()
    def step(averages: list[torch.Tensor], weights: list[torch.Tensor], n_averaged: torch.Tensor) -> None:
        torch._foreach_lerp_(averages, weights, 1.0 - warmed_decay(decay, int(n_averaged)))

    return step


class WeightEMA:
    """The moving average of `model`'s parameters; `update(model)` after each optimizer step."""

    def __init__(self, model: Transformer, decay: float):
        if any(p.dtype != torch.float32 for p in model.parameters()):
            raise ValueError("the weight average is kept in fp32; train with fp32 parameters (autocast keeps them)")
        self.decay = decay
        self.averaged = AveragedModel(model, multi_avg_fn=_ema_step(decay))

    @property
    def model(self) -> Transformer:
        """A Transformer holding the averaged weights (decode or validate it; do not train it)."""
        return self.averaged.module

    @property
    def updates(self) -> int:
        return int(self.averaged.n_averaged)

    def update(self, model: Transformer) -> None:
        self.averaged.update_parameters(model)

    def load(self, weights: dict, updates: int) -> None:
        """Restore from a checkpoint: the averaged weights and how many updates they average."""
        self.model.load_state_dict(weights)
        self.averaged.n_averaged.fill_(updates)
