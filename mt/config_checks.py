"""Checks of the configs that the entry points compose (train.py's `Config`, translate.py's and serve.py's): values
their types let through but the code cannot use, each a one-line ConfigError naming the key; `to_dataclass` turns
a composed config into its checked dataclass."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mt.config import (
    BATCH_FORMATIONS,
    DISTILL_MIXES,
    PRETOKENIZERS,
    Config,
    ConfigError,
    DecodeConfig,
    ServeConfig,
    TranslateConfig,
    _choice,
    checkpoint_list,
    parse_direction,
    validate_decode,
)

NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents")  # tokenizers.normalizers' classes


def validate_auto(cfg: Config) -> None:
    """What `+experiment=auto` cannot choose for."""
    for key, set_, why in (
        ("data.corpora", cfg.data.corpora, "the rule reads one corpus"),
        ("data.directions", cfg.data.directions, "the rule reads one direction"),
    ):
        if set_:
            raise ConfigError(f"+experiment=auto with {key}: {why}; drop one of them (set the recipe by hand)")
    if not cfg.train.max_time and not cfg.train.max_updates:
        raise ConfigError("+experiment=auto chooses the recipe for a budget: set train.max_time (minutes) or "
                          "train.max_updates")  # fmt: skip


def validate_model_options(cfg: Config) -> None:
    """The model keys that imported checkpoints set (mt/model/hf_format.py): known values, and this project's
    special ids for a model trained from nothing (its tokenizers have <pad> 0, <unk> 1, <s> 2, </s> 3)."""
    m = cfg.model
    _choice("model.activation", m.activation, ("relu", "swish", "gelu"))
    _choice("model.sinusoids", m.sinusoids, ("paper", "halves", "fairseq"))
    if m.position_offset < 0:
        raise ConfigError(f"model.position_offset={m.position_offset} is below its minimum 0")
    ids = {"model.pad_id": (m.pad_id, 0), "model.unk_id": (m.unk_id, 1),
           "model.decoder_start_id": (m.decoder_start_id, 2), "model.eos_id": (m.eos_id, 3)}  # fmt: skip
    changed = [f"{k}={v}" for k, (v, default) in ids.items() if v != default]
    if changed and not cfg.train.init_from:
        raise ConfigError(f"{changed[0]}: special ids are an imported checkpoint's (train.init_from sets them); a "
                          "model trained from nothing uses its tokenizer's (pad 0, unk 1, start 2, eos 3)")  # fmt: skip


def validate(cfg: Config) -> None:
    """Reject values the type system lets through but the code cannot use."""
    _choice("data.format", cfg.data.format, ("parallel", "tsv", "jsonl", "tmx", "hub"))
    _choice("data.batching", cfg.data.batching, BATCH_FORMATIONS)
    if cfg.data.batching == "fixed" and (cfg.data.corpora or cfg.train.bpe_dropout):
        what = (
            "data.corpora (new rows each epoch)" if cfg.data.corpora else "train.bpe_dropout (new lengths each epoch)"
        )
        raise ConfigError(f"data.batching=fixed keeps one set of batches for the run, which {what} cannot have; "
                          "set data.batching=pools")  # fmt: skip
    _choice("model.norm", cfg.model.norm, ("post", "pre"))
    _choice("model.tie_embeddings", cfg.model.tie_embeddings, ("all", "decoder", "inputs", "none"))
    _choice("model.positions", cfg.model.positions, ("sinusoidal", "learned"))
    _choice("model.init", cfg.model.init, ("xavier", "fairseq"))
    validate_model_options(cfg)
    _choice("train.schedule", cfg.train.schedule, ("noam", "inverse_sqrt", "linear", "constant"))
    _choice("train.optimizer", cfg.train.optimizer, ("adam", "adamw"))
    _choice("train.precision", cfg.train.precision, ("auto", "fp32", "bf16", "fp16"))
    for step in cfg.tokenizer.normalization.split("+"):
        _choice("tokenizer.normalization", step, NORMALIZERS)
    _choice("tokenizer.pretokenize", cfg.tokenizer.pretokenize, PRETOKENIZERS)
    if cfg.tokenizer.pretokenize != "none" and cfg.data.directions:
        raise ConfigError("tokenizer.pretokenize=moses tokenizes one source and one target language; a "
                          "data.directions run has several target languages: unset one of them")  # fmt: skip
    if cfg.tokenizer.case_markup and "Lowercase" in cfg.tokenizer.normalization.split("+"):
        raise ConfigError(f"tokenizer.case_markup=true with tokenizer.normalization={cfg.tokenizer.normalization}: "
                          "case markup keeps the case that Lowercase removes; drop one of them")  # fmt: skip
    validate_corpora(cfg)
    if cfg.auto.enabled:
        validate_auto(cfg)
    for key, value, low in (
        ("data.max_len", cfg.data.max_len, 1),
        ("data.max_ratio", cfg.data.max_ratio, 1.0),
        ("tokenizer.vocab_size", cfg.tokenizer.vocab_size, 8),
        ("tokenizer.sample_pairs", cfg.tokenizer.sample_pairs, 0),
        ("model.d_model", cfg.model.d_model, 1),
        ("model.n_heads", cfg.model.n_heads, 1),
        ("model.d_ff", cfg.model.d_ff, 1),
        ("model.encoder_layers", cfg.model.encoder_layers, 1),
        ("model.decoder_layers", cfg.model.decoder_layers, 1),
        ("model.max_positions", cfg.model.max_positions, 2),
        ("train.max_tokens", cfg.train.max_tokens, 1),
        ("train.max_epochs", cfg.train.max_epochs, 1),
        ("train.max_updates", cfg.train.max_updates, 0),
        ("train.max_time", cfg.train.max_time, 0.0),
        ("train.lr", cfg.train.lr, 0.0),
        ("train.warmup", cfg.train.warmup, 0),
        ("train.clip_norm", cfg.train.clip_norm, 0.0),
        ("train.log_every", cfg.train.log_every, 1),
        ("train.valid_every", cfg.train.valid_every, 0),
        ("train.keep_last", cfg.train.keep_last, 0),
        ("train.average_last", cfg.train.average_last, 0),
        ("train.save_every", cfg.train.save_every, 0.0),
        ("train.max_nan_updates", cfg.train.max_nan_updates, 1),
        ("train.wait_timeout", cfg.train.wait_timeout, 0.1),
        ("train.rdrop_alpha", cfg.train.rdrop_alpha, 0.0),
    ):
        if value < low:
            raise ConfigError(f"{key}={value} is below its minimum {low}; fix the override or config file")
    for key, value in (
        ("model.dropout", cfg.model.dropout),
        ("model.attention_dropout", cfg.model.attention_dropout),
        ("model.activation_dropout", cfg.model.activation_dropout),
        ("train.label_smoothing", cfg.train.label_smoothing),
        ("train.tgt_word_dropout", cfg.train.tgt_word_dropout),
    ):
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{key}={value} is a probability; use a value in [0, 1)")
    if cfg.data.src_lang == cfg.data.tgt_lang:
        raise ConfigError(f"data.src_lang and data.tgt_lang are both {cfg.data.src_lang!r}; pick two languages")
    if cfg.model.d_model % cfg.model.n_heads:
        raise ConfigError(f"model.d_model={cfg.model.d_model} is not divisible by model.n_heads={cfg.model.n_heads}")
    if cfg.model.tie_embeddings in ("all", "inputs") and not cfg.tokenizer.joint:
        raise ConfigError(
            f"model.tie_embeddings={cfg.model.tie_embeddings} needs a joint vocabulary; set tokenizer.joint=true "
            "or model.tie_embeddings=decoder"
        )
    if cfg.train.schedule == "linear" and not (cfg.train.max_updates or cfg.train.max_time):
        raise ConfigError(
            "train.schedule=linear decays the lr to 0 over the run's budget; set train.max_updates or train.max_time"
        )
    if not 0.0 <= cfg.train.ema_decay < 1.0:
        raise ConfigError(
            f"train.ema_decay={cfg.train.ema_decay} is a decay per update; use a value in [0, 1), e.g. 0.999"
        )
    if not 0.0 <= cfg.train.bpe_dropout < 1.0:
        raise ConfigError(f"train.bpe_dropout={cfg.train.bpe_dropout} is a probability; use a value in [0, 1)")
    coverage = cfg.tokenizer.character_coverage
    if coverage is not None and not 0.0 < coverage <= 1.0:
        raise ConfigError(f"tokenizer.character_coverage={coverage} is the share of the text's characters the "
                          "alphabet keeps; use a value in (0, 1], e.g. 0.9995 for Chinese or Japanese")  # fmt: skip
    if not 0.0 <= cfg.train.cooldown <= 1.0:
        raise ConfigError(f"train.cooldown={cfg.train.cooldown} is a fraction of the budget; use a value in [0, 1]")
    trains = not (cfg.distill.enabled and cfg.distill.translate_only)  # (stage 1 alone: no lr to anneal)
    if trains and cfg.train.cooldown and not (cfg.train.max_updates or cfg.train.max_time):
        raise ConfigError(
            f"train.cooldown={cfg.train.cooldown} anneals the lr over the end of the run's budget; "
            "set train.max_updates or train.max_time (or train.cooldown=0)"
        )
    if cfg.train.schedule != "constant" and cfg.train.warmup < 1:
        raise ConfigError(
            f"train.warmup={cfg.train.warmup}: the {cfg.train.schedule} schedule needs warmup >= 1 "
            "update (or train.schedule=constant)"
        )
    if cfg.data.valid_from_train < 0:
        raise ConfigError(f"data.valid_from_train={cfg.data.valid_from_train}: give a number of pairs, 0 = off")
    if cfg.data.valid_from_train and cfg.data.directions:
        raise ConfigError("data.valid_from_train with data.directions is not supported; give a validation split")
    if cfg.train.init_optimizer and not cfg.train.init_from:
        raise ConfigError("train.init_optimizer carries the optimizer of train.init_from over; set train.init_from")
    if cfg.train.accumulate < 1:
        raise ConfigError(f"train.accumulate={cfg.train.accumulate} must be >= 1")
    validate_decode(cfg.decode)
    if cfg.distill.translate_only and not cfg.distill.enabled:
        raise ConfigError("distill.translate_only=true is stage 1 of +experiment=distill; add +experiment=distill "
                          "distill.teacher=TEACHER, or drop it")  # fmt: skip
    if cfg.distill.enabled:
        validate_distill(cfg)


def validate_distill(cfg: Config) -> None:
    """What `+experiment=distill` needs: a teacher, one corpus and direction of its own, sane shares."""
    d = cfg.distill
    if d.teacher is None:
        raise ConfigError("+experiment=distill needs a teacher: distill.teacher=RUN_DIR (or a release, a transformers "
                          "folder or Hub id, or a list [A,B,C] of this project's runs: an ensemble)")  # fmt: skip
    checkpoint_list(d.teacher)
    _choice("distill.mix", d.mix, DISTILL_MIXES)
    for key, why in (("data.corpora", "the teacher's translations are the corpora"),
                     ("data.directions", "a teacher translates one direction"),
                     ("auto.enabled", "+experiment=distill plans its own run")):  # fmt: skip
        if getattr(cfg.data if key.startswith("data.") else cfg.auto, key.split(".")[1]):
            raise ConfigError(f"+experiment=distill with {key}: {why}; drop one of them")
    if d.mix == "distilled" and cfg.data.valid_from_train:
        raise ConfigError("distill.mix=distilled with data.valid_from_train: the validation pairs are held out of "
                          "the original pairs, which this student does not train on; give a validation split or "
                          "distill.mix=both")  # fmt: skip
    if not 0.0 < d.teacher_share < 1.0:
        raise ConfigError(f"distill.teacher_share={d.teacher_share} is a share of train.max_time; use a value in "
                          "(0, 1), e.g. 0.5")  # fmt: skip
    if d.chunk_lines < 1:
        raise ConfigError(f"distill.chunk_lines={d.chunk_lines} is below its minimum 1")
    if d.min_speedup < 0:
        raise ConfigError(f"distill.min_speedup={d.min_speedup} is a ratio of speeds; use 0 (not timed) or more")
    validate_teacher_decode(d.teacher_decode)


def validate_teacher_decode(overrides: dict) -> None:
    """`distill.teacher_decode`: decode.* names and values (over the defaults here; over the teacher's own saved
    settings again when it is loaded), one translation a line."""
    known = {f.name for f in fields(DecodeConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(
            f"distill.teacher_decode.{unknown[0]} is not a decode setting; known: {', '.join(sorted(known))}"
        )
    try:
        validate_decode(DecodeConfig(**overrides))
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"distill.teacher_decode: {e}") from None
    if overrides.get("nbest", 1) != 1:
        raise ConfigError(f"distill.teacher_decode.nbest={overrides['nbest']}: stage 1 keeps one translation a "
                          "line; drop it")  # fmt: skip


def validate_corpora(cfg: Config) -> None:
    for direction in cfg.data.directions:
        parse_direction(direction)
    if cfg.data.directions and not cfg.tokenizer.joint:
        raise ConfigError("data.directions needs one joint vocabulary for all languages; set tokenizer.joint=true")
    if len(set(cfg.data.directions)) != len(cfg.data.directions):
        raise ConfigError(f"data.directions={cfg.data.directions}: a direction is listed twice")
    for i, c in enumerate(cfg.data.corpora):
        where = f"data.corpora[{i}]"
        if c.format is not None:
            _choice(f"{where}.format", c.format, ("parallel", "tsv", "jsonl", "tmx", "hub"))
        if not c.weight > 0:
            raise ConfigError(f"{where}.weight={c.weight}: give a weight above 0 (pairs per epoch per pair)")
        if c.tag is not None and not (len(c.tag) > 2 and c.tag[0] == "<" and c.tag[-1] == ">" and " " not in c.tag):
            raise ConfigError(f"{where}.tag={c.tag!r}: give a token like <bt> (angle brackets, no spaces)")
        if c.tag is not None and cfg.tokenizer.path:
            raise ConfigError(f"{where}.tag needs a tokenizer trained with it; unset tokenizer.path")


def check_confidence(cfg: TranslateConfig) -> None:
    """translate.py's output_format, flag_below, confidence and mc_passes, against each other and the options they
    cannot go with."""
    _choice("output_format", cfg.output_format, ("text", "jsonl"))
    _choice("confidence", cfg.confidence, ("logprob", "mc_dropout"))
    if cfg.output_format != "jsonl":
        for key, unset in (("flag_below", None), ("confidence", "logprob")):
            if getattr(cfg, key) != unset:
                raise ConfigError(f"{key}={getattr(cfg, key)} marks lines of output_format=jsonl; add that")
        return
    if cfg.decode.nbest > 1:
        raise ConfigError("output_format=jsonl writes one scored translation a line; n-best lists (decode.nbest="
                          f"{cfg.decode.nbest}) carry their scores already: unset one of them")  # fmt: skip
    if cfg.split:
        raise ConfigError("output_format=jsonl scores lines translated whole; unset split (or translate one sentence "
                          "a line)")  # fmt: skip
    if cfg.confidence == "mc_dropout" and cfg.mc_passes < 2:
        raise ConfigError(f"mc_passes={cfg.mc_passes}: MC dropout needs 2 or more passes (10 is usual)")


def to_dataclass(cfg: DictConfig) -> Any:
    """Turn a composed DictConfig into its schema dataclass, checked: train.py's (`validate`), translate.py's and
    serve.py's."""
    obj = OmegaConf.to_object(cfg)
    if isinstance(obj, Config):
        validate(obj)
    elif isinstance(obj, TranslateConfig):
        obj.checkpoint = checkpoint_list(obj.checkpoint)
        validate_decode(obj.decode)
        _choice("precision", obj.precision, ("auto", "fp32", "bf16", "fp16"))
        _choice("input_errors", obj.input_errors, ("strict", "replace"))
        if obj.stream_lines < 1:
            raise ConfigError(f"stream_lines={obj.stream_lines} is below its minimum 1; fix the override")
        check_confidence(obj)
    elif isinstance(obj, ServeConfig):
        validate_decode(obj.decode)
        _choice("precision", obj.precision, ("auto", "fp32", "bf16", "fp16"))
        for key in ("batch_tokens", "batch_rows", "max_sentences", "max_glossary_terms", "max_request_tokens",
                    "max_beam", "max_body_bytes", "max_output_tokens", "max_queue_tokens",
                    "request_timeout_s"):  # fmt: skip
            if getattr(obj, key) < 1:
                raise ConfigError(f"{key}={getattr(obj, key)} is below its minimum 1; fix the override")
        for key in ("requests_per_minute", "tokens_per_minute"):
            if getattr(obj, key) < 0:
                raise ConfigError(f"{key}={getattr(obj, key)}: give a number per minute, 0 = no limit")
        if not 0 <= obj.port <= 65535:
            raise ConfigError(f"port={obj.port} is outside 0-65535; give a free TCP port (0 = any)")
    return obj
