"""Parallel corpora as Hugging Face `datasets`: local files (plain, .gz, TSV, JSONL) or hub datasets.

Every corpus becomes a `datasets.Dataset` with two string columns, `src` and `tgt`, stored as memory-mapped Arrow
(so a corpus never has to fit in RAM), then gains `src_ids`/`tgt_ids` once tokenized. Local files are checked in a
streaming pass first, so bad input fails with the file and line instead of a traceback from deep inside `datasets`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import datasets
import numpy as np

from mt.config import CorpusConfig, DataConfig
from mt.data import hub_offline, tmx
from mt.data.files import find_split, read_lines, shown
from mt.errors import DataError

log = logging.getLogger(__name__)

PAIR_COLUMNS = ("src", "tgt")


# --------------------------------------------------------------------------------------------- reading files


def _parallel_pairs(src_path: str, tgt_path: str, fingerprint: str) -> Iterator[dict]:
    """The pairs of two line-aligned files. Runs only when datasets has no cache for these files (size and mtime
    in `fingerprint`), so a second run never reads the corpus; files of unequal length fail at the end."""
    del fingerprint
    src_lines, tgt_lines = read_lines(Path(src_path)), read_lines(Path(tgt_path))
    n = 0
    for s, t in itertools.zip_longest(src_lines, tgt_lines):
        if s is None or t is None:
            n_src = n + (s is not None) + sum(1 for _ in src_lines)
            n_tgt = n + (t is not None) + sum(1 for _ in tgt_lines)
            raise DataError(
                f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; a parallel corpus needs one "
                "sentence per line on both sides, in the same order"
            )
        n += 1
        yield {"src": s.strip(), "tgt": t.strip()}


def _tsv_pairs(path: str, src_col: int, tgt_col: int, columns: int, fingerprint: str) -> Iterator[dict]:
    del fingerprint
    for lineno, line in enumerate(read_lines(Path(path)), start=1):
        fields = line.split("\t")
        if len(fields) <= max(src_col, tgt_col):
            raise DataError(
                f"{path}:{lineno}: {len(fields)} tab-separated field(s), expected at least "
                f"{max(src_col, tgt_col) + 1}; fix the line or data.columns"
            )
        if len(fields) > columns:  # an unnamed column (an id first?) would be read as a language
            raise DataError(f"{path}:{lineno}: {len(fields)} tab-separated fields but data.columns names {columns}; "
                            "name every column in order, e.g. data.columns=[id,de,en]")  # fmt: skip
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


def _fingerprint(*paths: Path, reads: str = "") -> str:
    """The files' identity (path, size, mtime) and what is read from them (`reads`: a TSV's columns, a JSONL's keys),
    so that the caches keyed on it never serve one direction of a multi-way file for another."""
    h = hashlib.sha256(reads.encode())
    for p in paths:
        st = p.stat()
        h.update(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def generate(gen: Callable[..., Iterator[dict]], gen_kwargs: dict, features, cache_dir: str | None):
    """`datasets.Dataset.from_generator`, cached on the generator's code and arguments; our one-line errors raised
    inside the generator come out as themselves."""
    try:
        return datasets.Dataset.from_generator(gen, gen_kwargs=gen_kwargs, features=features, cache_dir=cache_dir)
    except datasets.exceptions.DatasetGenerationError as e:
        if isinstance(e.__cause__, DataError):
            raise e.__cause__ from None
        raise


TEXT_FEATURES = datasets.Features({"src": datasets.Value("string"), "tgt": datasets.Value("string")})


Reader = tuple[Callable[..., Iterator[dict]], dict]  # a generator of {"src", "tgt"} dicts and its arguments


def _parallel_reader(dir: Path, split: str, cfg: DataConfig) -> Reader:
    src_path, tgt_path = find_split(dir, split, cfg.src_lang), find_split(dir, split, cfg.tgt_lang)
    kwargs = {"src_path": str(src_path), "tgt_path": str(tgt_path), "fingerprint": _fingerprint(src_path, tgt_path)}
    return _parallel_pairs, kwargs


def _tsv_reader(dir: Path, split: str, cfg: DataConfig) -> Reader:
    path = dir / f"{split}.tsv"
    if not path.is_file():
        raise DataError(f"{shown(path)}: no such file; check data.dir and the split name")
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
        "columns": len(cfg.columns),
    }
    kwargs["fingerprint"] = _fingerprint(path, reads=f"tsv columns {kwargs['src_col']} -> {kwargs['tgt_col']}")
    return _tsv_pairs, kwargs


def _jsonl_reader(dir: Path, split: str, cfg: DataConfig) -> Reader:
    path = dir / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{shown(path)}: no such file; check data.dir and the split name")
    reads = f"jsonl keys {cfg.src_lang!r} -> {cfg.tgt_lang!r}"
    kwargs = {"path": str(path), "src": cfg.src_lang, "tgt": cfg.tgt_lang}
    kwargs["fingerprint"] = _fingerprint(path, reads=reads)
    return _jsonl_pairs, kwargs


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
    missing = cfg.hub_fallback and cfg.format != "hub"  # data.dir is not a directory: the Hub stands in
    if missing:
        log.info("data.dir=%r is not a directory: reading %s from the Hugging Face Hub", cfg.dir, where)
    offline = hub_offline.go_offline(f"reading {cfg.hub_name}")
    try:
        ds = datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=hub_split, cache_dir=cfg.cache_dir)
    except Exception as e:  # network, unknown name/split: all end the run the same way
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e).strip() else type(e).__name__
        why = "the Hub cannot be reached and it is not in the local cache" if offline else why
        if missing:
            raise DataError(f"data.dir={cfg.dir!r} is not a directory, and {where} could not be downloaded "
                            f"instead ({why}); put the corpus's files in data.dir, or connect to the "
                            "network") from None  # fmt: skip
        raise DataError(f"{where}: could not load ({why})") from None
    return hub_to_pairs(ds, cfg.src_lang, cfg.tgt_lang, where)


def uses_hub(cfg: DataConfig) -> bool:
    """Whether the corpus is read from the Hugging Face hub (or its cache), not from local files."""
    return cfg.format == "hub" or (cfg.hub_fallback and (cfg.dir is None or not Path(cfg.dir).is_dir()))


def _tmx_reader(dir: Path, split: str, cfg: DataConfig) -> Reader:
    path = tmx.tmx_path(dir, split)
    reads = f"tmx {tmx.primary(cfg.src_lang)} -> {tmx.primary(cfg.tgt_lang)}"
    return tmx.tmx_pairs, {"path": str(path), "src": cfg.src_lang, "tgt": cfg.tgt_lang,
                           "fingerprint": _fingerprint(path, reads=reads)}  # fmt: skip


def _local_reader(cfg: DataConfig, split: str) -> Reader:
    if cfg.dir is None or not Path(cfg.dir).is_dir():
        where = f" ({shown(cfg.dir)})" if cfg.dir and not Path(cfg.dir).is_absolute() else ""
        raise DataError(f"data.dir={cfg.dir!r} is not a directory{where}; point data.dir at the corpus")
    reader = {"parallel": _parallel_reader, "tsv": _tsv_reader, "jsonl": _jsonl_reader, "tmx": _tmx_reader}[cfg.format]
    return reader(Path(cfg.dir), split, cfg)


def check_valid_split(cfg: DataConfig) -> None:
    """A local corpus's validation split, looked for before anything is learnt from the training split: a missing
    one is a one-line error that names the file and the way to do without it (`data.valid_from_train`)."""
    if uses_hub(cfg):
        return
    _local_reader(cfg, cfg.train_split)  # a missing training file (a wrong language, a wrong dir) is said first
    if cfg.valid_from_train:
        return
    try:
        _local_reader(cfg, cfg.valid_split)
    except DataError as e:
        if not (cfg.dir and Path(cfg.dir).is_dir()):
            raise
        raise DataError(f"{e} -- a corpus without a validation split can hold training pairs out as one: add "
                        "data.valid_from_train=500") from None  # fmt: skip


def _count_lines(path: Path) -> int:
    return sum(1 for _ in read_lines(path))


def check_splits(cfg: DataConfig) -> DataConfig:
    """Every split of a local corpus, looked at before any long work (the probe, the BPE, the budget): the training
    and validation splits as `check_valid_split` does; a test split whose files are missing is left out with a
    warning (scored nothing is better than a run that trains its whole budget and then stops on a missing file),
    and one whose two files differ in line count is an error naming both. Returns `cfg` with the test splits that
    exist."""
    check_valid_split(cfg)
    if uses_hub(cfg) or cfg.directions:
        return cfg
    present = []
    for split in cfg.test_splits:
        try:
            reader, kwargs = _local_reader(cfg, split)
        except DataError as e:
            log.warning("test split %r is left out: %s (name the splits to score with data.test_splits=[...], "
                        "or [] for none)", split, e)  # fmt: skip
            continue
        if reader is _parallel_pairs:
            n_src, n_tgt = _count_lines(Path(kwargs["src_path"])), _count_lines(Path(kwargs["tgt_path"]))
            if n_src != n_tgt:
                raise DataError(f"{kwargs['src_path']} has {n_src} lines but {kwargs['tgt_path']} has {n_tgt}; a "
                                "test split needs one sentence per line on both sides, in the same order")  # fmt: skip
        present.append(split)
    return dataclasses.replace(cfg, test_splits=present)


def load_split(cfg: DataConfig, split: str) -> datasets.Dataset:
    """Load one split of the configured corpus as a Dataset of stripped `src`/`tgt` strings."""
    if uses_hub(cfg):
        return _load_hub(split, cfg)
    return generate(*_local_reader(cfg, split), TEXT_FEATURES, cfg.cache_dir)


class TextPairs:
    """A split's non-empty sentence pairs, read on demand: local files are streamed from disk each time (their text
    is never copied into the cache), a hub dataset is iterated from its Arrow table. `fingerprint` identifies the
    content (local files: path, size and mtime), so caches keyed on it are reused without reading the files."""

    def __init__(self, where: str, fingerprint: str, reader: Reader | None = None, table=None):
        self.where, self.fingerprint, self.reader, self.table = where, fingerprint, reader, table

    @classmethod
    def of_split(cls, cfg: DataConfig, split: str) -> TextPairs:
        where = f"{cfg.name}/{split}"
        if uses_hub(cfg):
            table = _load_hub(split, cfg)
            return cls(where, table._fingerprint, table=table)
        reader = _local_reader(cfg, split)
        return cls(where, reader[1]["fingerprint"], reader=reader)

    @classmethod
    def of_table(cls, table: datasets.Dataset, where: str = "train") -> TextPairs:
        """Pairs already in a Dataset with `src`/`tgt` columns."""
        return cls(where, table._fingerprint, table=table)

    def _all(self) -> Iterator[tuple[str, str]]:
        if self.reader is not None:
            gen, kwargs = self.reader
            for pair in gen(**kwargs):
                yield pair["src"], pair["tgt"]
            return
        for batch in self.table.iter(batch_size=2000):
            yield from zip(batch["src"], batch["tgt"])

    def __iter__(self) -> Iterator[tuple[str, str]]:
        """The pairs with text on both sides; counts them in `n_read` and `n_empty` as it goes."""
        self.n_read = self.n_empty = 0
        for s, t in self._all():
            self.n_read += 1
            if s and t:
                yield s, t
            else:
                self.n_empty += 1
        if self.n_read == self.n_empty:
            raise DataError(f"{self.where}: no non-empty sentence pairs; check the files and data.src_lang/tgt_lang")

    def chunks(self, size: int) -> Iterator[list[tuple[str, str]]]:
        it = iter(self)
        while chunk := list(itertools.islice(it, size)):
            yield chunk


class ChainedPairs(TextPairs):
    """Several corpora's pairs one after the other (BPE learns from all the training corpora of a mix)."""

    def __init__(self, parts: list[TextPairs]):
        fingerprint = hashlib.sha256(":".join(p.fingerprint for p in parts).encode()).hexdigest()[:16]
        super().__init__("+".join(p.where for p in parts), fingerprint)
        self.parts = parts

    def _all(self) -> Iterator[tuple[str, str]]:
        for part in self.parts:
            yield from part


def corpus_config(cfg: DataConfig, corpus: CorpusConfig) -> DataConfig:
    """The DataConfig of one corpus of `data.corpora`: its own fields where set, the main corpus's elsewhere."""
    own = {k: getattr(corpus, k) for k in ("format", "dir", "hub_name", "columns", "src_lang", "tgt_lang",
                                           "train_split") if getattr(corpus, k) is not None}  # fmt: skip
    name = corpus.name or (Path(corpus.dir).name if corpus.dir else cfg.name)
    fallback = cfg.hub_fallback and corpus.dir is None and corpus.hub_name is None  # the main corpus, re-read
    return dataclasses.replace(cfg, name=name, corpora=[], hub_fallback=fallback, **own)


def cache_root(cfg: DataConfig) -> Path:
    """Where the tokenized corpora and BPE models of this machine are cached (`data.cache_dir` or datasets')."""
    return Path(cfg.cache_dir or datasets.config.HF_DATASETS_CACHE)


# ------------------------------------------------------------------------------------------------- cleaning


def drop_empty(ds: datasets.Dataset, where: str) -> datasets.Dataset:
    before = len(ds)
    ds = ds.filter(lambda b: [bool(s) and bool(t) for s, t in zip(b["src"], b["tgt"])], batched=True, desc="empty")
    log.info("%s: %d pairs read, %d dropped as empty on either side", where, before, before - len(ds))
    if len(ds) == 0:
        raise DataError(f"{where}: no non-empty sentence pairs; check the files and data.src_lang/tgt_lang")
    return ds


def length_columns(ds: datasets.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The `src_len`/`tgt_len` columns of a tokenized table as numpy arrays: straight from its Arrow columns (4.5M
    rows in 0.04 s, where datasets' numpy formatting takes 4 s), or through datasets for a table seen through a
    row index (a filter's result: minutes at that size, which is why the training set's lengths are kept aside)."""
    if ds._indices is None:  # datasets' row index, set by filter() and select()
        return ds.data.column("src_len").to_numpy(), ds.data.column("tgt_len").to_numpy()
    cols = ds.select_columns(["src_len", "tgt_len"]).with_format("numpy")[:]
    return cols["src_len"], cols["tgt_len"]


def length_filter(src: np.ndarray, tgt: np.ndarray, max_len: int, max_ratio: float, where: str) -> np.ndarray:
    """The rows to keep: at most `max_len` tokens a side and a length ratio of at most `max_ratio`; reports the
    counts."""
    src, tgt = src.astype(np.int64), tgt.astype(np.int64)
    fits = (src <= max_len) & (tgt <= max_len)
    balanced = np.maximum(src, tgt) <= max_ratio * np.minimum(src, tgt)
    kept = np.flatnonzero(fits & balanced)
    n0, n_long, n_ratio = len(src), int((~fits).sum()), int((fits & ~balanced).sum())
    log.info(
        "%s: %d pairs; removed %d longer than %d tokens, %d with length ratio > %g; %d left",
        where,
        n0,
        n_long,
        max_len,
        n_ratio,
        max_ratio,
        len(kept),
    )
    if len(kept) == 0:
        raise DataError(
            f"{where}: no pairs left after filtering (max_len={max_len}, max_ratio={max_ratio}); "
            "check the corpus or relax data.max_len / data.max_ratio"
        )
    return kept


def select_rows(ds: datasets.Dataset, rows: np.ndarray) -> datasets.Dataset:
    """`ds` seen through `rows` (an index over the memory-mapped table, not a copy)."""
    if len(rows) == len(ds):
        return ds
    key = hashlib.sha256(ds._fingerprint.encode() + rows.tobytes()).hexdigest()[:32]
    return ds.select(rows, new_fingerprint=key, writer_batch_size=100_000)


def filter_lengths(ds: datasets.Dataset, max_len: int, max_ratio: float, where: str) -> datasets.Dataset:
    return select_rows(ds, length_filter(*length_columns(ds), max_len, max_ratio, where))


def describe(cfg: DataConfig) -> str:
    where = cfg.dir if cfg.format != "hub" else cfg.hub_name
    return f"{cfg.name} {cfg.src_lang}->{cfg.tgt_lang} ({cfg.format}: {where})"
