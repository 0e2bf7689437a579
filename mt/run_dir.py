"""The files of a run dir that several stages look for: the last checkpoint and the copy kept beside it while
a new one is written (`resume_path`, `previous`), and what a failed start leaves (`remove_if_unused`)."""

from __future__ import annotations

import shutil
from pathlib import Path

HYDRA_FILES = {".hydra", "train.log"}  # what Hydra writes into a run dir before train.py's own code runs

PREVIOUS_SUFFIX = ".prev"


def previous(path: Path) -> Path:
    return path.with_name(path.name + PREVIOUS_SUFFIX)


def resume_path(resume: str, run_dir: Path) -> Path | None:
    """The checkpoint `train.resume` names: a path, or with `auto` the run dir's last one if there is one."""
    if resume == "never":
        return None
    if resume != "auto":
        return Path(resume)
    last = run_dir / "checkpoint_last.pt"
    return last if last.is_file() or previous(last).is_file() else None


def remove_if_unused(run_dir: Path) -> bool:
    """Remove `run_dir` if it holds nothing but what Hydra wrote for a command that then failed before making
    anything (a bad path, a refused setting): no stray run dir per typo. A dir with anything else stays as it is."""
    if not run_dir.is_dir() or {p.name for p in run_dir.iterdir()} - HYDRA_FILES:
        return False
    shutil.rmtree(run_dir)
    return True
