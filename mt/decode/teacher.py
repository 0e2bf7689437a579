"""Stage 1 of sequence-level knowledge distillation (Kim & Rush 2016): a teacher's translations of a source text,
written as a parallel corpus that a student trains on (mt/train/distill.py).

The text can be millions of lines, so it streams: `chunk_lines` lines are read, translated with the teacher's own
decoding settings and appended to `train.{src}` / `train.{tgt}` in the cache dir, then the count of lines and the
two files' sizes are written to `progress.json` (atomically, after an fsync). A run stopped anywhere (Ctrl-C,
kill -9, a power cut) starts again from the last recorded chunk: the files are cut back to the recorded sizes, the
lines recorded are skipped, and the chunks are the same as an uninterrupted run's (line k*chunk_lines onwards), so
the output is the same bytes. The cache dir is named by a digest of (teacher, text, decoding settings): a second
student of the same teacher on the same text starts at stage 2.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

from mt.data.files import read_lines
from mt.errors import DataError

log = logging.getLogger(__name__)
PROGRESS = "progress.json"
KEY_FILE = "key.json"
WEIGHT_SUFFIXES = (".pt", ".safetensors", ".bin")  # the files that make a model what it is


def model_identity(ckpt: dict) -> dict:
    """What identifies a loaded model for the cache: its path and the size and time of its weights file(s)."""
    path = Path(ckpt["path"]).resolve()
    weights = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    return {"path": str(path), "weights": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in weights]}


def cache_key(teachers: list[dict], text: str, decode) -> tuple[str, dict]:
    """(digest, what it digests) of (the teacher models, the text's fingerprint, the decoding settings)."""
    key = {"teacher": [model_identity(c) for c in teachers], "text": text, "decode": asdict(decode)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16], key


@dataclass
class Progress:
    lines: int = 0  # source lines translated and written
    src_bytes: int = 0
    tgt_bytes: int = 0
    seconds: float = 0.0  # spent translating them (for the plan: lines/s)
    complete: bool = False  # every line of the text is done

    @property
    def lines_per_s(self) -> float | None:
        return self.lines / self.seconds if self.lines and self.seconds > 0 else None


class TeacherText:
    """The cache dir of one (teacher, text, settings): `train.{src_lang}` and `train.{tgt_lang}`, aligned by line
    (the source lines as translated, stripped; the teacher's outputs), and `progress.json`."""

    def __init__(self, root: Path, digest: str, key: dict, src_lang: str, tgt_lang: str):
        self.dir = root / digest
        self.key, self.src_lang, self.tgt_lang = key, src_lang, tgt_lang
        self.src_path, self.tgt_path = self.dir / f"train.{src_lang}", self.dir / f"train.{tgt_lang}"

    def progress(self) -> Progress:
        path = self.dir / PROGRESS
        if not path.is_file():
            return Progress()
        try:
            return Progress(**json.loads(path.read_text()))
        except (ValueError, TypeError) as e:
            raise DataError(f"{path}: not readable ({e}); delete {self.dir} to translate again") from None

    def _record(self, progress: Progress) -> None:
        tmp = self.dir / (PROGRESS + ".tmp")
        tmp.write_text(json.dumps(asdict(progress)) + "\n")
        os.replace(tmp, self.dir / PROGRESS)

    def fill(
        self,
        translate: Callable[[list[str]], list[str]],
        lines: Callable[[], Iterator[str]],
        wanted: int,
        total: int,
        chunk_lines: int = 1000,
    ) -> Progress:
        """Translate the text's lines (`lines()` iterates them from the first) until `wanted` of them are done,
        `chunk_lines` at a time; `total`: the text's lines (for the progress and for `complete`). Resumes from
        `progress.json`; another process filling the same dir is refused."""
        self.dir.mkdir(parents=True, exist_ok=True)
        key_path = self.dir / KEY_FILE
        if not key_path.is_file():
            key_path.write_text(json.dumps(self.key, indent=1) + "\n")
        with open(self.dir / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DataError(f"{self.dir}: another process is writing this teacher's translations; wait for it "
                                "(its output is then reused)") from None  # fmt: skip
            return self._fill(translate, lines, min(wanted, total), total, chunk_lines)

    def _fill(self, translate, lines, wanted: int, total: int, chunk_lines: int) -> Progress:
        done = self.progress()
        for path, size in ((self.src_path, done.src_bytes), (self.tgt_path, done.tgt_bytes)):
            if not path.is_file() or path.stat().st_size != size:
                with open(path, "ab") as f:  # a chunk written after the last record (a kill mid-chunk) is cut off
                    f.truncate(size)
        if done.lines >= wanted:
            return done
        if done.lines:
            log.info("teacher: %s lines of %s already translated (%s); continuing", f"{done.lines:,}",
                     f"{total:,}", self.dir)  # fmt: skip
        source = islice(lines(), done.lines, None)
        start_lines, start = done.lines, time.perf_counter()
        with open(self.src_path, "ab") as src_out, open(self.tgt_path, "ab") as tgt_out:
            while done.lines < wanted:
                # chunks start at multiples of chunk_lines, whatever the run stopped at: a resumed run decodes
                # the same batches as an uninterrupted one, so its output is the same bytes
                size = min(chunk_lines - done.lines % chunk_lines, wanted - done.lines)
                chunk = list(islice(source, size))
                if not chunk:
                    raise DataError(f"the text ended after {done.lines:,} lines where {total:,} were counted; was "
                                    "it changed while it was translated?")  # fmt: skip
                t0 = time.perf_counter()
                outputs = translate(chunk)
                seconds = time.perf_counter() - t0
                src_bytes = "".join(one_line(s) + "\n" for s in chunk).encode()
                tgt_bytes = "".join(one_line(t) + "\n" for t in outputs).encode()
                for f, data in ((src_out, src_bytes), (tgt_out, tgt_bytes)):
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                done = Progress(done.lines + len(chunk), done.src_bytes + len(src_bytes),
                                done.tgt_bytes + len(tgt_bytes), done.seconds + seconds)  # fmt: skip
                done.complete = done.lines >= total
                self._record(done)
                self._log(done, start_lines, time.perf_counter() - start, wanted)
        return done

    @staticmethod
    def _log(done: Progress, start_lines: int, elapsed: float, wanted: int) -> None:
        rate = (done.lines - start_lines) / max(elapsed, 1e-9)
        eta = (wanted - done.lines) / max(rate, 1e-9)
        log.info("teacher: %s / %s lines (%.0f%%), %.1f lines/s, %s left", f"{done.lines:,}", f"{wanted:,}",
                 100 * done.lines / max(wanted, 1), rate, minutes(eta))  # fmt: skip


def one_line(text: str) -> str:
    """A text as one line of a corpus file: stripped, any line break inside it a space."""
    return " ".join(text.splitlines()).strip()


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def count_text_lines(path: Path, key: str = "distill.source_text") -> int:
    """The lines of a text file (`key`: the setting that named it), read strictly as UTF-8 now, so that a file
    that cannot be read fails before any long work; an empty one is an error."""
    if not path.is_file():
        raise DataError(f"{key}={path}: no such file; give a text file, one sentence a line")
    n = text = 0
    for line in read_lines(path):
        n, text = n + 1, text + bool(line.strip())
    if not text:
        raise DataError(f"{key}={path}: no text in it; give a text file, one sentence a line")
    return n
