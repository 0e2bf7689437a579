"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017), section numbers refer to the paper.

Shape legend: B batch, S source length, T target length (t: new target positions in a cached step),
D d_model, H heads, Dh = D / H, F d_ff, V vocabulary.

The interface used by training and search is narrow: `encode(src, src_pad_mask) -> memory` and
`decode(tgt_in, memory, src_pad_mask, cache=None) -> logits`. Masks: a `pad_mask` is True at padding (what the
batches carry); inside attention an `allow` mask is True where a query may attend. Speed paths live elsewhere,
behind the same interface, in modules beside this one: the CPU dropout kernel (dropout.py), the decoding cache
(cache.py), few-query and beam-shared attention (fast_attention.py), int8 weights (quantize.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import mt.model.loss as fused_loss
from mt import runtime
from mt.config import ModelConfig
from mt.data.tokenizer import Specials
from mt.model import fast_attention
from mt.model.cache import DecoderCache, append_kv
from mt.model.dropout import Dropout


def sinusoidal_positions(n_positions: int, d_model: int, layout: str = "paper") -> Tensor:
    """3.5: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)). Returns (P, D).

    `layout` (model.sinusoids): "paper" interleaves sin and cos as above; "halves" puts the same sines in the first
    half and the cosines in the second (transformers' Marian); "fairseq" is fairseq's and tensor2tensor's table
    (M2M100, NLLB): halves too, with frequencies 10000^(-i / (D/2 - 1)), computed in float32 as they compute it."""
    if layout == "fairseq":
        half = d_model // 2
        freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))
        angles = torch.arange(n_positions, dtype=torch.int64).float().unsqueeze(1) * freq.unsqueeze(0)
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    if layout == "halves":  # Marian's own arithmetic: pos / 10000^(2i/D), in float64
        angles = pos / torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()
    inv_freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq[: d_model // 2])
    return pe.float()


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(D) (3.4) plus positional encoding (3.5), then dropout (5.4). A checkpoint of
    another toolkit may scale otherwise (`model.scale_embedding`) and start its positions at `model.position_offset`
    of its table (fairseq's sinusoids begin after the padding id)."""

    def __init__(self, tokens: nn.Embedding, cfg: ModelConfig, dropout: float):
        super().__init__()
        self.tokens = tokens  # may be shared with the other side and the output projection
        d_model = tokens.embedding_dim
        self.scale = math.sqrt(d_model) if cfg.scale_embedding else 1.0
        self.offset = cfg.position_offset
        n_positions = cfg.max_positions + cfg.position_offset
        if cfg.positions == "learned":
            self.positions = nn.Parameter(torch.randn(n_positions, d_model) * d_model**-0.5)
        else:
            table = sinusoidal_positions(n_positions, d_model, cfg.sinusoids)
            self.register_buffer("positions", table, persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        T, first = ids.size(1), offset + self.offset
        if first + T > self.positions.size(0):
            limit = self.positions.size(0) - self.offset
            raise ValueError(f"sequence of {offset + T} positions exceeds model.max_positions={limit}")
        x = self.tokens(ids) * self.scale + self.positions[first : first + T]  # (B, T, D)
        return self.dropout(x)


def allow_mask(pad_mask: Tensor) -> Tensor:
    """(B, S) True at padding -> (B, 1, 1, S) True where attention may go, broadcast over heads and queries."""
    return ~pad_mask[:, None, None, :]


def causal_mask(T: int, S: int, device: torch.device | None = None) -> Tensor:
    """(T, S) allow mask: True where query i may attend to key j: j <= i + S - T (3.2.3: no look-ahead). The last T of S
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

    def attend(self, q: Tensor, k: Tensor, v: Tensor, allow: Tensor | None, causal: bool) -> Tensor:
        """3.2.1: softmax(q k^T / sqrt(Dh)) v per head. q (B, H, T, Dh), k/v (B, H, S, Dh), `allow` broadcastable
        to (B, H, T, S). Returns the per-head outputs (B, H, T, Dh)."""
        p = self.dropout if self.training else 0.0
        if self.keep_weights:  # the probabilities themselves are wanted (attention plots)
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, T, S)
            if causal:
                scores = scores.masked_fill(~causal_mask(q.size(2), k.size(2), q.device), float("-inf"))
            if allow is not None:
                scores = scores.masked_fill(~allow, float("-inf"))
            self.weights = scores.softmax(-1)
            return F.dropout(self.weights, p, self.training) @ v
        if q.size(2) <= fast_attention.FEW_QUERIES and not causal and not self.training:
            return fast_attention.few_queries(q, k, v, allow)  # a decoding step
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allow, dropout_p=p, is_causal=causal)

    def forward_self(self, x: Tensor, allow: Tensor | None, causal: bool, cache: dict | None = None) -> Tensor:
        q, k, v = (self.split_heads(t) for t in self.qkv_proj(x).chunk(3, dim=-1))
        if cache is not None:  # incremental decoding: this step's keys/values after the earlier ones
            k, v = append_kv(cache, k, v)
            # One new position may attend to everything cached; several new ones need the offset causal mask.
            causal = causal and q.size(2) > 1
            if causal and k.size(2) != q.size(2):
                allow, causal = causal_mask(q.size(2), k.size(2), x.device), False
        return self.merge_heads(self.attend(q, k, v, allow, causal))

    def forward_cross(self, x: Tensor, memory: Tensor, allow: Tensor, cache: dict | None = None) -> Tensor:
        """x (N, T, D) decoder states, memory (B, S, D) with N a multiple of B (beam search: K beams per sentence)."""
        if cache is not None and "mem_k" in cache:
            k, v = cache["mem_k"], cache["mem_v"]
        else:
            k, v = self.project_kv(memory)
            if cache is not None:
                cache["mem_k"], cache["mem_v"] = k, v
        q = self.split_heads(self.q_proj(x))  # (N, H, T, Dh)
        if q.size(0) == k.size(0):
            return self.merge_heads(self.attend(q, k, v, allow, causal=False))
        return self.merge_heads(fast_attention.shared_memory_cross_attention(q, k, v, allow, self.attend))


ACTIVATIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}  # model.activation (Marian: swish = SiLU)


class FeedForward(nn.Module):
    """3.3: FFN(x) = max(0, x W1 + b1) W2 + b2 (the activation: `model.activation`, ReLU in the paper)."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float, activation: str = "relu"):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = Dropout(activation_dropout)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


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
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.activation)
        self.sub_attn, self.sub_ffn = Sublayer(cfg.d_model, cfg.dropout, pre), Sublayer(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, allow: Tensor) -> Tensor:
        x = self.sub_attn(x, lambda h: self.self_attn.forward_self(h, allow, causal=False))
        return self.sub_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, cross=False)
        self.cross_attn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, cross=True)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.activation)
        self.sub_self, self.sub_cross, self.sub_ffn = (Sublayer(cfg.d_model, cfg.dropout, pre) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor, allow: Tensor, cache: dict | None) -> Tensor:
        x = self.sub_self(x, lambda h: self.self_attn.forward_self(h, None, causal=True, cache=cache))
        x = self.sub_cross(x, lambda h: self.cross_attn.forward_cross(h, memory, allow, cache))
        return self.sub_ffn(x, self.ffn)


def skips_padding_rows(device: torch.device) -> bool:
    """The CPU drops padding positions before the output layer (their compute is the cost); CUDA keeps them, masked
    inside the loss, since selecting rows by a boolean mask would make the CPU wait for the GPU to count them."""
    return not runtime.on_cuda(device)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int):
        super().__init__()
        self.cfg, self.src_vocab, self.tgt_vocab = cfg, src_vocab, tgt_vocab
        if cfg.tie_embeddings in ("all", "inputs") and src_vocab != tgt_vocab:
            raise ValueError(f"model.tie_embeddings={cfg.tie_embeddings} needs one joint vocabulary (source and "
                             "target sizes differ)")  # fmt: skip
        self.specials = Specials.of(cfg)
        tgt_tokens = nn.Embedding(tgt_vocab, cfg.d_model, padding_idx=cfg.pad_id)
        src_tokens = (
            tgt_tokens
            if cfg.tie_embeddings in ("all", "inputs")  # inputs: one embedding matrix, the output its own
            else nn.Embedding(src_vocab, cfg.d_model, padding_idx=cfg.pad_id)
        )
        self.src_embed = Embedding(src_tokens, cfg, cfg.dropout)
        self.tgt_embed = Embedding(tgt_tokens, cfg, cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"
        # Pre-norm leaves the residual stream unnormalized, so each stack ends with a LayerNorm.
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.output = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        if cfg.output_bias:  # Marian's final_logits_bias: a buffer there too, which fine-tuning leaves as it is
            self.register_buffer("output_bias", torch.zeros(tgt_vocab))
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
                emb.weight[self.cfg.pad_id].zero_()
        if self.cfg.init == "fairseq":
            fairseq_init(self)

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Tensor:
        """src (B, S) ids -> memory (B, S, D)."""
        x, allow = self.src_embed(src), allow_mask(src_pad_mask)
        for layer in self.encoder:
            x = layer(x, allow)
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
        logits = self.output(self.decoder_states(tgt_in, memory, src_pad_mask, cache, wanted))
        shift = self.logit_shift()
        return logits if shift is None else logits + shift

    def logit_shift(self) -> Tensor | None:
        """(V,) added to the logits before any softmax, or None (the paper's model): the fixed output bias
        (`model.output_bias`), and -inf at <pad> with `model.mask_pad_logit` (a Marian checkpoint gives <pad> a
        trained logit, though no target is ever <pad>)."""
        if not (self.cfg.output_bias or self.cfg.mask_pad_logit):
            return None
        shift = self.output_bias.float() if self.cfg.output_bias else self.output.weight.new_zeros(self.tgt_vocab)
        if self.cfg.mask_pad_logit:
            shift = shift.index_fill(0, torch.tensor([self.cfg.pad_id], device=shift.device), -math.inf)
        return shift

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
        x, allow = self.tgt_embed(tgt_in, offset), allow_mask(src_pad_mask)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, allow, cache.layers[i] if cache is not None else None)
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
        `tgt_out` (B, T). The output projection is fused with the loss (`mt.model.loss`), so the logits never exist in
        full."""
        pad = self.cfg.pad_id
        wanted = tgt_out.ne(pad) if skips_padding_rows(tgt_out.device) else None
        states = self.decoder_states(tgt_in, self.encode(src, src_pad_mask), src_pad_mask, wanted=wanted)
        target = tgt_out[wanted] if wanted is not None else tgt_out
        return fused_loss.projected_label_smoothed_loss(
            states, self.output.weight, target, label_smoothing, pad=pad, shift=self.logit_shift()
        )

    def config_dict(self) -> dict:
        return {"model": asdict(self.cfg), "src_vocab": self.src_vocab, "tgt_vocab": self.tgt_vocab}

    @classmethod
    def from_config_dict(cls, d: dict) -> Transformer:
        return cls(ModelConfig(**d["model"]), d["src_vocab"], d["tgt_vocab"])


def fairseq_init(model: Transformer) -> None:
    """fairseq 0.12's initialization of its `transformer` architecture (`model.init=fairseq`, the replica of issue
    62), where it differs from `reset_parameters`: each of the D x D projections of Q, K and V xavier_uniform with
    gain 1/sqrt(2) (fused here: the same bound for self-attention, a smaller one for cross-attention's Q and K/V)
    with PyTorch's default biases, and both FFN layers PyTorch's default nn.Linear init (kaiming_uniform(a=sqrt(5)),
    bias uniform(+-1/sqrt(fan_in)); fairseq builds them as plain nn.Linear). Attention outputs (xavier_uniform, bias
    0), LayerNorms and embeddings (N(0, 1/D), <pad> zero) are initialized alike in both."""
    for module in model.modules():
        if isinstance(module, FeedForward):
            module.linear1.reset_parameters()
            module.linear2.reset_parameters()
        elif isinstance(module, Attention):
            d = module.out_proj.weight.size(0)
            for proj in (module.q_proj, module.kv_proj) if module.cross else (module.qkv_proj,):
                with torch.no_grad():
                    for block in proj.weight.split(d):  # Q, K, V: one D x D matrix each
                        nn.init.xavier_uniform_(block, gain=1 / math.sqrt(2))
                    nn.init.uniform_(proj.bias, -1 / math.sqrt(d), 1 / math.sqrt(d))
