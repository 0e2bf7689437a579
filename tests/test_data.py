"""Loading parallel corpora (plain, .gz, TSV, JSONL, hub layouts) and every bad-input error."""

import gzip
import json

import datasets
import pytest

from mt.config import DataConfig
from mt.data import read
from tests.conftest import MULTI30K, needs_multi30k


def cfg(dir, **kw) -> DataConfig:
    return DataConfig(
        name="t", dir=str(dir), src_lang=kw.pop("src_lang", "en"), tgt_lang=kw.pop("tgt_lang", "de"), **kw
    )


def write(path, lines, gz=False):
    text = "".join(line + "\n" for line in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("gz", [False, True])
def test_parallel_plain_and_gz(tmp_path, gz):
    suffix = ".gz" if gz else ""
    write(tmp_path / f"train.en{suffix}", ["  a cat ", "a dog", ""], gz)
    write(tmp_path / f"train.de{suffix}", ["eine Katze", "ein Hund", "leer"], gz)
    ds = read.load_split(cfg(tmp_path), "train")
    assert ds["src"] == ["a cat", "a dog", ""] and ds["tgt"] == ["eine Katze", "ein Hund", "leer"]
    assert len(read.drop_empty(ds, "train")) == 2


def test_direction_is_configurable(tmp_path):
    write(tmp_path / "train.en", ["a cat"])
    write(tmp_path / "train.de", ["eine Katze"])
    ds = read.load_split(cfg(tmp_path, src_lang="de", tgt_lang="en"), "train")
    assert ds[0] == {"src": "eine Katze", "tgt": "a cat"}


def test_tsv(tmp_path):
    write(tmp_path / "train.tsv", ["eine Katze\ta cat", "ein Hund\ta dog"])
    ds = read.load_split(cfg(tmp_path, format="tsv", columns=["de", "en"]), "train")
    assert ds["src"] == ["a cat", "a dog"] and ds["tgt"] == ["eine Katze", "ein Hund"]


def test_tsv_short_line_names_line(tmp_path):
    write(tmp_path / "train.tsv", ["eine Katze\ta cat", "no tab here"])
    with pytest.raises(read.DataError, match=r"train\.tsv:2: 1 tab-separated"):
        read.load_split(cfg(tmp_path, format="tsv", columns=["de", "en"]), "train")


def test_tsv_unknown_language(tmp_path):
    write(tmp_path / "train.tsv", ["eine Katze\ta cat"])
    with pytest.raises(read.DataError, match="language 'fr' is not in data.columns"):
        read.load_split(cfg(tmp_path, format="tsv", columns=["de", "en"], src_lang="fr"), "train")


@pytest.mark.parametrize("nested", [False, True])
def test_jsonl_flat_and_translation_layouts(tmp_path, nested):
    rows = [{"en": "a cat", "de": "eine Katze"}, {"en": "a dog", "de": "ein Hund"}]
    write(tmp_path / "train.jsonl", [json.dumps({"translation": r} if nested else r) for r in rows])
    ds = read.load_split(cfg(tmp_path, format="jsonl"), "train")
    assert ds["src"] == ["a cat", "a dog"] and ds["tgt"] == ["eine Katze", "ein Hund"]


def test_jsonl_unknown_language_key(tmp_path):
    write(tmp_path / "train.jsonl", [json.dumps({"en": "a cat", "de": "eine Katze"})])
    with pytest.raises(read.DataError, match=r"train\.jsonl:1: no 'en' and 'fr' keys .*data.src_lang"):
        read.load_split(cfg(tmp_path, format="jsonl", tgt_lang="fr"), "train")


def test_jsonl_bad_json_names_line(tmp_path):
    write(tmp_path / "train.jsonl", [json.dumps({"en": "a", "de": "b"}), "{not json"])
    with pytest.raises(read.DataError, match=r"train\.jsonl:2: not valid JSON"):
        read.load_split(cfg(tmp_path, format="jsonl"), "train")


@pytest.mark.parametrize("nested", [False, True])
def test_hub_layouts_map_to_pairs(tmp_path, nested):
    """The hub code path's field mapping, on a local JSONL in the hub datasets' layouts (wmt14/iwslt: nested
    `translation`; bentrevett/multi30k: flat columns), loaded through datasets.load_dataset as a hub set is."""
    rows = [{"en": "a cat", "de": "eine Katze"}, {"en": "a dog", "de": "ein Hund"}]
    write(tmp_path / "x.jsonl", [json.dumps({"translation": r} if nested else r) for r in rows])
    raw = datasets.load_dataset("json", data_files=str(tmp_path / "x.jsonl"), split="train")
    ds = read.hub_to_pairs(raw, "de", "en", "x")
    assert ds.column_names == ["src", "tgt"] and ds["src"] == ["eine Katze", "ein Hund"]
    with pytest.raises(read.DataError, match="fr"):
        read.hub_to_pairs(raw, "fr", "en", "x")


def test_missing_file(tmp_path):
    write(tmp_path / "train.en", ["a"])
    with pytest.raises(read.DataError, match=r"train\.de\[\.gz\]: no such file"):
        read.load_split(cfg(tmp_path), "train")


def test_missing_dir():
    with pytest.raises(read.DataError, match="is not a directory"):
        read.load_split(cfg("/nonexistent/corpus"), "train")


def test_line_count_mismatch_gives_both_counts(tmp_path):
    write(tmp_path / "train.en", ["a", "b", "c"])
    write(tmp_path / "train.de", ["x", "y"])
    with pytest.raises(read.DataError, match=r"train\.en has 3 lines but .*train\.de has 2"):
        read.load_split(cfg(tmp_path), "train")


def test_undecodable_bytes_name_file_and_line(tmp_path):
    write(tmp_path / "train.en", ["a", "b", "c"])
    (tmp_path / "train.de").write_bytes(b"x\ny\n\xff\xfe z\n")
    with pytest.raises(read.DataError, match=r"train\.de:3: bytes that are not UTF-8"):
        read.load_split(cfg(tmp_path), "train")


def with_lengths(src_ids: list, tgt_ids: list) -> datasets.Dataset:
    lengths = {"src_len": [len(x) for x in src_ids], "tgt_len": [len(x) for x in tgt_ids]}
    return datasets.Dataset.from_dict({"src_ids": src_ids, "tgt_ids": tgt_ids, **lengths})


def test_corpus_empty_after_filtering(tmp_path):
    ds = with_lengths([[1] * 10], [[1] * 10])
    with pytest.raises(read.DataError, match="no pairs left after filtering"):
        read.filter_lengths(ds, max_len=5, max_ratio=3.0, where="train")


def test_text_pairs_skip_empty_pairs_and_count_them(tmp_path):
    write(tmp_path / "train.en", ["a b", "", "c", " "])
    write(tmp_path / "train.de", ["x", "y", "", "z"])
    pairs = read.TextPairs.of_split(cfg(tmp_path), "train")
    assert list(pairs) == [("a b", "x")] and (pairs.n_read, pairs.n_empty) == (4, 3)
    write(tmp_path / "train.de", ["", "y", "", "z"])
    with pytest.raises(read.DataError, match="no non-empty sentence pairs"):
        list(read.TextPairs.of_split(cfg(tmp_path), "train"))


def test_all_empty_corpus(tmp_path):
    write(tmp_path / "train.en", ["", " "])
    write(tmp_path / "train.de", ["x", ""])
    with pytest.raises(read.DataError, match="no non-empty sentence pairs"):
        read.drop_empty(read.load_split(cfg(tmp_path), "train"), "train")


def test_length_and_ratio_filters_count():
    ds = with_lengths([[1] * 3, [1] * 30, [1] * 2, [1] * 4, [1] * 2], [[1] * 3, [1] * 3, [1] * 9, [1] * 5, [1] * 6])
    kept = read.filter_lengths(ds, max_len=20, max_ratio=3.0, where="t")
    assert [len(s) for s in kept["src_ids"]] == [3, 4, 2]  # 30 is too long, 2 vs 9 exceeds ratio 3; 2 vs 6 is 3


@needs_multi30k()
def test_multi30k_loads_29000_pairs():
    ds = read.load_split(DataConfig(name="multi30k", dir=str(MULTI30K), src_lang="en", tgt_lang="de"), "train")
    assert len(ds) == 29000
    assert ds[0]["src"].startswith("Two young, White males")
