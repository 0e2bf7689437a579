"""Reading a saved model: a checkpoint (.pt, loaded without running pickled code), a release (safetensors +
JSON) or a CTranslate2 export, as one checkpoint dict; `build_model` turns it into the Transformer and its
tokenizers. One loader for resuming, translating, serving and exporting."""

from __future__ import annotations

import json
import logging
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from mt.data.hub_vocab import HUB_TOKENIZER_FILE, read_saved, vocabs_from_json
from mt.data.tokenizer import PRETOKENIZE_FILE, Vocabs, read_tokenizer_files
from mt.errors import CheckpointError
from mt.model import hub
from mt.model.transformer import Transformer

FORMAT_VERSION = 1  # a checkpoint's "format"
RELEASE_FORMAT = "mt-release-1"  # python -m mt.export release: safetensors + JSON, no pickle
CT2_FORMAT = "mt-ctranslate2-1"  # python -m mt.export ctranslate2: CTranslate2's model + this toolkit's JSON

log = logging.getLogger(__name__)


def _numpy_globals() -> list:
    """What a checkpoint holds besides tensors and plain containers: numpy's RNG state, an array."""
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _unpickle(path: Path) -> dict:
    """torch.load with `weights_only=True`: tensors, containers and the numpy types our checkpoints hold; a pickle
    that would call anything else is refused before it runs. torch's warnings are shown only if the file loads."""
    try:
        with warnings.catch_warnings(record=True) as held:
            warnings.simplefilter("always")
            with torch.serialization.safe_globals(_numpy_globals()):
                state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)|but got <class '([\w.]+)'", str(e))
        if not found:  # not a pickle at all, or a damaged one
            raise CheckpointError(f"{path}: not a readable checkpoint (UnpicklingError); it may be truncated") from None
        what = next(g for g in found.groups() if g)
        raise CheckpointError(
            f"{path}: refused: loading it would call {what}, which no checkpoint of this toolkit holds (a .pt is a "
            "pickle and can run code); ask its author for a release (python -m mt.export release), which loads "
            "without pickle"
        ) from None
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}); it may be truncated") from None
    for w in held:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return state


KINDS = (
    "give a run dir, a .pt file written by train.py, a release or CTranslate2 export, or a transformers folder "
    "(config.json with the weights and tokenizer files) or Hub id"
)


def load(path: str | Path) -> dict:
    """Load a checkpoint onto the CPU: a .pt file, a run dir (its final, else best, else last checkpoint), a release
    dir (`mt.export release`: safetensors, no pickle), a CTranslate2 export (`mt.export ctranslate2`), or a
    transformers checkpoint (a directory, or a Hub id such as Helsinki-NLP/opus-mt-de-en: mt/model/hub.py)."""
    if hub.looks_like_hub_id(str(path)) or hub.is_transformers_dir(Path(path)):
        return hub.load_transformers(path)
    path = given = Path(path)
    weights = path.is_dir() and any((path / n).is_file() for n in hub.WEIGHT_FILES)
    if weights and not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: weights but no config.json; a transformers checkpoint is a directory with "
                              "config.json, the weights and the tokenizer files (a release has its config.json "
                              "too)")  # fmt: skip
    if path.is_dir() and (path / "model.safetensors").is_file():
        return load_release(path)
    if path.is_dir() and (path / "mt.json").is_file():
        return load_ctranslate2_export(path)
    if path.is_dir():
        # checkpoint_final.pt: the weights train.py chose for its test report (best or averaged).
        for name in ("checkpoint_final.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            what = "is empty" if not any(path.iterdir()) else hub.listing(path)
            raise CheckpointError(f"{path}: the folder {what}: no model there (a run dir's checkpoint_final.pt, a "
                                  f"release, a CTranslate2 export or a transformers config.json); {KINDS}")  # fmt: skip
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file or directory ({path.absolute()}); {KINDS}")
    ckpt = _unpickle(path)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT_VERSION or "model" not in ckpt:
        raise CheckpointError(f"{path}: not a checkpoint of this toolkit (format {FORMAT_VERSION})")
    ckpt["path"] = str(path)
    if path.name == "checkpoint_last.pt" and given.is_dir():  # neither final nor best: training stopped early
        log.warning("%s: the run did not finish (no checkpoint_final.pt or checkpoint_best.pt); using its last "
                    "weights, checkpoint_last.pt (update %s)", given, ckpt.get("update", "?"))  # fmt: skip
    return ckpt


def _json(path: Path, fmt: str) -> dict:
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e}); export the model again") from None
    if meta.get("format") != fmt:
        raise CheckpointError(f"{path}: format {meta.get('format')!r}, expected {fmt!r}; export the model again")
    return meta


def tokenizer_files(dir: Path, config: dict | None) -> dict:
    """The tokenizers of an exported dir (`read_tokenizer_files`); one whose run pre-tokenized its text
    (tokenizer.pretokenize in `config`, the run's config) but whose PRETOKENIZE_FILE is missing is refused: without
    it the text would get other ids than the model learnt."""
    if (dir / HUB_TOKENIZER_FILE).is_file():  # an imported model's (mt/data/hub_vocab.py)
        return read_saved(dir)
    files = read_tokenizer_files(dir)
    tokenizer = (config or {}).get("tokenizer") or {}
    wanted = ([f"tokenizer.pretokenize={tokenizer['pretokenize']}"] if tokenizer.get("pretokenize", "none") != "none"
              else []) + (["tokenizer.case_markup=true"] if tokenizer.get("case_markup") else [])  # fmt: skip
    if wanted and "pretokenize" not in files:
        raise CheckpointError(f"{dir}: the model was trained with {' and '.join(wanted)} but "
                              f"{PRETOKENIZE_FILE} is missing; copy it from the run dir or export again")  # fmt: skip
    return files


def load_release(dir: Path) -> dict:
    """A release dir as a checkpoint dict whose "model" is the safetensors file (read by `build_model`)."""
    meta = _json(dir / "config.json", RELEASE_FORMAT)
    return {"format": RELEASE_FORMAT, "path": str(dir), "model": dir / "model.safetensors",
            "model_args": meta["model_args"], "config": meta["config"],
            "tokenizer": tokenizer_files(dir, meta["config"])}  # fmt: skip


def load_ctranslate2_export(dir: Path) -> dict:
    """A CTranslate2 export dir as a checkpoint dict; its model is built by mt.decode.ct2, not `build_model`."""
    meta = _json(dir / "mt.json", CT2_FORMAT)
    return {"format": CT2_FORMAT, "path": str(dir), "model_args": meta["model_args"], "config": meta["config"],
            "tokenizer": tokenizer_files(dir, meta["config"])}  # fmt: skip


def build_model(ckpt: dict) -> tuple[Transformer, Vocabs]:
    """The model (weights loaded) and tokenizers described by a checkpoint or a release."""
    if ckpt["format"] == CT2_FORMAT:
        raise CheckpointError(
            f"{ckpt['path']}: a CTranslate2 export, decoded by CTranslate2 (mt/decode/ct2.py), not torch"
        )
    model = Transformer.from_config_dict(ckpt["model_args"])
    if ckpt["format"] == RELEASE_FORMAT:
        from safetensors.torch import load_model

        load_model(model, str(ckpt["model"]))
    else:
        model.load_state_dict(ckpt["model"])
    vocabs = vocabs_from_json(ckpt["tokenizer"])
    sizes = (len(vocabs.src), len(vocabs.tgt)), (model.src_vocab, model.tgt_vocab)
    # An imported model may have rows no token uses (NLLB-200: 256,206 rows, 256,204 tokens); ours never do.
    imported = vocabs.family != "bpe"
    if (imported and (sizes[0][0] > sizes[1][0] or sizes[0][1] > sizes[1][1])) or (
        not imported and sizes[0] != sizes[1]
    ):
        raise CheckpointError(
            f"{ckpt['path']}: tokenizer has {len(vocabs.src)}/{len(vocabs.tgt)} types but the model "
            f"{model.src_vocab}/{model.tgt_vocab}; the checkpoint is inconsistent, use another one"
        )
    if vocabs.src.specials != model.specials:
        raise CheckpointError(f"{ckpt['path']}: the tokenizer's special ids {vocabs.src.specials} are not the "
                              f"model's {model.specials}; the checkpoint is inconsistent")  # fmt: skip
    return model, vocabs
