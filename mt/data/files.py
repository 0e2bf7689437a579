"""Text files as the toolkit reads them: one UTF-8 line at a time (plain or gzipped), with bad bytes reported by
file and line, and the local file of one side of a split.

Apart from `mt.data.read` (which turns corpora into `datasets`) so that the entry points that only read text,
translate.py and `mt.compare`, start without importing `datasets` (about a second and a half of a slow core).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

from mt.config import DataConfig
from mt.errors import DataError

UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # little- and big-endian


def open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115


def read_lines(path: Path) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (plain or gzipped) without their newline.

    Lines are decoded one by one and strictly: bad bytes are reported with their line number, not silently
    replaced.
    """
    lineno = 0
    try:
        with open_binary(path) as f:
            for lineno, raw in enumerate(f, start=1):  # noqa: B007
                if lineno == 1 and raw.startswith(UTF16_BOMS):
                    raise DataError(f"{path}: a UTF-16 file (it starts with UTF-16's byte-order mark); re-encode it "
                                    f"as UTF-8: iconv -f utf-16 -t utf-8 {path.name} > {path.name}.utf8")  # fmt: skip
                yield raw.decode("utf-8").rstrip("\n").rstrip("\r")
    except UnicodeDecodeError as e:
        # latin1 is the usual culprit of stray bytes; a file full of NUL bytes is UTF-16 without its mark
        encoding = "utf-16" if b"\x00" in e.object else "latin1"
        raise DataError(
            f"{path}:{lineno}: bytes that are not UTF-8 ({e.reason} at byte {e.start} of the line); "
            f"re-encode the file as UTF-8 (e.g. iconv -f {encoding} -t utf-8)"
        ) from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise DataError(f"{path}: not a readable gzip file ({e}); re-download or gunzip it") from None


def read_bytes(path: Path) -> bytes:
    """The whole content of a plain or gzipped file."""
    try:
        with open_binary(path) as f:
            return f.read()
    except (gzip.BadGzipFile, EOFError) as e:
        raise DataError(f"{path}: not a readable gzip file ({e}); re-download or gunzip it") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror}); check the path and its permissions") from None


def shown(path: Path | str) -> str:
    """A path as an error names it: absolute (a relative one from where the command ran), so that a data.dir meant
    from elsewhere is seen at once."""
    return str(Path(path).absolute())


def find_split(dir: Path, split: str, lang: str) -> Path:
    """`{dir}/{split}.{lang}`, or the same with `.gz`."""
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (dir / name).is_file():
            return dir / name
    hint = layout_hint(dir, split, lang)
    names = sorted(p.name for p in dir.iterdir()) if dir.is_dir() else []
    there = f"files there: {', '.join(names[:12])}" if names else "the folder is empty"
    raise DataError(
        f"{shown(dir / f'{split}.{lang}')}[.gz]: no such file; "
        + (hint or "check data.dir, the split name and the language")
        + f" ({there})"
    )


def layout_hint(dir: Path, split: str, lang: str) -> str | None:
    """What to set for a folder laid out otherwise: a TSV of the split, or OPUS's Moses files (EMEA.de-en.de)."""
    if not dir.is_dir():
        return None
    if any((dir / f"{split}.tmx{gz}").is_file() for gz in ("", ".gz")):
        return f"the folder holds {split}.tmx: add data.format=tmx"
    if any((dir / f"{split}.tsv{gz}").is_file() for gz in ("", ".gz")):
        return f"the folder holds {split}.tsv: add data.format=tsv data.columns=[..] (its columns' languages in order)"
    opus = re.compile(rf"[^.]+\.[\w-]+-[\w-]+\.{re.escape(lang)}(\.gz)?")  # NAME.de-en.de
    moses = sorted(p.name for p in dir.iterdir() if opus.fullmatch(p.name))
    if moses:
        name = moses[0].removesuffix(".gz").removesuffix(f".{lang}")
        return (f"the folder holds OPUS's {moses[0]}: name its split, e.g. data.train_split={name} (data.valid_split, "
                "data.test_splits for the others)")  # fmt: skip
    return None


def split_path(cfg: DataConfig, split: str, lang: str) -> Path | None:
    """The raw local file of one side of a split (used as sacreBLEU reference), if the corpus is one."""
    if cfg.format != "parallel" or cfg.dir is None or not Path(cfg.dir).is_dir():
        return None
    try:
        return find_split(Path(cfg.dir), split, lang)
    except DataError:
        return None
