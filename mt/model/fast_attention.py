"""Attention speed paths for decoding, behind `Attention.attend`'s interface (see mt/model/transformer.py).

- `few_queries`: a decoding step has one query per sentence; two small batched matmuls beat the CPU SDPA
  kernel, which is tuned for long query blocks.
- `shared_memory_cross_attention`: in beam search the K beams of a sentence read one copy of its encoder keys and
  values, as K*T queries against them, instead of K copies.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

FEW_QUERIES = 16  # at most this many query positions take the matmul path


def few_queries(q: Tensor, k: Tensor, v: Tensor, allow: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(Dh)) v for q (B, H, T, Dh) with small T; `allow` True where attention may go."""
    scores = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5  # (B, H, T, S)
    if allow is not None:
        scores = scores.masked_fill(~allow, float("-inf"))
    return scores.softmax(-1) @ v


def shared_memory_cross_attention(
    q: Tensor, k: Tensor, v: Tensor, allow: Tensor, attend: Callable[..., Tensor]
) -> Tensor:
    """q (N, H, T, Dh) for N = B*K decoder rows (K beams per sentence, sentence-major), k/v (B, H, S, Dh).

    The K beams' queries of a sentence become K*T queries against its keys: one (K*T x S) product per sentence and
    head instead of K. Returns (N, H, T, Dh) like `attend(q, k, v, allow, causal=False)` on K copies of k/v."""
    N, H, T, Dh = q.shape
    B = k.size(0)
    K = N // B
    q = q.view(B, K, H, T, Dh).transpose(1, 2).reshape(B, H, K * T, Dh)
    out = attend(q, k, v, allow, causal=False).view(B, H, K, T, Dh).transpose(1, 2)  # (B, K, H, T, Dh)
    return out.reshape(N, H, T, Dh)
