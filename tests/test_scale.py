"""The data path at WMT size, shown on small corpora: a second run reads no corpus file, the training table holds
only uint16 ids and lengths, BPE learns from a bounded and recorded sample, BPE-dropout refuses corpora it cannot
hold. (The figures at 1M-10M pairs come from benchmarks/speed/scale.py.)"""

import json
import random

import numpy as np
import pytest

from mt.config import ConfigError
from mt.data import corpus as corpus_module
from mt.data import files
from mt.data.corpus import prepare_data, training_batches
from mt.data.tokenizer import sample_pairs
from tests.test_training import make_config


def test_second_run_reaches_training_without_reading_the_corpus(toy_corpus, tmp_path, monkeypatch):
    cfg = make_config(toy_corpus, tmp_path / "run1")
    cfg.data.cache_dir = str(tmp_path / "cache")
    first = prepare_data(cfg, tmp_path / "run1", 128)

    def no_reading(path):
        raise AssertionError(f"{path} was read again")

    monkeypatch.setattr(files, "open_binary", no_reading)
    # A new run dir (another model on the same data): the tokenizer comes from the cache too.
    second = prepare_data(cfg, tmp_path / "run2", 128)
    assert second.train["src_ids"] == first.train["src_ids"] and second.train["tgt_ids"] == first.train["tgt_ids"]
    assert (tmp_path / "run2" / "tokenizer.json").read_text() == (tmp_path / "run1" / "tokenizer.json").read_text()
    assert second.valid["src"] == first.valid["src"]


def test_training_table_holds_uint16_ids_and_lengths_only(toy_corpus, tmp_path):
    cfg = make_config(toy_corpus, tmp_path / "run")
    train = prepare_data(cfg, tmp_path / "run", 128).train
    assert sorted(train.column_names) == ["src_ids", "src_len", "tgt_ids", "tgt_len"]
    assert train.features["src_ids"].feature.dtype == "uint16" and train.features["tgt_ids"].feature.dtype == "uint16"
    assert train["src_len"] == [len(x) for x in train["src_ids"]]


def test_bpe_learns_from_a_recorded_sample(toy_corpus, tmp_path, caplog):
    cfg = make_config(toy_corpus, tmp_path / "run")
    cfg.tokenizer.sample_pairs = 50
    with caplog.at_level("INFO"):
        prepare_data(cfg, tmp_path / "run", 128)
    meta = json.loads((tmp_path / "run" / "tokenizer.meta.json").read_text())
    assert (meta["pairs"], meta["sampled_pairs"], meta["config"]["sample_pairs"]) == (200, 50, 50)
    assert "trained BPE on 50 of 200 pairs" in caplog.text


def test_reservoir_sample_is_uniform_and_bounded():
    population = [(str(i), str(i)) for i in range(10_000)]
    sample, seen = sample_pairs(population, 500, seed=3)
    assert seen == 10_000 and len(sample) == 500 and len(set(sample)) == 500 and set(sample) <= set(population)
    counts = np.zeros(10)
    for seed in range(40):
        for s, _ in sample_pairs(iter(population), 500, seed=seed)[0]:
            counts[int(s) // 1000] += 1
    assert counts.min() > 0.85 * counts.mean() and counts.max() < 1.15 * counts.mean()  # each tenth ~2,000 of 20,000
    assert sample_pairs(population[:30], 500) == (population[:30], 30)
    assert sample_pairs(iter(population), 0)[1] == 10_000  # 0: everything


def test_bpe_dropout_refuses_a_corpus_it_cannot_hold(toy_corpus, tmp_path, monkeypatch):
    cfg = make_config(toy_corpus, tmp_path / "run", bpe_dropout=0.1)
    corpus = prepare_data(cfg, tmp_path / "run", 128)
    monkeypatch.setattr(corpus_module, "BPE_DROPOUT_MAX_PAIRS", len(corpus.train) - 1)
    with pytest.raises(ConfigError, match=r"train\.bpe_dropout=0\.1 .* this corpus has 200: set train\.bpe_dropout=0"):
        training_batches(corpus, cfg, 1, 0)
    monkeypatch.setattr(corpus_module, "BPE_DROPOUT_MAX_PAIRS", len(corpus.train))
    _, _, segments = training_batches(corpus, cfg, 1, 0)
    rng = random.Random(0)
    i = rng.randrange(len(corpus.train))  # the segments' text is the kept row's text
    src, _ = list(corpus.train_text)[corpus.train_rows[i]]
    assert segments.texts["src_ids"][i] == src
