"""translate.py's input and output: lines read from a file or stdin (bounded memory, at once from a terminal),
decoded strictly or with replacement, aligned prefix/constraint files, and the output lines (n-best too)."""

from __future__ import annotations

import logging
import os
import select
import sys
from collections.abc import Iterator
from pathlib import Path

from mt.config import ConfigError, TranslateConfig
from mt.data import files
from mt.data.tokenizer import Vocabs
from mt.decode.search import Hypothesis
from mt.errors import DataError

log = logging.getLogger(__name__)


def read_input(path: str, errors: str = "strict") -> list[str]:
    """Input lines from stdin or a file (plain or .gz); see `split_lines`."""
    if path == "-":
        return split_lines(sys.stdin.buffer.read(), "stdin", errors)
    if not Path(path).is_file():
        raise DataError(f"input={path}: no such file; give an existing file or - for stdin")
    return split_lines(files.read_bytes(Path(path)), path, errors)


def input_chunks(path: str, errors: str, size: int, indent: bool = False) -> Iterator[list[str]]:
    """The input's lines (as `split_lines` cuts and decodes them) `size` at a time, read as they are needed, so that
    memory stays bounded whatever the input's length. From stdin a chunk also ends when no more input is waiting:
    a person at a terminal, or a program that writes a line and waits for its translation, gets it at once, while
    a file or a fast pipe is still read in large chunks. The file is opened now: a missing one fails before any
    work. Lines are stripped, or with `indent` (documents: `split=true`) only at their end."""
    if path == "-":
        raw_lines, name = waiting_lines(sys.stdin.buffer.fileno()), "stdin"
    elif Path(path).is_file():
        raw_lines, name = (files.open_binary(Path(path)), None), path
    else:
        raise DataError(f"input={path}: no such file; give an existing file or - for stdin")

    def chunks() -> Iterator[list[str]]:
        chunk, replaced, lineno = [], 0, 0
        lines, flushes = raw_lines
        try:
            for lineno, raw in enumerate(lines, start=1):  # binary lines end at b"\n" only
                line = decode_line(raw.rstrip(b"\n"), name, lineno, errors, indent)
                replaced += "\ufffd" in line and errors == "replace"
                chunk.append(line)
                if len(chunk) == size or (flushes is not None and flushes.nothing_waiting()):
                    yield chunk
                    chunk = []
        except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
            raise DataError(f"{name}:{lineno + 1}: cannot be read ({e}); check or re-create the file") from None
        if chunk:
            yield chunk
        if replaced:
            log.warning("%s: %d lines had bytes that are not UTF-8, replaced by U+FFFD", name, replaced)

    return chunks()


class WaitingLines:
    """The lines of a file descriptor, read with os.read as they arrive; `nothing_waiting()` tells whether the lines
    read so far are all there is for now (no complete line buffered, and select says none is waiting)."""

    def __init__(self, fd: int):
        self.fd, self.buffered, self.rest = fd, [], b""

    def __iter__(self) -> Iterator[bytes]:
        while True:
            if not self.buffered:
                block = os.read(self.fd, 1 << 16)  # what is there, up to 64 KiB; blocks only when nothing is
                if not block:
                    break
                *self.buffered, self.rest = (self.rest + block).split(b"\n")
                self.buffered.reverse()
                continue
            yield self.buffered.pop()
        if self.rest:
            yield self.rest

    def nothing_waiting(self) -> bool:
        return not self.buffered and not select.select([self.fd], [], [], 0)[0]


def waiting_lines(fd: int) -> tuple[WaitingLines, WaitingLines]:
    lines = WaitingLines(fd)
    return lines, lines


def decode_line(raw: bytes, name: str, lineno: int, errors: str, indent: bool = False) -> str:
    try:
        return raw.decode("utf-8").rstrip() if indent else raw.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        if errors != "replace":
            raise DataError(
                f"{name}:{lineno}: bytes that are not UTF-8 ({e.reason}); re-encode the input as UTF-8 "
                "or set input_errors=replace"
            ) from None
        line = raw.decode("utf-8", errors="replace")
        return line.rstrip() if indent else line.strip()


def split_lines(raw: bytes, name: str, errors: str = "strict") -> list[str]:
    """Lines of `raw`, each stripped. Lines end at "\n" only (a "\r", U+2028 or U+0085 inside a line stays in it,
    so there is one output line per input line). Bytes that are not UTF-8 stop with an error naming the line, or
    with `errors="replace"` become U+FFFD with a warning."""
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out, replaced = [], []
    for i, line in enumerate(lines, start=1):
        out.append(decode_line(line, name, i, errors))
        if errors == "replace" and "\ufffd" in out[-1]:
            replaced.append(i)
    if replaced:
        log.warning("%s: %d lines had bytes that are not UTF-8, replaced by U+FFFD (first: line %d)", name,
                    len(replaced), replaced[0])  # fmt: skip
    return out


def open_output(path: str):
    """The output stream, opened before decoding so that an unwritable path fails at once, not after the work."""
    if path == "-":
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8", newline="\n")
    except OSError as e:
        raise ConfigError(f"output={path}: cannot be written ({e.strerror}); give a writable path") from None


def output_lines(
    hyps: list[list[Hypothesis]], texts: list[str], vocabs: Vocabs, nbest: int, first: int = 0
) -> list[str]:
    """One line per input, or with nbest > 1 Moses-style "i ||| hypothesis ||| score" lines (i from `first`)."""
    if nbest == 1:
        return texts
    return [f"{first + i} ||| {vocabs.tgt.decode(h.tokens)} ||| {h.score:.4f}" for i, hs in enumerate(hyps) for h in hs]


def write_output(stream, lines: list[str]) -> None:
    stream.write("".join(line + "\n" for line in lines))
    stream.flush()


class AlignedFile:
    """translate.py's `prefix=FILE` and `constraints=FILE`: one line per input line (an empty line = none), read
    alongside the input's chunks; `key` names the option in errors."""

    def __init__(self, path: str, key: str = "prefix", what: str = "one prefix per input line"):
        self.path, self.key, self.what, self.read = path, key, what, 0
        if not Path(path).is_file():
            raise DataError(f"{key}={path}: no such file; give {what}")
        self.lines = input_chunks(path, "strict", 1)

    def take(self, n: int) -> list[str]:
        out = [line for _, [line] in zip(range(n), self.lines)]
        if len(out) < n:
            raise DataError(f"{self.key}={self.path}: has {self.read + len(out)} lines but the input has more "
                                 f"(line {self.read + len(out) + 1}); give {self.what}")  # fmt: skip
        self.read += n
        return out

    def finish(self) -> None:
        if next(self.lines, None) is not None:
            raise DataError(f"{self.key}={self.path}: line {self.read + 1} has no input line (the input has "
                                 f"{self.read}); give {self.what}")  # fmt: skip


def constraint_file(cfg: TranslateConfig) -> AlignedFile | None:
    if not cfg.constraints:
        return None
    return AlignedFile(cfg.constraints, "constraints", "one line of tab-separated target phrases per input line")
