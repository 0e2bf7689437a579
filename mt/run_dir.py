"""The files of a run dir that several stages look for: the last checkpoint and the copy kept beside it while
a new one is written (`resume_path`, `previous`)."""

from __future__ import annotations

from pathlib import Path

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
