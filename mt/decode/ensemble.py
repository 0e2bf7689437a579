"""Ensemble decoding: several models of one language pair searched as one (`translate.py checkpoint=[A,B,...]`).

At every step each model scores the next token from its own encoder output and its own KV cache; the ensemble's
scores are the mean of the models' log-probabilities (a product of experts, as OpenNMT-py and Marian combine them),
which the search renormalises like any model's logits. The ensemble has a model's decoding interface (`encode`,
`decode`, `new_cache`, `cfg.max_positions`), so greedy and beam search run it unchanged: its "memory" is the
models' encoder outputs side by side on the feature axis, and its cache holds one cache per model.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from mt.model.cache import DecoderCache
from mt.model.transformer import Transformer


class EnsembleCache:
    """One incremental-decoding cache per model, reordered together."""

    def __init__(self, caches: list[DecoderCache]):
        self.caches = caches

    def reorder(self, index: Tensor, memory_index: Tensor | None = None) -> None:
        for cache in self.caches:
            cache.reorder(index, memory_index)


class Ensemble(nn.Module):
    def __init__(self, models: list[Transformer]):
        super().__init__()
        self.members = nn.ModuleList(models)
        self.widths = [m.cfg.d_model for m in models]
        # Searches read max_positions (the output length cap): the smallest of the models'.
        self.cfg = replace(models[0].cfg, max_positions=min(m.cfg.max_positions for m in models))
        self.src_vocab, self.tgt_vocab = models[0].src_vocab, models[0].tgt_vocab

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Tensor:
        """(B, S, sum of the models' d_model): each model's encoder output, concatenated."""
        return torch.cat([m.encode(src, src_pad_mask) for m in self.members], dim=-1)

    def new_cache(self) -> EnsembleCache:
        return EnsembleCache([m.new_cache() for m in self.members])

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_pad_mask: Tensor, cache: EnsembleCache | None = None
    ) -> Tensor:
        """(N, T, V): the mean of the models' log-probabilities, in fp32."""
        memories = memory.split(self.widths, dim=-1)
        caches = cache.caches if cache is not None else [None] * len(self.members)
        logp = [
            m.decode(tgt_in, mem, src_pad_mask, c).float().log_softmax(dim=-1)
            for m, mem, c in zip(self.members, memories, caches)
        ]
        return logp[0] if len(logp) == 1 else torch.stack(logp).mean(dim=0)
