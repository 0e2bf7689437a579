"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017), section numbers refer to the paper.

Shape legend: B batch, S source length, T target length (t: new target positions in a cached step),
D d_model, H heads, Dh = D / H, F d_ff, V vocabulary.

The interface used by training and search is narrow: `encode(src, src_pad_mask) -> memory` and
`decode(tgt_in, memory, src_pad_mask, cache=None) -> logits`. Masks are boolean and True at padding.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mt.config import ModelConfig
from mt.loss import projected_label_smoothed_loss
from mt.tokenizer import PAD


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """3.5: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)). Returns (P, D)."""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq[: d_model // 2])
    return pe.float()


class Dropout(nn.Dropout):
    """nn.Dropout with a cheaper mask on the CPU.

    torch's CPU `bernoulli_` draws one random number per element and took 12-14% of a training step here
    (profiled on the small model); eight random bits per element, cut from 64-bit draws, are ~6x cheaper. The
    drop probability is then rounded to a multiple of 1/256 (0.3 -> 0.3008). Same global RNG, so resuming stays
    exact. Elsewhere (CUDA) the standard kernel is already fast and is used as is.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0 or x.device.type != "cpu":
            return super().forward(x)
        threshold = round(self.p * 256)
        n_words = -(-x.numel() // 8)
        bits = torch.empty(n_words, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        drop = bits.view(torch.uint8)[: x.numel()].view(x.shape) < threshold
        return x.masked_fill(drop, 0.0) * (256 / (256 - threshold))


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(D) (3.4) plus positional encoding (3.5), then dropout (5.4)."""

    def __init__(self, tokens: nn.Embedding, max_positions: int, learned: bool, dropout: float):
        super().__init__()
        self.tokens = tokens  # may be shared with the other side and the output projection
        d_model = tokens.embedding_dim
        self.scale = math.sqrt(d_model)
        if learned:
            self.positions = nn.Parameter(torch.randn(max_positions, d_model) * d_model**-0.5)
        else:
            self.register_buffer("positions", sinusoidal_positions(max_positions, d_model), persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        T = ids.size(1)
        if offset + T > self.positions.size(0):
            raise ValueError(f"sequence of {offset + T} positions exceeds model.max_positions={self.positions.size(0)}")
        x = self.tokens(ids) * self.scale + self.positions[offset : offset + T]  # (B, T, D)
        return self.dropout(x)


def attend_mask(src_pad_mask: Tensor) -> Tensor:
    """(B, S) True-at-padding -> (B, 1, 1, S) True where attention is allowed, broadcast over heads and queries."""
    return ~src_pad_mask[:, None, None, :]


def causal_mask(T: int, S: int, device: torch.device | None = None) -> Tensor:
    """(T, S) True where query i may attend to key j: j <= i + S - T (3.2.3: no look-ahead). The last T of S
    positions are the queries; S > T when earlier positions come from a decoding cache."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)


class Attention(nn.Module):
    """Multi-head scaled dot-product attention (3.2). Self-attention fuses the Q/K/V projections in one matmul;
    cross-attention projects Q from the decoder and K/V (fused) from the encoder output."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, cross: bool):
        super().__init__()
        self.n_heads, self.d_head, self.cross, self.dropout = n_heads, d_model // n_heads, cross, dropout
        if cross:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.keep_weights = False  # set to record attention probabilities (for plots), at the cost of SDPA
        self.weights: Tensor | None = None

    def split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder output: computed once per sentence when decoding."""
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        # Contiguous once here, rather than copied by every decoding step's matmul.
        return self.split_heads(k).contiguous(), self.split_heads(v).contiguous()  # (B, H, S, Dh) each

    def merge_heads(self, out: Tensor) -> Tensor:
        B, H, T, Dh = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, T, H * Dh))  # (B, T, D)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """q (B, H, T, Dh), k/v (B, H, S, Dh), mask broadcastable to (B, H, T, S), True = may attend.
        Returns the per-head outputs (B, H, T, Dh)."""
        p = self.dropout if self.training else 0.0
        if q.size(2) <= 16 and not causal and not self.training and not self.keep_weights:
            # A few queries per sentence (a decoding step): two small batched matmuls. The CPU SDPA kernel costs
            # ~10x more here (profiled: 17% of beam search time), being tuned for long query blocks.
            scores = (q @ k.transpose(-2, -1)) * self.d_head**-0.5  # (B, H, T, S)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            return scores.softmax(-1) @ v
        if self.keep_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, T, S)
            if causal:
                scores = scores.masked_fill(~causal_mask(q.size(2), k.size(2), q.device), float("-inf"))
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            self.weights = scores.softmax(-1)
            return F.dropout(self.weights, p, self.training) @ v
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)

    def forward_self(self, x: Tensor, mask: Tensor | None, causal: bool, cache: dict | None = None) -> Tensor:
        q, k, v = (self.split_heads(t) for t in self.qkv_proj(x).chunk(3, dim=-1))
        if cache is not None:  # incremental decoding: this step's keys/values after the earlier ones
            k, v = append_kv(cache, k, v)
            # One new position may attend to everything cached; several new ones need the offset causal mask.
            causal = causal and q.size(2) > 1
            if causal and k.size(2) != q.size(2):
                mask, causal = causal_mask(q.size(2), k.size(2), x.device), False
        return self.merge_heads(self.attend(q, k, v, mask, causal))

    def forward_cross(self, x: Tensor, memory: Tensor, mask: Tensor, cache: dict | None = None) -> Tensor:
        """x (N, T, D) decoder states, memory (B, S, D) with N a multiple of B: in beam search the N = B*K rows
        are K beams per sentence (sentence-major), and all K read one copy of their sentence's encoder output."""
        if cache is not None and "mem_k" in cache:
            k, v = cache["mem_k"], cache["mem_v"]
        else:
            k, v = self.project_kv(memory)
            if cache is not None:
                cache["mem_k"], cache["mem_v"] = k, v
        q = self.split_heads(self.q_proj(x))  # (N, H, T, Dh)
        N, H, T, Dh = q.shape
        B = k.size(0)
        if N == B:
            return self.merge_heads(self.attend(q, k, v, mask, causal=False))
        # The K beams' queries of a sentence become K*T queries against its keys: one (K*T x S) product per
        # sentence and head instead of K, and the encoder keys/values are stored and read once, not K times.
        K = N // B
        q = q.view(B, K, H, T, Dh).transpose(1, 2).reshape(B, H, K * T, Dh)
        out = self.attend(q, k, v, mask, causal=False).view(B, H, K, T, Dh).transpose(1, 2)  # (B, K, H, T, Dh)
        return self.merge_heads(out.reshape(N, H, T, Dh))


class FeedForward(nn.Module):
    """3.3: FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


class Sublayer(nn.Module):
    """Residual connection around a sublayer with LayerNorm, post-norm (paper, 5.4) or pre-norm."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm, self.dropout, self.pre_norm = nn.LayerNorm(d_model), Dropout(dropout), pre_norm

    def forward(self, x: Tensor, fn) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, cross=False)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.sub_attn, self.sub_ffn = Sublayer(cfg.d_model, cfg.dropout, pre), Sublayer(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, attend: Tensor) -> Tensor:
        x = self.sub_attn(x, lambda h: self.self_attn.forward_self(h, attend, causal=False))
        return self.sub_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, cross=False)
        self.cross_attn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, cross=True)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.sub_self, self.sub_cross, self.sub_ffn = (Sublayer(cfg.d_model, cfg.dropout, pre) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor, attend: Tensor, cache: dict | None) -> Tensor:
        x = self.sub_self(x, lambda h: self.self_attn.forward_self(h, None, causal=True, cache=cache))
        x = self.sub_cross(x, lambda h: self.cross_attn.forward_cross(h, memory, attend, cache))
        return self.sub_ffn(x, self.ffn)


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
    `append_kv`), and the cross-attention keys/values of the encoder output (one row per encoder row; computed
    on the first step)."""

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


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int):
        super().__init__()
        self.cfg, self.src_vocab, self.tgt_vocab = cfg, src_vocab, tgt_vocab
        if cfg.tie_embeddings == "all" and src_vocab != tgt_vocab:
            raise ValueError("model.tie_embeddings=all needs one joint vocabulary (source and target sizes differ)")
        learned = cfg.positions == "learned"
        tgt_tokens = nn.Embedding(tgt_vocab, cfg.d_model, padding_idx=PAD)
        src_tokens = (
            tgt_tokens if cfg.tie_embeddings == "all" else nn.Embedding(src_vocab, cfg.d_model, padding_idx=PAD)
        )
        self.src_embed = Embedding(src_tokens, cfg.max_positions, learned, cfg.dropout)
        self.tgt_embed = Embedding(tgt_tokens, cfg.max_positions, learned, cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"
        # Pre-norm leaves the residual stream unnormalized, so each stack ends with a LayerNorm.
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.output = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings in ("all", "decoder"):
            self.output.weight = tgt_tokens.weight  # 3.4: one matrix for embeddings and pre-softmax projection

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
        # Embeddings ~ N(0, 1/D): multiplied by sqrt(D) (3.4) they enter the residual stream at unit scale,
        # the same scale as the positional encoding, and as the tied output projection they give unit-scale logits.
        for emb in {id(m): m for m in (self.src_embed.tokens, self.tgt_embed.tokens)}.values():
            nn.init.normal_(emb.weight, 0.0, self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD].zero_()

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Tensor:
        """src (B, S) ids -> memory (B, S, D)."""
        x, attend = self.src_embed(src), attend_mask(src_pad_mask)
        for layer in self.encoder:
            x = layer(x, attend)
        return self.encoder_norm(x)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor,
        cache: DecoderCache | None = None,
        wanted: Tensor | None = None,
    ) -> Tensor:
        """tgt_in (N, T) ids -> logits (N, T, V). With a cache, `tgt_in` holds only the new positions. `memory` and
        `src_pad_mask` have B rows, N a multiple of B: N = B*K decoder rows are K hypotheses per sentence.
        `wanted` (N, T) bool: logits only at those positions, (n_wanted, V), row-major order."""
        return self.output(self.decoder_states(tgt_in, memory, src_pad_mask, cache, wanted))

    def decoder_states(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor,
        cache: DecoderCache | None = None,
        wanted: Tensor | None = None,
    ) -> Tensor:
        """`decode` up to the output projection: the final decoder states (N, T, D), or (n_wanted, D)."""
        offset = cache.length if cache is not None else 0
        x, attend = self.tgt_embed(tgt_in, offset), attend_mask(src_pad_mask)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, attend, cache.layers[i] if cache is not None else None)
        if cache is not None:
            cache.length += tgt_in.size(1)
        if wanted is not None:
            x = x[wanted]  # skip the vocabulary projection (and the loss) at padding positions
        return self.decoder_norm(x)

    def new_cache(self) -> DecoderCache:
        return DecoderCache(len(self.decoder))

    def forward(self, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor, wanted: Tensor | None = None) -> Tensor:
        """Teacher forcing: logits (B, T, V) for every target position at once, or (n, V) for the `wanted` ones
        (training passes the non-padding targets)."""
        return self.decode(tgt_in, self.encode(src, src_pad_mask), src_pad_mask, wanted=wanted)

    def loss(
        self, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor, tgt_out: Tensor, label_smoothing: float
    ) -> tuple[Tensor, Tensor]:
        """Teacher-forced training loss: summed label-smoothed cross-entropy and summed NLL over the non-padding
        `tgt_out` (B, T). The output projection is fused with the loss (`mt.loss`), so the logits never exist in
        full."""
        wanted = tgt_out.ne(PAD)
        states = self.decoder_states(tgt_in, self.encode(src, src_pad_mask), src_pad_mask, wanted=wanted)
        return projected_label_smoothed_loss(states, self.output.weight, tgt_out[wanted], label_smoothing)

    def config_dict(self) -> dict:
        return {"model": asdict(self.cfg), "src_vocab": self.src_vocab, "tgt_vocab": self.tgt_vocab}

    @classmethod
    def from_config_dict(cls, d: dict) -> Transformer:
        return cls(ModelConfig(**d["model"]), d["src_vocab"], d["tgt_vocab"])


def quantize_int8(model: Transformer) -> Transformer:
    """A copy of `model` for CPU decoding with int8 weights in every nn.Linear, the output projection included.

    Dynamic quantization (weights int8 per tensor, activations quantized per call, int32 accumulation, fbgemm
    kernels using AVX-512 VNNI where present). Embeddings, LayerNorms and attention scores stay fp32. The tied output
    projection gets its own int8 copy; the embeddings keep the fp32 matrix. CPU only.
    """
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        # torch deprecates the quantized tensor API in favour of torchao; it is still the CPU int8 kernel in 2.13.
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(model).cpu().eval(), {nn.Linear}, dtype=torch.qint8)
