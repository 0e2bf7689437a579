"""The decoder's incremental-decoding cache (keys and values of earlier positions), used by search only.

Self-attention keys/values grow by one position per step; cross-attention keys/values of the encoder output are
computed on the first step and reused. Beam search reorders the cache's rows as hypotheses survive or end.
"""

from __future__ import annotations

import torch
from torch import Tensor


def append_kv(cache: dict, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Write a step's self-attention keys/values (N, H, t, Dh) after the cached ones and return all of them, as
    views of the cache's buffers (N, H, capacity, Dh). The buffers double when full, so a step writes its t
    positions instead of copying the whole history (as torch.cat would, in every layer at every step)."""
    n = cache.get("n", 0)
    end = n + k.size(2)
    if "k" not in cache or end > cache["k"].size(2):
        for name, new in (("k", k), ("v", v)):
            buf = new.new_empty(new.size(0), new.size(1), max(16, 2 * end), new.size(3))
            if name in cache:
                buf[:, :, :n] = cache[name][:, :, :n]
            cache[name] = buf
            cache.pop(name + "_spare", None)  # DecoderCache.reorder's second buffer, now the wrong size
    cache["k"][:, :, n:end] = k
    cache["v"][:, :, n:end] = v
    cache["n"] = end
    return cache["k"][:, :, :end], cache["v"][:, :, :end]


class DecoderCache:
    """Per decoder layer: self-attention keys/values of the positions so far (one row per decoder row; see
    `append_kv`), and the cross-attention keys/values of the encoder output (one row per encoder row)."""

    def __init__(self, n_layers: int):
        self.layers: list[dict] = [{} for _ in range(n_layers)]
        self.length = 0  # target positions already in the cache

    def reorder(self, index: Tensor, memory_index: Tensor | None = None) -> None:
        """Select decoder rows `index` (beam search keeps the surviving hypotheses' histories) and, if given,
        encoder rows `memory_index` (sentences leaving the batch). When decoder and encoder rows are the same
        batch (one row per sentence), pass the same index twice."""
        for layer in self.layers:
            n = layer.get("n", 0)
            for key in ("k", "v") if n else ():
                # Only the filled positions, into a second buffer of the same capacity kept from the previous
                # reorder (a fresh one each step costs page faults), then the two swap roles.
                t, spare = layer[key], layer.get(key + "_spare")
                shape = (index.numel(),) + t.shape[1:]
                if spare is None or spare.shape != shape:
                    spare = t.new_empty(shape)
                torch.index_select(t[:, :, :n], 0, index, out=spare[:, :, :n])
                layer[key], layer[key + "_spare"] = spare, t
            if memory_index is not None and "mem_k" in layer:
                layer["mem_k"] = layer["mem_k"].index_select(0, memory_index)
                layer["mem_v"] = layer["mem_v"].index_select(0, memory_index)
