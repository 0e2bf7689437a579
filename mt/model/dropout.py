"""A CPU dropout kernel behind `nn.Dropout`'s interface: the model's speed path for training on the CPU."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mt import runtime


class Dropout(nn.Dropout):
    """nn.Dropout with a cheaper mask on the CPU; CUDA and eval use the standard kernel.

    torch's CPU `bernoulli_` draws one random number per element; eight random bits per element, cut from 64-bit
    draws, cost a fraction of that (benchmarks/RESULTS.md). The drop probability is rounded to a multiple of 1/256
    (0.3 -> 0.3008). Same global RNG, so resuming stays exact.
    """

    def forward(self, x: Tensor) -> Tensor:
        # CUDA has its own fused kernel, and so has a compiled graph (which this one's in-place draw would break)
        if not self.training or self.p == 0 or runtime.on_cuda(x.device) or torch.compiler.is_compiling():
            return super().forward(x)
        threshold = round(self.p * 256)
        if threshold in (0, 256):  # p within 1/512 of 0 or 1: eight bits cannot express it, the exact kernel can
            return super().forward(x)
        n_words = -(-x.numel() // 8)
        bits = torch.empty(n_words, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        drop = bits.view(torch.uint8)[: x.numel()].view(x.shape) < threshold
        return x.masked_fill(drop, 0.0) * (256 / (256 - threshold))
