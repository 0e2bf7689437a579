"""An exponential moving average of the weights (Marian's --exponential-smoothing, fairseq's --ema-decay,
OpenNMT's -average_decay): the raw weights train, the average is what is validated and kept.

After each update, ema <- d * ema + (1 - d) * weights with a decay warmed up as in TensorFlow's
ExponentialMovingAverage, d = min(decay, (1 + t) / (10 + t)), t = the updates averaged before this one, so the
first updates' near-random weights fade quickly. The average starts as the weights after the first update. It is
a copy of the model in fp32 on the training device; the count t lives on the host, so an update never waits for
the GPU (torch's AveragedModel keeps it on the device and reads it back at every update).
"""

from __future__ import annotations

import copy

import torch

from mt.model.transformer import Transformer


def warmed_decay(decay: float, t: int) -> float:
    """The decay used for the update after `t` averaged ones."""
    return min(decay, (1 + t) / (10 + t))


class WeightEMA:
    """The moving average of `model`'s parameters; `update(model)` after each optimizer step."""

    def __init__(self, model: Transformer, decay: float):
        if any(p.dtype != torch.float32 for p in model.parameters()):
            raise ValueError("the weight average is kept in fp32; train with fp32 parameters (autocast keeps them)")
        self.decay, self.updates = decay, 0
        self.model: Transformer = copy.deepcopy(model).requires_grad_(False)  # decode or validate it; never train it

    @torch.no_grad()
    def update(self, model: Transformer) -> None:
        averages, weights = list(self.model.parameters()), list(model.parameters())
        if self.updates == 0:
            torch._foreach_copy_(averages, weights)
        else:
            torch._foreach_lerp_(averages, weights, 1.0 - warmed_decay(self.decay, self.updates))
        self.updates += 1

    def load(self, weights: dict, updates: int) -> None:
        """Restore from a checkpoint: the averaged weights and how many updates they average."""
        self.model.load_state_dict(weights)
        self.updates = updates
