"""A checkpoint made ready to decode: the model (int8 if asked), an ensemble, or a CTranslate2 export, on its
device with its autocast dtype; the run's decoding settings under the command line's; the glossary file."""

from __future__ import annotations

import dataclasses
import logging

import torch

from mt import runtime
from mt.config import ConfigError, DecodeConfig, validate_decode
from mt.decode.ct2 import CTranslate2Model
from mt.decode.ensemble import Ensemble
from mt.decode.terminology import Glossary
from mt.model import saved
from mt.model.quantize import quantize_int8
from mt.model.saved import CT2_FORMAT
from mt.runtime import pick_autocast, use_tf32

log = logging.getLogger(__name__)


def run_decode_settings(cli: DecodeConfig, ckpt: dict, overrides: list[str]) -> DecodeConfig:
    """The decoding settings the run was evaluated with (a recipe's beam and tuned length penalty), with the
    command line's `decode.*` keys on top. A decode group named on the command line (`decode=greedy`) replaces them,
    as does a checkpoint without a saved config."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    run_decode = (ckpt.get("config") or {}).get("decode")
    if not run_decode or "decode" in keys:
        return cli
    fields = {f.name for f in dataclasses.fields(DecodeConfig)}
    merged = {k: v for k, v in run_decode.items() if k in fields}
    given = {k for k in (k.removeprefix("decode.") for k in keys) if k in fields}
    merged.update({k: getattr(cli, k) for k in given})
    if cli.sampling and "beam_size" not in given:  # sampling draws one token at a time: not the run's beam
        merged["beam_size"] = 1
    cfg = DecodeConfig(**merged)
    validate_decode(cfg)
    return cfg


def for_decoding(model, decode: DecodeConfig, device: torch.device):
    """The model to decode with: with `decode.quantize=int8` its int8 copy, made once at load, not per batch. int8
    runs on the CPU only: on CUDA a warning, and `decode.quantize` is set to none (the settings a run saved say int8,
    the GPU serves it in its own precision instead of failing every request)."""
    if decode.quantize != "int8":
        return model
    if runtime.on_cuda(device):
        log.warning("decode.quantize=int8 runs on the CPU only; decoding on %s without it", device)
        decode.quantize = "none"
        return model
    return quantize_int8(model)


def load_translator(ckpt: dict, decode: DecodeConfig, precision: str, device: torch.device, plot: bool = False):
    """(model, vocabs, autocast dtype) for a loaded checkpoint: this project's Transformer on `device` (int8 per
    `for_decoding`, which may set `decode.quantize`), or for a CTranslate2 export its CTranslate2 translator.
    `plot`: attention plots are wanted (this project's model only)."""
    if ckpt["format"] == CT2_FORMAT:
        if plot:
            raise ConfigError("plot_attention needs this project's model: a CTranslate2 export has no attention")
        if decode.length_penalty and decode.length_penalty_type != "average":
            log.warning(
                "CTranslate2 divides scores by length^%g (length_penalty_type=average), not by GNMT's penalty: "
                "beams may rank otherwise than this project's search",
                decode.length_penalty,
            )
        model = CTranslate2Model(ckpt["path"], device)
        return model, model.vocabs, None
    model, vocabs = saved.build_model(ckpt)
    model.to(device).eval()
    use_tf32(device)
    return for_decoding(model, decode, device), vocabs, pick_autocast(precision, device, model.cfg.d_model)


def load_ensemble(ckpts: list[dict], decode: DecodeConfig, precision: str, device: torch.device, plot: bool = False):
    """(ensemble, vocabs, autocast dtype) for several checkpoints of this project's models (mt/decode/ensemble.py); they
    must share the tokenizers, which turn text into ids and back for all of them."""
    if plot:
        raise ConfigError("plot_attention shows one model's attention; give one checkpoint, not a list")
    models, vocabs = [], None
    for ckpt in ckpts:
        if ckpt["format"] == CT2_FORMAT:
            raise ConfigError(f"{ckpt['path']}: a CTranslate2 export cannot be ensembled; give run dirs, .pt files "
                              "or releases")  # fmt: skip
        model, v = saved.build_model(ckpt)
        if vocabs is None:
            vocabs = v
        for side, name in (("tgt", "target"), ("src", "source")):
            if getattr(v, side).digest() != getattr(vocabs, side).digest():
                raise ConfigError(
                    f"{ckpt['path']}: its {name} vocabulary differs from {ckpts[0]['path']}'s; an ensemble's models "
                    "must share the tokenizers (train them on the same data and tokenizer settings)"
                )
        models.append(model)
    ensemble = Ensemble(models).to(device).eval()
    use_tf32(device)
    amp = pick_autocast(precision, device, min(ensemble.widths))
    return for_decoding(ensemble, decode, device), vocabs, amp


def glossary_of(cfg) -> Glossary | None:
    """translate.py's and serve.py's `glossary=FILE` (with `glossary_ignore_case`)."""
    return Glossary.from_file(cfg.glossary, cfg.glossary_ignore_case) if cfg.glossary else None
