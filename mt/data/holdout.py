"""`data.valid_from_train=N`: a validation set held out of the training pairs, for a corpus that has none (the
OPUS samples, most users' own data). N of the main corpus's non-empty pairs are drawn by the seed before anything
learns from the corpus: the BPE is trained without them (`Without`), the model never sees them, and they are
validated on as a validation split would be (a line longer than the model is cut, as in any validation split).
The draw depends on the seed and the number of pairs only, so a fine-tuning run (the parent's tokenizer) and a
from-scratch run (its own BPE) with the same seed validate on the same pairs."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import datasets
import numpy as np

from mt.data.read import TextPairs
from mt.errors import DataError

log = logging.getLogger(__name__)


def hold_out(text: TextPairs, n: int, seed: int) -> np.ndarray:
    """The sorted row numbers (among `text`'s non-empty pairs) of the `n` pairs held out: drawn from `seed` and the
    corpus's size alone (a resume draws the same)."""
    total = sum(1 for _ in text)
    if n >= total:
        raise DataError(f"data.valid_from_train={n}: {text.where} has only {total} non-empty training pairs; hold "
                        "out fewer, or give a validation split")  # fmt: skip
    return np.sort(np.random.default_rng([seed, 0x686F6C64]).choice(total, size=n, replace=False))


class Without(TextPairs):
    """`text` without the rows `held` (what the BPE learns from); its fingerprint names them, so that a BPE cached
    for the whole corpus is not reused."""

    def __init__(self, text: TextPairs, held: np.ndarray):
        digest = hashlib.sha256(held.tobytes()).hexdigest()[:12]
        super().__init__(text.where, f"{text.fingerprint}:without:{digest}")
        self.text, self.held = text, set(held.tolist())

    def _all(self):
        for i, pair in enumerate(self.text):
            if i not in self.held:
                yield pair


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
