"""The output directory of an export: written only where nothing of the user's can be lost.

An export writes into a staging directory inside OUT, then moves its files in and records their names in a marker
file (`.mt-export.json`). OUT must be new, empty, or hold an earlier export of the same kind (its marker); a later
export replaces only the files the marker lists, so a file the user put beside them stays, and a directory that
holds the exported checkpoint (its run dir, the working directory above it) is never written to at all.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mt.config import ConfigError

MARKER = ".mt-export.json"


def _previous_files(out: Path, kind: str, source: Path) -> list[str]:
    """The files an earlier `kind` export wrote in `out` (none for a new or empty directory), or a ConfigError
    when `out` may not be written to."""
    src, target = source.resolve(), out.resolve()
    if target == src or target in src.parents:
        raise ConfigError(f"{out}: holds the checkpoint being exported ({source}); give a new directory for the "
                          f"{kind} export, e.g. {out / kind}")  # fmt: skip
    if not out.exists():
        return []
    if not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory; give a new directory for the {kind} export")
    if not any(out.iterdir()):
        return []
    marker = out / MARKER
    try:
        record = json.loads(marker.read_text())
        previous_kind, files = record["kind"], list(record["files"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{out}: not empty and not an earlier {kind} export (no readable {MARKER}); give a new or "
                          "empty directory: an export never deletes files it did not write") from None  # fmt: skip
    if previous_kind != kind:
        raise ConfigError(f"{out}: holds a {previous_kind} export; give another directory for the {kind} export")
    return [name for name in files if "/" not in name and name not in ("", ".", "..", MARKER)]


def _file_mode() -> int:
    """The permissions a new file gets under the process's umask (read with os.umask, which also sets it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def export_dir(out: Path, kind: str, source: Path) -> Iterator[Path]:
    """A staging directory to write the export into; when the block ends without error, its files replace the
    earlier export's in `out` and the marker lists them. On an error `out` is as it was."""
    out = Path(out)
    previous = _previous_files(out, kind, source)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{kind}-staging-", dir=out))
    try:
        yield staging
        written = sorted(p.name for p in staging.iterdir())
        theirs = [name for name in written if (out / name).exists() and name not in previous]
        if theirs:
            raise ConfigError(f"{out / theirs[0]}: a file this export did not write is in the way; move it or give "
                              "another directory")  # fmt: skip
        mode = _file_mode()
        for name in written:
            if (staging / name).is_file():  # as a file the user's umask makes (some writers create them 0600)
                os.chmod(staging / name, mode)
            os.replace(staging / name, out / name)
        for name in set(previous) - set(written):  # an earlier export's file this one does not write again
            (out / name).unlink(missing_ok=True)
        record = {"kind": kind, "source": str(source), "files": written}
        (out / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # our own temporary directory, empty after a success
