"""transformers' encoder-decoders as this project's model: the config keys and the weight names, one table for the
way in (mt/model/hub.py) and the way out (mt/export/hugging_face.py).

| transformers                         | model.* here                                                        |
|---|---|
| `MarianMTModel` (OPUS-MT)            | norm=post, sinusoids=halves, output_bias, mask_pad_logit,           |
|                                      | activation from the config (swish), decoder_start_id = <pad>        |
| `M2M100ForConditionalGeneration`     | norm=pre (final norms), sinusoids=fairseq, position_offset =        |
| (NLLB-200, M2M100)                   | pad + 1, activation relu, decoder_start_id = </s>                   |
| `PegasusForConditionalGeneration`    | norm=pre (final norms), sinusoids=halves (this project's pre-norm   |
|                                      | export)                                                             |

Both name their weights as BART does (`model.encoder.layers.{i}.self_attn.q_proj.weight`, ...); this model fuses the
self-attention's Q, K and V (and cross-attention's K and V) into one matrix, so a name here may cover a block of
rows of one of ours. What these classes compute and this model cannot (an embedding LayerNorm, learned positions,
attention heads or FFN widths that differ between encoder and decoder) is refused in one line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from mt.config import ModelConfig
from mt.errors import CheckpointError

ARCHITECTURES = {"marian": "MarianMTModel", "m2m_100": "M2M100ForConditionalGeneration",
                 "pegasus": "PegasusForConditionalGeneration"}  # fmt: skip
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}  # theirs -> model.activation


@dataclass(frozen=True)
class Weight:
    """One tensor: its name here, its name in transformers, which block of rows of ours it is (Q/K/V of a fused
    projection; None: all), and the axis that indexes the residual stream's features (None: neither)."""

    ours: str
    theirs: str
    block: int | None = None
    features: int | None = None


def _linear(ours: str, theirs: str, block: int | None, reads: bool) -> list[Weight]:
    """A linear layer that reads the residual stream (its weight's columns are features) or writes it (its weight's
    rows and its bias are)."""
    return [Weight(f"{ours}.weight", f"{theirs}.weight", block, 1 if reads else 0),
            Weight(f"{ours}.bias", f"{theirs}.bias", block, None if reads else 0)]  # fmt: skip


def _norm(ours: str, theirs: str) -> list[Weight]:
    return [Weight(f"{ours}.weight", f"{theirs}.weight", None, 0), Weight(f"{ours}.bias", f"{theirs}.bias", None, 0)]


def _attention(ours: str, theirs: str, cross: bool) -> list[Weight]:
    if cross:
        fused = _linear(f"{ours}.q_proj", f"{theirs}.q_proj", None, True)
        fused += _linear(f"{ours}.kv_proj", f"{theirs}.k_proj", 0, True) + _linear(
            f"{ours}.kv_proj", f"{theirs}.v_proj", 1, True
        )
    else:
        fused = [w for i, p in enumerate("qkv") for w in _linear(f"{ours}.qkv_proj", f"{theirs}.{p}_proj", i, True)]
    return fused + _linear(f"{ours}.out_proj", f"{theirs}.out_proj", None, False)


def weight_table(cfg: ModelConfig) -> list[Weight]:
    """Every weight of a model of `cfg` and its transformers name (BART's layout, shared by Marian, M2M100 and
    Pegasus). Tied matrices are listed under each of their names."""
    table: list[Weight] = []
    for i in range(cfg.encoder_layers):
        ours, theirs = f"encoder.{i}", f"model.encoder.layers.{i}"
        table += _attention(f"{ours}.self_attn", f"{theirs}.self_attn", cross=False)
        table += _norm(f"{ours}.sub_attn.norm", f"{theirs}.self_attn_layer_norm")
        table += _linear(f"{ours}.ffn.linear1", f"{theirs}.fc1", None, True)
        table += _linear(f"{ours}.ffn.linear2", f"{theirs}.fc2", None, False)
        table += _norm(f"{ours}.sub_ffn.norm", f"{theirs}.final_layer_norm")
    for i in range(cfg.decoder_layers):
        ours, theirs = f"decoder.{i}", f"model.decoder.layers.{i}"
        table += _attention(f"{ours}.self_attn", f"{theirs}.self_attn", cross=False)
        table += _norm(f"{ours}.sub_self.norm", f"{theirs}.self_attn_layer_norm")
        table += _attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn", cross=True)
        table += _norm(f"{ours}.sub_cross.norm", f"{theirs}.encoder_attn_layer_norm")
        table += _linear(f"{ours}.ffn.linear1", f"{theirs}.fc1", None, True)
        table += _linear(f"{ours}.ffn.linear2", f"{theirs}.fc2", None, False)
        table += _norm(f"{ours}.sub_ffn.norm", f"{theirs}.final_layer_norm")
    if cfg.norm == "pre":
        table += _norm("encoder_norm", "model.encoder.layer_norm") + _norm("decoder_norm", "model.decoder.layer_norm")
    if cfg.tie_embeddings in ("all", "inputs"):
        table.append(Weight("tgt_embed.tokens.weight", "model.shared.weight", None, 1))
    table.append(Weight("src_embed.tokens.weight", "model.encoder.embed_tokens.weight", None, 1))
    table.append(Weight("tgt_embed.tokens.weight", "model.decoder.embed_tokens.weight", None, 1))
    table.append(Weight("output.weight", "lm_head.weight", None, 1))
    if cfg.output_bias:
        table.append(Weight("output_bias", "final_logits_bias"))  # (V,) here, (1, V) there
    return table


def _one(config: dict, keys: tuple[str, str], what: str) -> int:
    a, b = (config.get(k) for k in keys)
    if a != b:
        raise CheckpointError(f"{keys[0]}={a} but {keys[1]}={b}: this model has one {what} for encoder and decoder")
    return a


def _refuse(config: dict, where: str) -> None:
    """Options of these classes' configs this model cannot compute (see the module's docstring)."""
    flags = {"normalize_embedding": False, "layernorm_embedding": False, "add_final_layer_norm": False,
             "normalize_before": False, "static_position_embeddings": True, "add_bias_logits": False}  # fmt: skip
    for key, fine in flags.items():
        if key in config and bool(config[key]) != fine:
            raise CheckpointError(f"{where}: {key}={config[key]} in config.json is not supported (this "
                                  f"toolkit computes {key}={fine}; transformers ignores the key)")  # fmt: skip
    if config.get("num_hidden_layers", config.get("encoder_layers")) != config.get("encoder_layers"):
        raise CheckpointError(f"{where}: num_hidden_layers differs from encoder_layers in config.json")


REQUIRED = ("vocab_size", "pad_token_id", "eos_token_id", "d_model", "encoder_layers", "decoder_layers")
INTEGERS = (*REQUIRED, "decoder_start_token_id", "max_position_embeddings", "decoder_vocab_size",
            "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim")  # fmt: skip


def _integers(config: dict, where: str) -> None:
    """The keys the model's shapes and special ids come from: present where needed, whole numbers."""
    for key in REQUIRED:
        if config.get(key) is None:
            raise CheckpointError(f"{where}: config.json has no {key}; the checkpoint is incomplete (download "
                                  "config.json again)")  # fmt: skip
    for key in INTEGERS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise CheckpointError(f"{where}: {key}={value!r} in config.json is not a whole number; write it as "
                                  f"one ({key}: 512, not \"512\")")  # fmt: skip


def model_config(config: dict, where: str) -> tuple[ModelConfig, int, int]:
    """(model config, source vocabulary size, target vocabulary size) of a transformers config.json's keys."""
    kind = config.get("model_type")
    if kind not in ARCHITECTURES:
        raise CheckpointError(f"{where}: model_type {kind!r} is not supported; this toolkit loads "
                              f"{', '.join(ARCHITECTURES)} ({', '.join(ARCHITECTURES.values())})")  # fmt: skip
    _refuse(config, where)
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise CheckpointError(f"{where}: activation_function={activation!r} is not supported (relu, swish, gelu)")
    try:
        n_heads = _one(config, ("encoder_attention_heads", "decoder_attention_heads"), "number of heads")
        d_ff = _one(config, ("encoder_ffn_dim", "decoder_ffn_dim"), "feed-forward width")
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {e}") from None
    _integers(config, where)
    vocab, pad = config["vocab_size"], config["pad_token_id"]
    eos = config["eos_token_id"]
    start = config.get("decoder_start_token_id", pad if kind == "marian" else eos)
    shared = kind != "marian" or config.get("share_encoder_decoder_embeddings", True)
    tied = config.get("tie_word_embeddings", True)
    tgt_vocab = vocab if shared else config.get("decoder_vocab_size") or vocab
    cfg = ModelConfig(
        name=f"hf_{kind}",
        d_model=config["d_model"],
        n_heads=n_heads,
        d_ff=d_ff,
        encoder_layers=config["encoder_layers"],
        decoder_layers=config["decoder_layers"],
        dropout=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
        activation_dropout=float(config.get("activation_dropout", 0.0)),
        norm="post" if kind == "marian" else "pre",
        tie_embeddings=("all" if tied else "inputs") if shared else ("decoder" if tied else "none"),
        positions="sinusoidal",
        max_positions=config.get("max_position_embeddings", 1024),
        activation=ACTIVATIONS[activation],
        scale_embedding=bool(config.get("scale_embedding", kind != "marian")),
        sinusoids="fairseq" if kind == "m2m_100" else "halves",
        position_offset=pad + 1 if kind == "m2m_100" else 0,
        output_bias=kind in ("marian", "pegasus"),  # final_logits_bias
        mask_pad_logit=kind == "marian",
        pad_id=pad,
        unk_id=-1,  # set from the tokenizer
        decoder_start_id=start,
        eos_id=eos,
    )
    return cfg, vocab, tgt_vocab


def hf_kind(cfg: ModelConfig) -> str:
    """The transformers model_type that computes `cfg` as it is (its export: mt/export/hugging_face.py)."""
    if cfg.sinusoids == "fairseq":
        return "m2m_100"
    return "marian" if cfg.norm == "post" else "pegasus"


def config_dict(cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> dict:
    """The config.json keys of `hf_kind(cfg)` for a model of `cfg`: `model_config`'s inverse."""
    kind = hf_kind(cfg)
    activation = {"relu": "relu", "swish": "swish", "gelu": "gelu"}[cfg.activation]
    out = dict(
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        max_position_embeddings=cfg.max_positions,
        activation_function=activation,
        scale_embedding=cfg.scale_embedding,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
        vocab_size=src_vocab,
        pad_token_id=cfg.pad_id,
        eos_token_id=cfg.eos_id,
        decoder_start_token_id=cfg.decoder_start_id,
        forced_eos_token_id=cfg.eos_id,
        tie_word_embeddings=cfg.tie_embeddings in ("all", "decoder"),
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )
    if kind == "marian":
        out |= dict(
            decoder_vocab_size=tgt_vocab, share_encoder_decoder_embeddings=cfg.tie_embeddings in ("all", "inputs")
        )
    if kind == "m2m_100":
        out |= dict(bos_token_id=0 if cfg.pad_id == 1 else cfg.decoder_start_id)
    return out


def refusal(cfg: ModelConfig) -> str | None:
    """Why no transformers class computes a model of `cfg` exactly, or None."""
    kind = hf_kind(cfg)
    if cfg.positions != "sinusoidal":
        return (f"model.positions={cfg.positions}: transformers' Marian and Pegasus add sinusoidal positions only; "
                "a learned table has no exact counterpart there (export release or ctranslate2 instead)")  # fmt: skip
    if kind == "m2m_100" and (cfg.position_offset != cfg.pad_id + 1 or cfg.norm != "pre"):
        return "fairseq sinusoids that do not start after <pad>, or post-norm: no transformers class computes them"
    if kind != "m2m_100" and cfg.position_offset:
        return f"model.position_offset={cfg.position_offset}: Marian and Pegasus start their positions at 0"
    if kind == "pegasus" and cfg.tie_embeddings != "all":
        return (f"a pre-norm model with model.tie_embeddings={cfg.tie_embeddings}: Pegasus, transformers' "
                "pre-norm encoder-decoder, has one embedding matrix for encoder, decoder and output "
                "(tie_embeddings=all)")  # fmt: skip
    if kind == "m2m_100" and cfg.tie_embeddings not in ("all", "inputs"):
        return f"model.tie_embeddings={cfg.tie_embeddings}: M2M100 shares its encoder's and decoder's embeddings"
    if cfg.output_bias and kind == "m2m_100":
        return "model.output_bias: M2M100 has no output bias"
    if cfg.mask_pad_logit and kind != "marian":
        return "model.mask_pad_logit: only a Marian model's generation config bans <pad>"
    return None
