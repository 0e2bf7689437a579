"""What earlier code wrote keeps working (issue 64): a toy run's checkpoints and release, written by the code of
`OLD_COMMIT` (extracted from git history into a temporary dir, tests/fixtures/make_compat.py), load and translate
as they did then, and the run resumed today ends bitwise where a run trained today from the start ends."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

from mt.decode.translator import Translator
from tests.conftest import ROOT
from tests.fixtures.make_compat import LINES, OLD_COMMIT, TRAIN


@pytest.fixture(scope="module")
def written_before(tmp_path_factory):
    """The fixture as the old commit's code writes it."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", OLD_COMMIT], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {OLD_COMMIT} is not in this clone's history (a shallow clone?)")
    old, out = tmp_path_factory.mktemp("old"), tmp_path_factory.mktemp("compat") / "fixture"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(old, filter="data")
    script = ROOT / "tests" / "fixtures" / "make_compat.py"
    p = subprocess.run([sys.executable, str(script), "--root", str(old), "--out", str(out)], cwd=old,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_a_checkpoint_and_a_release_written_before_translate_as_they_did(written_before):
    expected = json.loads((written_before / "expected.json").read_text())
    assert expected["lines"] == LINES and expected["commit"] == OLD_COMMIT
    assert any(expected["checkpoint"])  # (not all empty: the comparison means something)
    checkpoint = Translator.load(written_before / "run" / "checkpoint_best.pt", device="cpu")
    assert checkpoint.translate(LINES) == expected["checkpoint"]
    assert Translator.load(written_before / "release", device="cpu").translate(LINES) == expected["release"]


def test_a_run_written_before_resumes_bitwise(written_before, tmp_path):
    """Both runs in fresh processes of today's code: the old run resumed for 6 more updates, and a run from the
    start to the same update; their weights are equal."""
    from mt.model import saved

    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    shutil.copytree(written_before / "run", resumed)
    updates = TRAIN["max_updates"] + 6
    script = ROOT / "tests" / "fixtures" / "make_compat.py"
    said = {}
    for run in (resumed, straight):
        p = subprocess.run([sys.executable, str(script), "--root", str(ROOT), "--out", str(run), "--train",
                            str(updates), "--corpus", str(tmp_path / "corpus")], cwd=ROOT, capture_output=True,
                           text=True, timeout=600)  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        said[run] = p.stderr
    assert "resumed from" in said[resumed] and "resumed from" not in said[straight]
    a, b = (saved.load(run / "checkpoint_last.pt") for run in (resumed, straight))
    assert a["update"] == b["update"] == updates
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
