"""Parallel corpora as Hugging Face `datasets`: local files (plain, .gz, TSV, JSONL) or hub datasets.

Every corpus becomes a `datasets.Dataset` with two string columns, `src` and `tgt`, stored as memory-mapped Arrow
(so a corpus never has to fit in RAM), then gains `src_ids`/`tgt_ids` once tokenized. Local files are checked in a
streaming pass first, so bad input fails with the file and line instead of a traceback from deep inside `datasets`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import datasets

from mt.config import DataConfig

log = logging.getLogger(__name__)

PAIR_COLUMNS = ("src", "tgt")


class DataError(ValueError):
    """Unusable input data; the message names the file (and line) and what to do."""


# --------------------------------------------------------------------------------------------- reading files


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
                yield raw.decode("utf-8").rstrip("\n").rstrip("\r")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}:{lineno}: bytes that are not UTF-8 ({e.reason} at byte {e.start} of the line); "
            "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
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


def _find(dir: Path, split: str, lang: str) -> Path:
    """`{dir}/{split}.{lang}`, or the same with `.gz`."""
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (dir / name).is_file():
            return dir / name
    raise DataError(
        f"{dir / f'{split}.{lang}'}[.gz]: no such file; check data.dir, the split name and the language "
        f"(files there: {', '.join(sorted(p.name for p in dir.iterdir())[:12]) if dir.is_dir() else 'none'})"
    )


def _count_lines(path: Path) -> int:
    return sum(1 for _ in read_lines(path))


def _parallel_pairs(src_path: str, tgt_path: str, fingerprint: str) -> Iterator[dict]:
    del fingerprint  # only part of the cache key: the files' size and mtime
    for s, t in zip(read_lines(Path(src_path)), read_lines(Path(tgt_path)), strict=True):
        yield {"src": s.strip(), "tgt": t.strip()}


def _tsv_pairs(path: str, src_col: int, tgt_col: int, fingerprint: str) -> Iterator[dict]:
    del fingerprint
    for lineno, line in enumerate(read_lines(Path(path)), start=1):
        fields = line.split("\t")
        if len(fields) <= max(src_col, tgt_col):
            raise DataError(
                f"{path}:{lineno}: {len(fields)} tab-separated field(s), expected at least "
                f"{max(src_col, tgt_col) + 1}; fix the line or data.columns"
            )
        yield {"src": fields[src_col].strip(), "tgt": fields[tgt_col].strip()}


def _json_pair(record: dict, src: str, tgt: str) -> tuple[str, str] | None:
    """Map one record of the common layouts ({"en": .., "de": ..} or {"translation": {...}}) to a pair."""
    fields = record.get("translation", record)
    if not isinstance(fields, dict) or src not in fields or tgt not in fields:
        return None
    return str(fields[src]), str(fields[tgt])


def _jsonl_pairs(path: str, src: str, tgt: str, fingerprint: str) -> Iterator[dict]:
    del fingerprint
    for lineno, line in enumerate(read_lines(Path(path)), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}); fix or remove the line") from None
        pair = _json_pair(record, src, tgt) if isinstance(record, dict) else None
        if pair is None:
            keys = sorted(record.get("translation", record)) if isinstance(record, dict) else []
            raise DataError(
                f"{path}:{lineno}: no {src!r} and {tgt!r} keys (found {keys}); "
                "set data.src_lang/data.tgt_lang to keys of the file"
            )
        yield {"src": pair[0].strip(), "tgt": pair[1].strip()}


def _fingerprint(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _from_generator(gen, gen_kwargs: dict, cfg: DataConfig) -> datasets.Dataset:
    features = datasets.Features({"src": datasets.Value("string"), "tgt": datasets.Value("string")})
    try:
        return datasets.Dataset.from_generator(gen, gen_kwargs=gen_kwargs, features=features, cache_dir=cfg.cache_dir)
    except datasets.exceptions.DatasetGenerationError as e:
        # Our own one-line errors are raised inside the generator; datasets wraps them.
        if isinstance(e.__cause__, DataError):
            raise e.__cause__ from None
        raise


def _load_parallel(dir: Path, split: str, cfg: DataConfig) -> datasets.Dataset:
    src_path, tgt_path = _find(dir, split, cfg.src_lang), _find(dir, split, cfg.tgt_lang)
    n_src, n_tgt = _count_lines(src_path), _count_lines(tgt_path)
    if n_src != n_tgt:
        raise DataError(
            f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; a parallel corpus needs one "
            "sentence per line on both sides, in the same order"
        )
    kwargs = {"src_path": str(src_path), "tgt_path": str(tgt_path), "fingerprint": _fingerprint(src_path, tgt_path)}
    return _from_generator(_parallel_pairs, kwargs, cfg)


def _load_tsv(dir: Path, split: str, cfg: DataConfig) -> datasets.Dataset:
    path = dir / f"{split}.tsv"
    if not path.is_file():
        raise DataError(f"{path}: no such file; check data.dir and the split name")
    for lang in (cfg.src_lang, cfg.tgt_lang):
        if lang not in cfg.columns:
            raise DataError(
                f"{path}: language {lang!r} is not in data.columns={list(cfg.columns)}; "
                "set data.columns to the TSV's column languages in order"
            )
    kwargs = {
        "path": str(path),
        "src_col": cfg.columns.index(cfg.src_lang),
        "tgt_col": cfg.columns.index(cfg.tgt_lang),
        "fingerprint": _fingerprint(path),
    }
    return _from_generator(_tsv_pairs, kwargs, cfg)


def _load_jsonl(dir: Path, split: str, cfg: DataConfig) -> datasets.Dataset:
    path = dir / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: no such file; check data.dir and the split name")
    kwargs = {"path": str(path), "src": cfg.src_lang, "tgt": cfg.tgt_lang, "fingerprint": _fingerprint(path)}
    return _from_generator(_jsonl_pairs, kwargs, cfg)


def hub_to_pairs(ds: datasets.Dataset, src: str, tgt: str, where: str) -> datasets.Dataset:
    """Map a hub dataset's layout (flat language columns or a `translation` dict) to `src`/`tgt` columns."""
    columns = ds.column_names
    if "translation" in columns:
        langs = set(ds.features["translation"].languages if hasattr(ds.features["translation"], "languages") else [])
        if not langs:
            langs = set(ds[0]["translation"])
        if src not in langs or tgt not in langs:
            raise DataError(f"{where}: languages are {sorted(langs)}, not {src!r}/{tgt!r}; fix data.src_lang/tgt_lang")
        fn = lambda b: {  # noqa: E731
            "src": [t[src].strip() for t in b["translation"]],
            "tgt": [t[tgt].strip() for t in b["translation"]],
        }
    elif src in columns and tgt in columns:
        fn = lambda b: {"src": [s.strip() for s in b[src]], "tgt": [t.strip() for t in b[tgt]]}  # noqa: E731
    else:
        raise DataError(f"{where}: columns {columns} have neither 'translation' nor {src!r}/{tgt!r}; fix data.*_lang")
    return ds.map(fn, batched=True, remove_columns=columns, desc="pairs")


def _load_hub(split: str, cfg: DataConfig) -> datasets.Dataset:
    if not cfg.hub_name:
        raise DataError(f"data.hub_name is not set for data {cfg.name!r}; set it or use a local data.dir")
    hub_split = cfg.hub_splits.get(split, split)
    where = f"hub dataset {cfg.hub_name}" + (f" ({cfg.hub_config})" if cfg.hub_config else "") + f" split {hub_split}"
    try:
        ds = datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=hub_split, cache_dir=cfg.cache_dir)
    except Exception as e:  # network, unknown name/split: all end the run the same way
        raise DataError(f"{where}: could not load ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    return hub_to_pairs(ds, cfg.src_lang, cfg.tgt_lang, where)


def load_split(cfg: DataConfig, split: str) -> datasets.Dataset:
    """Load one split of the configured corpus as a Dataset of stripped `src`/`tgt` strings."""
    use_hub = cfg.format == "hub" or (cfg.hub_fallback and (cfg.dir is None or not Path(cfg.dir).is_dir()))
    if use_hub:
        return _load_hub(split, cfg)
    if cfg.dir is None or not Path(cfg.dir).is_dir():
        raise DataError(f"data.dir={cfg.dir!r} is not a directory; point data.dir at the corpus")
    loader = {"parallel": _load_parallel, "tsv": _load_tsv, "jsonl": _load_jsonl}[cfg.format]
    return loader(Path(cfg.dir), split, cfg)


def split_path(cfg: DataConfig, split: str, lang: str) -> Path | None:
    """The raw local file of one side of a split (used as sacreBLEU reference), if the corpus is one."""
    if cfg.format != "parallel" or cfg.dir is None or not Path(cfg.dir).is_dir():
        return None
    try:
        return _find(Path(cfg.dir), split, lang)
    except DataError:
        return None


# ------------------------------------------------------------------------------------------------- cleaning


def drop_empty(ds: datasets.Dataset, where: str) -> datasets.Dataset:
    before = len(ds)
    ds = ds.filter(lambda b: [bool(s) and bool(t) for s, t in zip(b["src"], b["tgt"])], batched=True, desc="empty")
    log.info("%s: %d pairs read, %d dropped as empty on either side", where, before, before - len(ds))
    if len(ds) == 0:
        raise DataError(f"{where}: no non-empty sentence pairs; check the files and data.src_lang/tgt_lang")
    return ds


def filter_lengths(ds: datasets.Dataset, max_len: int, max_ratio: float, where: str) -> datasets.Dataset:
    """Drop tokenized pairs longer than `max_len` tokens or with a length ratio above `max_ratio`; report counts."""
    n0 = len(ds)
    ds = ds.filter(
        lambda b: [len(s) <= max_len and len(t) <= max_len for s, t in zip(b["src_ids"], b["tgt_ids"])],
        batched=True,
        desc="max_len",
    )
    n1 = len(ds)
    ds = ds.filter(
        lambda b: [max(len(s), len(t)) <= max_ratio * min(len(s), len(t)) for s, t in zip(b["src_ids"], b["tgt_ids"])],
        batched=True,
        desc="ratio",
    )
    n2 = len(ds)
    log.info(
        "%s: %d pairs; removed %d longer than %d tokens, %d with length ratio > %g; %d left",
        where,
        n0,
        n0 - n1,
        max_len,
        n1 - n2,
        max_ratio,
        n2,
    )
    if n2 == 0:
        raise DataError(
            f"{where}: no pairs left after filtering (max_len={max_len}, max_ratio={max_ratio}); "
            "check the corpus or relax data.max_len / data.max_ratio"
        )
    return ds


def describe(cfg: DataConfig) -> str:
    where = cfg.dir if cfg.format != "hub" else cfg.hub_name
    return f"{cfg.name} {cfg.src_lang}->{cfg.tgt_lang} ({cfg.format}: {where})"
