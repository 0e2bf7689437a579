"""A training set made of several corpora (`data.corpora`): each tokenized and cached on its own, mixed by weight
every epoch, tagged sources where asked; validation and test stay the main corpus's."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mt import errors
from mt.config import ConfigError, CorpusConfig
from mt.config_checks import validate
from mt.data.corpus import prepare_data, training_batches
from tests.conftest import multilingual_config, write_toy_corpus
from tests.test_training import make_config, make_trainer


def write_other_corpus(out: Path, n: int = 120) -> Path:
    """A second made-up corpus in the same languages ("synthetic": other sentences, same reversal)."""
    rng = random.Random(5)
    words = "the a cat dog sees runs big small red house tree and".split()
    out.mkdir(parents=True, exist_ok=True)
    src = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 7))) for _ in range(n)]
    (out / "train.xx").write_text("\n".join(src) + "\n")
    (out / "train.yy").write_text("\n".join(" ".join(s.split()[::-1]) for s in src) + "\n")
    return out


def mixed_config(corpus: Path, other: Path, run_dir: Path, weights=(2.0, 1.0), tag: str | None = "<bt>", **train):
    cfg = make_config(corpus, run_dir, **train)
    corpora = [
        CorpusConfig(dir=str(corpus), weight=weights[0]),
        CorpusConfig(dir=str(other), tag=tag, weight=weights[1]),
    ]
    return replace(cfg, data=replace(cfg.data, corpora=corpora))


def test_an_epoch_draws_each_corpus_by_its_weight(toy_corpus, tmp_path):
    other = write_other_corpus(tmp_path / "other")
    cfg = mixed_config(toy_corpus, other, tmp_path / "run", weights=(2.0, 0.5))
    corpus = prepare_data(cfg, tmp_path / "run", 128)
    n_real, n_other = (int((corpus.mix.part == i).sum()) for i in (0, 1))
    assert (n_real, n_other) == (200, 120)
    sampler, loader, _ = training_batches(corpus, cfg, 1, 0)
    halves = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        rows = np.concatenate([np.asarray(b) for b in sampler.batches()])
        counts = np.bincount(corpus.mix.part[rows], minlength=2)
        assert counts.tolist() == [2 * n_real, n_other // 2]  # every real pair twice, half of the other corpus
        assert (np.bincount(rows[corpus.mix.part[rows] == 0])[:n_real] == 2).all()
        halves.append(set(rows[corpus.mix.part[rows] == 1].tolist()))
    assert halves[0] != halves[1]  # another half every epoch
    sampler.set_epoch(1)
    again = np.concatenate([np.asarray(b) for b in sampler.batches()])
    assert set(again[corpus.mix.part[again] == 1].tolist()) == halves[1]  # from (seed, epoch): a resume sees the same


def test_a_tagged_corpus_sources_start_with_the_tag_and_no_other_does(toy_corpus, tmp_path):
    other = write_other_corpus(tmp_path / "other")
    cfg = mixed_config(toy_corpus, other, tmp_path / "run")
    corpus = prepare_data(cfg, tmp_path / "run", 128)
    tag = corpus.vocabs.src.tokenizer.token_to_id("<bt>")
    assert tag == 4 and 4 not in corpus.vocabs.src.encode("<bt> the cat")  # the id, never the text (issue 43)
    _, loader, _ = training_batches(corpus, cfg, 1, 0)
    seen = {0: 0, 1: 0}
    for batch in loader:
        for row, src in zip(batch.ids, batch.src.tolist()):
            part = int(corpus.mix.part[row])
            seen[part] += 1
            assert (src[0] == tag) == (part == 1)
            assert src.count(tag) == (part == 1)
    assert seen[0] == 400 and seen[1] == 120
    assert tag not in [t for ids in corpus.valid["src_ids"] for t in ids]


def test_validation_and_test_stay_the_main_corpus(toy_corpus, tmp_path):
    other = write_other_corpus(tmp_path / "other")
    mixed = prepare_data(mixed_config(toy_corpus, other, tmp_path / "mixed"), tmp_path / "mixed", 128)
    alone = prepare_data(make_config(toy_corpus, tmp_path / "alone"), tmp_path / "alone", 128)
    assert mixed.valid["src"] == alone.valid["src"] and mixed.valid["tgt"] == alone.valid["tgt"]
    assert not set(mixed.valid["src"]) & set((other / "train.xx").read_text().splitlines())


def test_adding_a_corpus_tokenizes_only_that_one(toy_corpus, tmp_path, caplog):
    """With the tokenizer fixed (tokenizer.path), a second run with one corpus more reuses the first corpus's cache."""
    first = make_trainer(toy_corpus, tmp_path / "first", max_updates=1)
    tokenizer = tmp_path / "first" / "tokenizer.json"
    other = write_other_corpus(tmp_path / "other", n=97)
    cfg = mixed_config(toy_corpus, other, tmp_path / "second", tag=None)
    cfg = replace(cfg, tokenizer=replace(cfg.tokenizer, path=str(tokenizer)))
    caplog.clear()
    corpus = prepare_data(cfg, tmp_path / "second", 128)
    reused = [r.message for r in caplog.records if "reusing the tokenized corpus" in r.message]
    written = [r.message for r in caplog.records if "tokenized" in r.message and "pairs in" in r.message]
    assert len(reused) == 1 and reused[0].startswith(f"{toy_corpus.name}/train")
    assert len(written) == 1 and written[0].startswith("other/train")
    assert len(corpus.train) == len(first.corpus.train) + 97


def test_a_resume_refuses_a_changed_corpus_list(toy_corpus, tmp_path):
    other = write_other_corpus(tmp_path / "other")
    cfg = mixed_config(toy_corpus, other, tmp_path / "run", max_updates=3)
    from mt.train.trainer import Trainer

    Trainer(cfg, prepare_data(cfg, tmp_path / "run", 128), tmp_path / "run").fit(job_start=0)
    changed = mixed_config(toy_corpus, other, tmp_path / "run", weights=(3.0, 1.0), max_updates=6)
    trainer = Trainer(changed, prepare_data(changed, tmp_path / "run", 128), tmp_path / "run")
    with pytest.raises(errors.CheckpointError, match=r"was trained with data.corpora=.*weight': 2.0"):
        trainer.resume()
    same = Trainer(cfg, prepare_data(cfg, tmp_path / "run", 128), tmp_path / "run")
    assert same.resume() and same.update == 3


def test_a_mixed_run_resumes_exactly(toy_corpus, tmp_path):
    from mt.train.trainer import Trainer
    from tests.test_training import params, record_batches

    other = write_other_corpus(tmp_path / "other")
    runs = {}
    for name, stops in (("straight", [30]), ("stopped", [11, 30])):
        for stop in stops:
            cfg = mixed_config(toy_corpus, other, tmp_path / name, weights=(1.0, 0.5), max_updates=stop)
            trainer = Trainer(cfg, prepare_data(cfg, tmp_path / name, 128), tmp_path / name)
            order = record_batches(trainer)
            trainer.fit(job_start=0)
            runs.setdefault(name, []).extend(order)
        runs[name + " params"] = params(trainer)
    assert runs["straight"] == runs["stopped"] and trainer.epochs_done >= 1
    a, b = runs["straight params"], runs["stopped params"]
    assert all((a[k] == b[k]).all() for k in a)


@pytest.mark.parametrize(
    "corpus, message",
    [
        (CorpusConfig(dir="x", weight=0.0), r"data.corpora\[0\].weight=0.0: give a weight above 0"),
        (CorpusConfig(dir="x", tag="bt"), r"data.corpora\[0\].tag='bt': give a token like <bt>"),
        (CorpusConfig(dir="x", format="csv"), r"data.corpora\[0\].format='csv' is not one of"),
    ],
)
def test_bad_corpora_are_one_line_errors(toy_corpus, tmp_path, corpus, message):
    cfg = make_config(toy_corpus, tmp_path)
    with pytest.raises(ConfigError, match=message):
        validate(replace(cfg, data=replace(cfg.data, corpora=[corpus])))


# ------------------------------------------------------------------ multilingual


def test_each_direction_is_tagged_with_its_target_language(multilingual_run):
    _, trainer, _ = multilingual_run
    corpus = trainer.corpus
    tags = {lang: corpus.vocabs.src.tokenizer.token_to_id(f"<2{lang}>") for lang in ("yy", "zz")}
    assert sorted(tags.values()) == [4, 5] and [d.name for d in corpus.directions] == ["xx-yy", "xx-zz"]
    _, loader, _ = training_batches(corpus, trainer.cfg, 1, 0)
    firsts = {}
    for batch in loader:
        for row, src in zip(batch.ids, batch.src.tolist()):
            firsts.setdefault(int(corpus.mix.part[row]), set()).add(src[0])
    assert firsts == {0: {tags["yy"]}, 1: {tags["zz"]}}
    # BPE learned from each language once (xx is one language of three, not half of the pairs' text)
    meta = json.loads((trainer.run_dir / "tokenizer.meta.json").read_text())
    assert meta["sentences"] == {"xx": 200, "yy": 200, "zz": 200}
    for d in corpus.directions:
        assert {ids[0] for ids in d.valid["src_ids"]} == {tags[d.config.tgt_lang]}


def test_every_direction_is_validated_and_tested(multilingual_run):
    run, _, finished = multilingual_run
    records = [r for r in (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
               if r["kind"] == "valid"]  # fmt: skip
    last = records[-1]
    assert last["valid_bleu"] == pytest.approx((last["valid_bleu_xx-yy"] + last["valid_bleu_xx-zz"]) / 2)
    assert [r["name"] for r in finished["reports"]] == ["test.xx-yy", "test.xx-zz"]
    assert (run / "test.xx-yy.report.json").is_file() and (run / "test.xx-zz.hyp").is_file()
    assert (run / "training_curves.png").stat().st_size > 1000  # the directions' curves beside their mean
    print([(r["name"], r["bleu"], r["chrf"]) for r in finished["reports"]])
    assert min(r["chrf"] for r in finished["reports"]) > 20  # it learned something in both directions


def test_a_multilingual_model_needs_its_target_language(multilingual_run, tmp_path):
    from mt import Translator
    from mt.export.formats import export_ctranslate2, export_release

    run, trainer, _ = multilingual_run
    with pytest.raises(ConfigError, match=r"^tgt_lang is needed by this multilingual model; give one of yy, zz$"):
        Translator.load(run, device="cpu").translate(["the cat"])
    with pytest.raises(ConfigError, match=r"^tgt_lang=de: not a language of this multilingual model"):
        Translator.load(run, device="cpu", tgt_lang="de")
    model = Translator.load(run, device="cpu", tgt_lang="yy", beam_size=1, length_penalty=0.0)
    src = ["the cat sees a dog", "a big red house"]
    yy, zz = model.translate(src), model.translate(src, tgt_lang="zz")
    assert yy != zz
    release = Translator.load(export_release(str(run), tmp_path / "release"), device="cpu", tgt_lang="yy",
                              beam_size=1, length_penalty=0.0)  # fmt: skip
    assert release.targets == model.targets and release.translate(src) == yy
    pytest.importorskip("ctranslate2")
    ct2 = Translator.load(export_ctranslate2(str(run), tmp_path / "ct2"), device="cpu", tgt_lang="zz", beam_size=1,
                          length_penalty=0.0)  # fmt: skip
    assert ct2.targets == model.targets and ct2.translate(src) == zz


def test_translate_py_asks_a_multilingual_model_for_its_target_language(multilingual_run):
    import subprocess
    import sys

    from tests.conftest import ROOT

    run = multilingual_run[0]
    cmd = [sys.executable, "translate.py", f"checkpoint={run}", "device=cpu"]
    missing = subprocess.run(cmd, cwd=ROOT, input="the cat\n", capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().splitlines()[-1] == (
        "error: tgt_lang is needed by this multilingual model; give one of yy, zz"
    )
    given = subprocess.run([*cmd, "tgt_lang=zz"], cwd=ROOT, input="the cat\n\n", capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert given.returncode == 0 and len(given.stdout.splitlines()) == 2 and given.stdout.splitlines()[1] == ""


def test_a_missing_corpus_dir_names_its_entry(toy_corpus, tmp_path):
    from mt.errors import DataError

    cfg = mixed_config(toy_corpus, tmp_path / "nowhere", tmp_path / "run")
    with pytest.raises(DataError, match=r"^data.corpora\[1\].dir='.*nowhere' is not a directory"):
        prepare_data(cfg, tmp_path / "run", 128)


# ------------------------------------------------------------------ caches and tags per direction


def _write_multiway(corpus: Path, fmt: str) -> None:
    """The toy multi-way corpus as one {split}.tsv (columns xx, yy, zz) or {split}.jsonl per split."""
    for split in ("train", "valid", "test"):
        rows = zip(*((corpus / f"{split}.{lang}").read_text().splitlines() for lang in ("xx", "yy", "zz")))
        if fmt == "tsv":
            text = "".join("\t".join(row) + "\n" for row in rows)
        else:
            text = "".join(json.dumps(dict(zip(("xx", "yy", "zz"), row))) + "\n" for row in rows)
        (corpus / f"{split}.{fmt}").write_text(text)


def _targets(corpus, vocabs, part: int | None = None) -> set[str]:
    rows = range(len(corpus.train)) if part is None else np.flatnonzero(corpus.mix.part == part)
    return set(vocabs.tgt.decode_batch(corpus.train.select(list(rows))["tgt_ids"]))


@pytest.mark.parametrize("fmt", ["tsv", "jsonl"])
def test_one_multiway_file_is_cached_per_direction(tmp_path, fmt):
    """Before: a TSV or JSONL file was fingerprinted by path, size and mtime alone, so the en-fr part of
    data.directions=[en-de, en-fr] trained on the en-de table, and a de->en run after an en->de run on the same
    file trained en->de. The columns or keys read are now part of every cache key."""
    corpus = write_toy_corpus(tmp_path / "corpus", multiway=True)
    _write_multiway(corpus, fmt)
    lines = {lang: set((corpus / f"train.{lang}").read_text().splitlines()) for lang in ("xx", "yy", "zz")}
    cache = str(tmp_path / "cache")

    def config(run: str, **data):
        cfg = multilingual_config(corpus, tmp_path / run)
        fields = dict(format=fmt, columns=["xx", "yy", "zz"], cache_dir=cache, **data)
        return replace(cfg, data=replace(cfg.data, **fields))

    cfg = config("multi")
    both = prepare_data(cfg, tmp_path / "multi", 128)
    assert _targets(both, both.vocabs, 0) <= lines["yy"] and _targets(both, both.vocabs, 1) <= lines["zz"]
    forward = config("forward", directions=[], src_lang="xx", tgt_lang="yy")
    backward = config("backward", directions=[], src_lang="yy", tgt_lang="xx")
    for cfg, lang in ((forward, "yy"), (backward, "xx")):  # the second run reuses the cache of the first...
        tokenizer = replace(cfg.tokenizer, path=str(tmp_path / "multi" / "tokenizer.json"))
        corpus_ = prepare_data(replace(cfg, tokenizer=tokenizer), tmp_path / cfg.run_dir, 128)
        assert _targets(corpus_, corpus_.vocabs) <= lines[lang]  # ...only if it reads the same columns


def test_a_corpus_added_to_a_multilingual_run_gets_its_target_language_token(tmp_path):
    """Before: a data.corpora entry (back-translations) in a data.directions run trained untagged sources, while
    inference always puts <2xx> first."""
    corpus = write_toy_corpus(tmp_path / "corpus", multiway=True)
    other = write_other_corpus(tmp_path / "bt")
    cfg = multilingual_config(corpus, tmp_path / "run")
    cfg = replace(cfg, data=replace(cfg.data, corpora=[CorpusConfig(dir=str(other), tgt_lang="yy")]))
    prepared = prepare_data(cfg, tmp_path / "run", 128)
    token = prepared.vocabs.src.tokenizer.token_to_id("<2yy>")
    assert token is not None and set(prepared.mix.tags[prepared.mix.part == 2]) == {token}
    tagged = replace(cfg, data=replace(cfg.data, corpora=[CorpusConfig(dir=str(other), tag="<bt>")]))
    with pytest.raises(ConfigError, match=r"^data.corpora\[0\].tag=<bt>: in a data.directions run each source"):
        prepare_data(tagged, tmp_path / "run2", 128)
