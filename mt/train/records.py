"""What a run leaves beside its checkpoints for later stages: where a fine-tuning run started from
(`PARENT_FILE`) and the test reports of the weights a checkpoint holds."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def run_files(ckpt: dict) -> Path:
    """The run dir a checkpoint came from (its own dir, for a .pt inside one)."""
    path = Path(ckpt["path"])
    return path if path.is_dir() else path.parent


PARENT_FILE = "parent.json"  # in a fine-tuning run's dir: where the run started from (mt/train/finetune.py writes it)


def read_parent(run_dir: Path) -> dict | None:
    """The record of the model a fine-tuning run started from (`PARENT_FILE`), if the run started from one."""
    path = Path(run_dir) / PARENT_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def hub_record(ckpt: dict) -> dict:
    """The values of the transformers files a model came from (source, config, generation config, licence): an
    imported checkpoint's own, or the parent's of a run fine-tuned from one (its `PARENT_FILE`); {} otherwise."""
    own = (ckpt.get("config") or {}).get("hub")
    if own:
        return own
    if "family" not in (ckpt.get("tokenizer") or {}):  # this project's own tokenizer: not from transformers
        return {}
    return (read_parent(run_files(ckpt)) or {}).get("hub") or {}


def test_scores(ckpt: dict) -> list[dict]:
    """The scores of the weights' test reports (`test_reports`): [{split, bleu, bleu_lowercase, chrf}], as /info and
    a fine-tuning run's record list them."""
    return [{"split": r["name"], **{k: r[k] for k in ("bleu", "bleu_lowercase", "chrf") if k in r}}
            for r in test_reports(ckpt)]  # fmt: skip


def test_reports(ckpt: dict) -> list[dict]:
    """The test reports of the weights in `ckpt`: the `{split}.report.json` files train.py wrote beside the run's
    checkpoint_final.pt, if `ckpt` is that checkpoint or holds the same weights (the best or the last checkpoint,
    whichever it chose); none for any other (an epoch's, an unchosen one), whose scores were never measured."""
    path = Path(ckpt["path"])
    final = path.parent / "checkpoint_final.pt"
    if path.suffix != ".pt" or not final.is_file():
        return []
    if path.resolve() != final.resolve():
        from mt.model import saved

        theirs, ours = saved.load(final)["model"], ckpt["model"]
        if theirs.keys() != ours.keys() or not all(torch.equal(theirs[k], ours[k]) for k in ours):
            return []
    reports = []
    for report in sorted(path.parent.glob("*.report.json")):
        try:
            reports.append(json.loads(report.read_text()))
        except (OSError, ValueError):
            continue
    return reports
