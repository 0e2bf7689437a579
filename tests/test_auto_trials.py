"""The plan of benchmarks/quality/auto_trials.py (`+experiment=auto` against the fixed recipes): every trial's
train.py line composes into a valid config that trains the point's corpus for the point's budget, and the corpus
cuts are the same pairs every time."""

from __future__ import annotations

import gzip
import importlib.util
import sys

import pytest

from mt.config_checks import to_dataclass
from tests.conftest import ROOT
from tests.test_config import compose_train

spec = importlib.util.spec_from_file_location("auto_trials", ROOT / "benchmarks" / "quality" / "auto_trials.py")
trials = importlib.util.module_from_spec(spec)
sys.modules["auto_trials"] = trials
spec.loader.exec_module(trials)


@pytest.mark.parametrize("point", list(trials.POINTS))
@pytest.mark.parametrize("recipe", list(trials.RECIPES))
def test_every_trial_composes_to_its_corpus_budget_and_run_dir(point, recipe, tmp_path):
    line = trials.command(point, recipe, seed=2, runs=tmp_path / "trials")
    assert line[1] == "train.py"
    cfg = to_dataclass(compose_train(line[2:]))
    corpus, minutes = trials.POINTS[point]
    assert cfg.train.max_time == minutes and cfg.train.seed == 2
    assert cfg.run_dir == str(tmp_path / "trials" / f"{point}.{recipe}.s2")
    assert cfg.auto.enabled == (recipe == "auto")
    c = trials.CORPORA[corpus]
    assert trials.CORPORA[corpus].split in cfg.data.test_splits
    if corpus.startswith("m30k_") and c.pairs < 29000:
        assert cfg.data.dir == str(tmp_path / "data" / f"multi30k_{c.pairs}")  # the cut, beside the runs
    if corpus in ("emea", "kde4"):
        assert cfg.data.valid_from_train == 500 and c.pairs == 5000 - 500
    if recipe == "fairseq":
        assert cfg.model.norm == "post" and cfg.train.warmup == 600  # the fixed recipe, whatever the corpus


def test_the_cuts_are_the_same_pairs_every_time(tmp_path, monkeypatch):
    src = tmp_path / "shared" / "multi30k"
    src.mkdir(parents=True)
    for lang in ("en", "de"):
        with gzip.open(src / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("".join(f"{lang} {i}\n" for i in range(20_000)))
    monkeypatch.setattr(trials, "DATA", tmp_path / "shared")
    monkeypatch.setattr(trials, "CUTS", (3600, 7250))
    trials.cut(tmp_path / "a")
    trials.cut(tmp_path / "b")
    for n in (3600, 7250):
        a = [gzip.open(tmp_path / "a" / f"multi30k_{n}" / f"train.{lang}.gz", "rt").read() for lang in ("en", "de")]
        b = [gzip.open(tmp_path / "b" / f"multi30k_{n}" / f"train.{lang}.gz", "rt").read() for lang in ("en", "de")]
        assert a == b
        en, de = (text.splitlines() for text in a)
        assert len(en) == n and [x.split()[1] for x in en] == [x.split()[1] for x in de]  # still aligned
    small = set(gzip.open(tmp_path / "a" / "multi30k_3600" / "train.en.gz", "rt").read().splitlines())
    assert len(small) == 3600


def test_a_trial_without_a_point_or_with_an_unknown_recipe_is_refused(capsys, monkeypatch):
    for argv in (["run"], ["run", "kde4_20"], ["run", "kde4_20", "bogus"]):
        monkeypatch.setattr(sys, "argv", ["auto_trials.py", *argv])
        with pytest.raises(SystemExit):
            trials.main()
        assert "name a point" in capsys.readouterr().err


def test_the_minutes_plot_joins_the_mean_of_the_seeds_at_each_budget(tmp_path):
    scores = [(10, 37.0), (5, 33.0), (10, 38.0), (56, 40.5)]
    assert trials.seed_means(scores) == [(5, 33.0), (10, 37.5), (56, 40.5)]
    out = tmp_path / "minutes.png"
    trials.draw_minutes([(m, "auto", b) for m, b in scores] + [(10, "fairseq", 23.5)], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
