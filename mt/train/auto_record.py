"""The record `+experiment=auto` keeps in the run dir (auto.json) and the block of reasons it logs: what the rule
for a run from nothing (mt/train/auto_setup.py) and the fine-tuning rule (mt/train/auto_finetune.py) share."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mt.config import Config
from mt.data import read
from mt.train.auto import NOTE, PLAN, Choice

AUTO_FILE = "auto.json"
GROUPS = ("data", "tokenizer", "model", "train", "decode")


def explicit(overrides: list[str]) -> tuple[set[str], set[str]]:
    """The dotted keys (`model.dropout=0.25`) and config groups (`model=transformer_base`) a command line sets."""
    keys, groups = set(), set()
    for item in overrides:
        name = item.split("=", 1)[0].lstrip("+~")
        if name in GROUPS:
            groups.add(name)
        elif "." in name:
            keys.add(name)
    return keys, groups


def set_key(cfg: Config, key: str, value) -> None:
    section, name = key.split(".", 1)
    setattr(getattr(cfg, section), name, value)


def write_record(path: Path, record: dict) -> None:
    """auto.json, whole or not at all (a killed write leaves the earlier one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def block(choices: list[Choice], applied: list[Choice], cfg: Config) -> list[str]:
    """The log's lines for the rule's choices: the plan and notes as they are, the keys that share a reason on one
    line (the plan's text, which several reasons repeat, shortened to "the plan"), each key the command line set on
    its own line with the value the rule would have set."""
    plan = next((c.reason for c in choices if c.key == PLAN), None)
    rows: list[tuple[list[str], str]] = []  # (keys=values, reason): a reason's list grows with each key it explains
    by_reason: dict[str, list[str]] = {}
    for c in choices:
        reason = c.reason.replace(plan, "the plan") if plan and c.key not in (NOTE, PLAN) else c.reason  # a note whole
        if c.key in (NOTE, PLAN):
            rows.append(([], f"plan: {reason}" if c.key == PLAN else reason))
        elif c not in applied:
            rows.append(([f"{c.key}={_value(cfg, c.key)}"], f"command line; the rule would set {c.value}: {reason}"))
        elif reason in by_reason:
            by_reason[reason].append(f"{c.key}={c.value}")
        else:
            by_reason[reason] = [f"{c.key}={c.value}"]
            rows.append((by_reason[reason], reason))
    return [f"  {', '.join(keys)}  ({reason})" if keys else f"  {reason}" for keys, reason in rows]


def _value(cfg: Config, key: str):
    section, name = key.split(".", 1)
    return getattr(getattr(cfg, section), name)


FINAL_CANDIDATES = 3  # the weights the end scores on the whole val split: best, last, the last checkpoints' average


def end_sentences(cfg: Config, held: int, parent: bool = False) -> int:
    """The sentences the end of the run decodes after the budget (mt/train/finish.py): the whole val split for each
    candidate weights (`held`: the pairs held out as val), then every test split (twice with a `parent` to score
    beside the run)."""

    def count(split: str) -> int:
        try:
            return sum(1 for _ in read.TextPairs.of_split(cfg.data, split))
        except read.DataError:
            return 0

    val = held or (count(cfg.data.valid_split) if cfg.data.valid_split else 0)
    return FINAL_CANDIDATES * val + (1 + parent) * sum(count(split) for split in cfg.data.test_splits)
