"""`data.valid_from_train=N`: a validation set held out of the training pairs, for a corpus that has none (the
OPUS samples, most users' own data). N pairs of the main corpus are drawn by the seed among those the length
filters keep, never trained on, and validated on as a validation split would be."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import numpy as np

from mt.data import DataError, TextPairs

log = logging.getLogger(__name__)


def hold_out(rows: np.ndarray, n: int, seed: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows to train on, rows held out): `n` of `rows` drawn from `seed` alone (a resume draws the same)."""
    if n >= len(rows):
        raise DataError(f"data.valid_from_train={n}: {where} has only {len(rows)} usable training pairs; hold out "
                        "fewer, or give a validation split")  # fmt: skip
    held = np.sort(np.random.default_rng([seed, 0x686F6C64]).choice(rows, size=n, replace=False))
    return np.setdiff1d(rows, held, assume_unique=True), held


def held_out_pairs(text: TextPairs, held: np.ndarray, run_dir: Path) -> datasets.Dataset:
    """The held-out rows' text (`src`/`tgt`), read in one pass over the corpus; their row numbers are recorded in
    the run dir (`valid_from_train.json`)."""
    wanted, src, tgt = set(held.tolist()), [], []
    for i, (s, t) in enumerate(text):
        if i in wanted:
            src.append(s)
            tgt.append(t)
    record = {"corpus": text.where, "pairs": len(src), "rows": held.tolist()}
    (run_dir / "valid_from_train.json").write_text(json.dumps(record) + "\n")
    log.info("%s: %d training pairs held out for validation (data.valid_from_train; rows in %s)", text.where,
             len(src), run_dir / "valid_from_train.json")  # fmt: skip
    return datasets.Dataset.from_dict({"src": src, "tgt": tgt})
