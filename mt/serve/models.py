"""The models one server process serves: `checkpoint=RUN` (one, named "default"), `checkpoint=[RUN_A, RUN_B]`
(named after their directories) or `checkpoint={de: RUN_A, fr: RUN_B}`. Each has its own decoding worker; a
request picks one by `"model"` (its name) or by `"tgt_lang"` (the first model that translates into it), else it
goes to the first. A checkpoint named twice is loaded once."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from mt.config import ConfigError, ServeConfig
from mt.serve.batching import BadRequest, Batcher

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass
class Served:
    name: str
    translator: object  # mt.decode.translator.Translator
    info: dict  # what /info says of it
    cfg: ServeConfig | None = None  # the server's settings with this model's decode settings (None: the server's)
    batcher: Batcher | None = field(default=None, repr=False)

    @property
    def languages(self) -> set[str]:
        """The target languages it translates into (a multilingual model's, or the run's data.tgt_lang)."""
        targets = set(getattr(self.translator, "targets", None) or ())
        return targets or ({self.info["tgt_lang"]} if self.info.get("tgt_lang") else set())


def named_checkpoints(checkpoint) -> dict[str, str]:
    """{name: checkpoint path} of the `checkpoint=` setting (a path, a list or a mapping), or a one-line error."""
    if isinstance(checkpoint, str):
        return {"default": checkpoint}
    if isinstance(checkpoint, (list, tuple)):
        named = {Path(str(p)).name: str(p) for p in checkpoint}
        if len(named) != len(checkpoint):
            raise ConfigError("checkpoint=[...]: two checkpoints have the same directory name; name them: "
                              "checkpoint={de: RUN_A, fr: RUN_B}")  # fmt: skip
    elif isinstance(checkpoint, dict):
        named = {str(k): str(v) for k, v in checkpoint.items()}
    else:
        raise ConfigError("checkpoint: give a run dir, a list of them, or {name: run dir, ...}")
    if not named:
        raise ConfigError("checkpoint: no checkpoint given; give a run dir, a list of them, or {name: run dir, ...}")
    for name in named:
        if not NAME.fullmatch(name):
            raise ConfigError(f"checkpoint.{name}: a model name is letters, digits, '_', '.', '-' (e.g. de, en-fr)")
    return named


def pick(models: list[Served], name: str | None, tgt_lang: str | None) -> Served:
    """The model a request asks for (see the module docstring); a 422 naming what there is when none fits."""
    if name is not None:
        chosen = next((m for m in models if m.name == name), None)
        if chosen is None:
            raise BadRequest(
                422, f"model: no model named {name!r}; this server has {', '.join(m.name for m in models)}"
            )
    elif tgt_lang is not None:
        chosen = next((m for m in models if tgt_lang in m.languages), None)
        if chosen is None and len(models) > 1:
            have = ", ".join(f"{m.name} (into {', '.join(sorted(m.languages)) or '?'})" for m in models)
            raise BadRequest(422, f"tgt_lang: no model translates into {tgt_lang!r}; this server has {have}")
        chosen = chosen or models[0]
    else:
        chosen = models[0]
    if tgt_lang is not None and chosen.languages and tgt_lang not in chosen.languages:
        raise BadRequest(422, f"tgt_lang: model {chosen.name!r} translates into "
                              f"{', '.join(sorted(chosen.languages))}, not {tgt_lang!r}")  # fmt: skip
    return chosen


def load(cfg: ServeConfig, overrides: list[str]) -> list[Served]:
    """The models of `cfg.checkpoint`, loaded (each checkpoint once), each with its run's decode settings under the
    command line's `decode.*` (`overrides`)."""
    from mt.decode.loading import glossary_of, run_decode_settings
    from mt.decode.translator import Translator
    from mt.model import saved
    from mt.runtime import pick_device
    from mt.train.records import read_parent, run_files, test_scores

    named = named_checkpoints(cfg.checkpoint)
    if cfg.glossary and len(set(named.values())) > 1:
        raise ConfigError(f"glossary={cfg.glossary} with several models: a glossary's target terms are in one "
                          "language; serve one model, or send a request's own \"glossary\"")  # fmt: skip
    glossary, device, loaded, models = glossary_of(cfg), pick_device(cfg.device), {}, []
    for name, path in named.items():
        if path not in loaded:
            ckpt = saved.load(path)
            own = dataclasses.replace(cfg, checkpoint=path, decode=run_decode_settings(cfg.decode, ckpt, overrides))
            translator = Translator.open([ckpt], own.decode, device, cfg.precision, tgt_lang=cfg.tgt_lang,
                                         src_lang=cfg.src_lang)  # fmt: skip
            translator.glossary = glossary
            if glossary is not None:  # a glossary the model or its decoding cannot apply: refused at load
                translator.check_terms(own.decode, f"glossary={cfg.glossary}")
            data = (ckpt.get("config") or {}).get("data", {})
            info = {"model": ckpt["path"], "engine": type(translator.model).__name__,
                    "src_lang": data.get("src_lang"), "tgt_lang": data.get("tgt_lang"),
                    "target_languages": sorted(translator.targets), "default_tgt_lang": cfg.tgt_lang,
                    "glossary_terms": len(glossary or ()), "test_scores": test_scores(ckpt),
                    "parent": read_parent(run_files(ckpt)), "model_config": ckpt["model_args"]}  # fmt: skip
            loaded[path] = (translator, info, own)
        translator, info, own = loaded[path]
        models.append(Served(name, translator, info, own))
    return models
