"""int8 weights for CPU decoding (`decode.quantize=int8`), behind the model's own interface."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from mt.model.transformer import Transformer


def quantize_int8(model: Transformer) -> Transformer:
    """A copy of `model` for CPU decoding with int8 weights in every nn.Linear, the output projection included.

    Dynamic quantization: weights int8 per tensor, activations quantized per call (so a sentence's output can depend
    on the rest of its batch), int32 accumulation. Embeddings, LayerNorms and attention scores stay fp32; the tied
    output projection gets its own int8 copy. CPU only.
    """
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        # torch deprecates the quantized tensor API in favour of torchao; it is still the CPU int8 kernel in 2.13.
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(model).cpu().eval(), {nn.Linear}, dtype=torch.qint8)


def is_int8(model: torch.nn.Module) -> bool:
    """Whether `model` is already a `quantize_int8` copy."""
    from torch.ao.nn.quantized.dynamic import Linear

    return any(isinstance(m, Linear) for m in model.modules())
