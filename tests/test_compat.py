"""What earlier code wrote keeps working (issue 64): a checkpoint, a release and a resumable run written by the
commit named in tests/fixtures/compat/expected.json (tests/fixtures/make_compat.py) load and translate as they
did then, and the run resumed today ends bitwise where a run trained today from the start ends."""

from __future__ import annotations

import json
import shutil

import torch

from mt.corpus import prepare_data
from mt.training import Trainer
from mt.translator import Translator
from tests.conftest import ROOT, write_toy_corpus
from tests.fixtures.make_compat import LINES, TRAIN, config

FIXTURE = ROOT / "tests" / "fixtures" / "compat"


def test_a_checkpoint_and_a_release_written_before_translate_as_they_did():
    expected = json.loads((FIXTURE / "expected.json").read_text())
    assert expected["lines"] == LINES
    checkpoint = Translator.load(FIXTURE / "run" / "checkpoint_best.pt", device="cpu")
    assert checkpoint.translate(LINES) == expected["checkpoint"]
    assert Translator.load(FIXTURE / "release", device="cpu").translate(LINES) == expected["release"]


def test_a_run_written_before_resumes_bitwise(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus")
    resumed_dir, straight_dir = tmp_path / "resumed", tmp_path / "straight"
    shutil.copytree(FIXTURE / "run", resumed_dir)
    straight_dir.mkdir()
    updates = TRAIN["max_updates"] + 6
    runs = []
    for run in (resumed_dir, straight_dir):
        cfg = config(corpus, run, max_updates=updates)
        trainer = Trainer(cfg, prepare_data(cfg, run, cfg.model.max_positions), run)
        assert trainer.resume() == (run == resumed_dir)  # (train.py's order: resume, then fit)
        trainer.fit(job_start=0)
        runs.append(trainer)
    resumed, straight = runs
    assert resumed.update == straight.update == updates
    a, b = resumed.model.state_dict(), straight.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
