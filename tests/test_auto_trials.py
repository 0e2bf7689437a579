"""The plan of benchmarks/quality/auto_trials.py (`+experiment=auto` against the fixed recipes): every trial's
train.py line composes into a valid config that trains the point's corpus for the point's budget, and the corpus
cuts are the same pairs every time."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

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


def test_every_recipe_gets_its_own_marker_and_a_legend_name_users_know(tmp_path, monkeypatch):
    assert len(trials.MARKERS) >= len(trials.SCORED) and set(trials.LEGEND) == set(trials.SCORED)
    labels = []
    import matplotlib.axes

    scatter = matplotlib.axes.Axes.scatter
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter", lambda ax, *a, **k: labels.append(k.get("label")) or
                        scatter(ax, *a, **k))  # fmt: skip
    points = [(4500, 20, r, 10.0 + i, c) for i, r in enumerate(trials.SCORED) for c in ("EMEA De->En", "KDE4 De->En")]
    trials.draw(points, tmp_path / "pairs.png")
    assert sorted(labels) == sorted(trials.LEGEND.values())  # every recipe drawn, none under its run-dir name
    assert "multi30k_en_de" in labels and "recipe" not in labels


def row_cells(line: str) -> list[str]:
    """A markdown table row's cells, the empty ones kept."""
    return [cell.strip() for cell in line.strip()[1:-1].split("|")]


def write_runs(tmp_path: Path, plan: list[tuple[str, int, str]]) -> Path:
    """Run dirs of the point emea_20 as the trials leave them: (recipe, seed, "right" or "worse") each."""
    data = tmp_path / "data"
    data.mkdir()
    refs = [f"the {w} sat on the mat near the door today ." for w in ("cat", "dog", "bird", "fox", "cow", "pig")] * 4
    (data / "test.en").write_text("".join(r + "\n" for r in refs))
    runs = tmp_path / "trials"
    worse = [r.replace("mat", "rug").replace("door", "gate") for r in refs]
    for recipe, seed, quality in plan:
        run = trials.run_dir(runs, "emea_20", recipe, seed)
        run.mkdir(parents=True)
        hyps = refs if quality == "right" else worse
        (run / "test.hyp").write_text("".join(h + "\n" for h in hyps))
        (run / "config.resolved.yaml").write_text(f"data: {{name: local, dir: {data}, src_lang: de, tgt_lang: en}}\n")
        rows = [{"kind": "train", "update": u, "tgt_tokens_per_s": 1000.0 * seed} for u in (100, 200)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return runs


def test_the_table_scores_each_seed_and_pools_the_seeds(tmp_path, capsys):
    runs = write_runs(tmp_path, [(r, s, q) for s in (1, 2) for r, q in (("fairseq", "worse"), ("auto", "right"))])
    stopped = "[t][train][INFO] - training stopped (max_time) after 215 updates, 20.0 min\n"
    (trials.run_dir(runs, "emea_20", "auto", 1) / "train.log").write_text(stopped)
    trials.table(runs, plot=None)
    out = capsys.readouterr().out
    assert "| EMEA De->En | 20 | auto | 2 | 200 | 2,000 | 100.00 / 100.00 / 100.00 |" in out  # each seed's row
    assert "| EMEA De->En | 20 | auto | 1 | 215 | 1,000 |" in out  # the log's count, past metrics.jsonl's last row
    pooled = next(line for line in out.splitlines() if "pooled" in line)
    assert pooled.startswith("| EMEA De->En | 20 | auto | 1+2 pooled |") and "100.00 |" in pooled
    summary = out.split("seeds pooled")[1].splitlines()
    assert any(line.startswith("| EMEA De->En | 20 | 2 | 100.00 | ") for line in summary)


def test_the_summary_sets_auto_against_this_projects_recipe_over_the_seeds_both_ran(tmp_path, capsys):
    plan = [(r, s, q) for s in (1, 2) for r, q in (("fairseq", "worse"), ("auto", "worse"))] + [("recipe", 1, "right")]
    trials.table(write_runs(tmp_path, plan), plot=None)
    summary = next(line for line in capsys.readouterr().out.split("seeds pooled")[1].splitlines() if "EMEA" in line)
    delta, p_seeds = row_cells(summary)[-2].split(", ")
    assert float(delta) < -10 and p_seeds.endswith("(1)")  # behind the recipe, from seed 1 alone


def test_a_seed_without_fairseqs_run_counts_against_the_recipe_only(tmp_path, capsys):
    # seed 1: fairseq's, auto and the recipe; seed 2: auto and the recipe only (auto right in both, the recipe not)
    plan = [("fairseq", 1, "worse"), ("auto", 1, "right"), ("recipe", 1, "worse"), ("auto", 2, "right")]
    trials.table(write_runs(tmp_path, [*plan, ("recipe", 2, "worse")]), plot=None)
    out = capsys.readouterr().out
    assert "| EMEA De->En | 20 | auto | 2 | 200 | 2,000 | 100.00 / 100.00 / 100.00 |  |" in out  # no fairseq column
    summary = next(line for line in out.split("seeds pooled")[1].splitlines() if "EMEA" in line)
    assert summary.startswith("| EMEA De->En | 20 | 1 | 100.00 | ")  # against fairseq's recipe: seed 1 alone
    assert row_cells(summary)[-2].endswith("(2)")  # against the recipe: both seeds


def test_plans_set_each_auto_runs_plan_against_the_updates_it_made(tmp_path, capsys):
    runs = write_runs(tmp_path, [("auto", 1, "right"), ("auto", 2, "right"), ("recipe", 1, "right")])
    run = trials.run_dir(runs, "emea_20", "auto", 1)
    plan = {"key": "plan", "value": {"updates": 250, "epochs": 10.0}, "reason": "250 updates"}
    chosen = {"tokenizer.vocab_size": 4000, "train.max_tokens": 2500, "train.accumulate": 1, "model.d_model": 128,
              "model.attention_dropout": 0.0}  # fmt: skip
    record = {
        "corpus": {"epochs": {"2500": {"batches": 10, "padded_tokens": 20_000.0}, "4096": {"batches": 1}}},
        "budget": {"minutes": 20, "updates": 0, "spent": 12.4},
        "speed": [["compact", 4000, True, 4_500.0], ["compact", 4000, False, 5_000.0], ["compact", 10000, False, 1.0]],
        "choices": [plan, *({"key": k, "value": v, "reason": ""} for k, v in chosen.items())],
    }
    (run / "auto.json").write_text(json.dumps(record))
    # 2,000 padded tokens an update at 4,000 a second: 0.5 s each; a 10-s validation at 100, a 12-s one at 200
    records = [
        {"kind": "train", "update": 100, "elapsed": 12.4 + 50, "tgt_tokens_per_s": 900.0},
        {"kind": "valid", "update": 100, "valid_s": 10.0},
        {"kind": "train", "update": 200, "elapsed": 12.4 + 100 + 10, "tgt_tokens_per_s": 900.0},
        {"kind": "valid", "update": 200, "valid_s": 12.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    trials.plans(runs)  # seed 2 has no auto.json, the recipe is not auto's: neither is listed
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| emea")]
    measured = "12 | 5,000, 4,000 | 2, 11.0 | 44,000 |"  # the probe's point; the run's speed; 11 s at 4,000 tok/s
    assert rows == [f"| emea_20.auto.s1 | 250 | 200 | 0.80 | 10.0 | 8.0 | {measured}"]  # the last update logged
    (run / "train.log").write_text("[t][train][INFO] - training stopped (max_time) after 225 updates, 20.0 min\n")
    trials.plans(runs)  # the train log's count, exact
    assert f"| emea_20.auto.s1 | 250 | 225 | 0.90 | 10.0 | 9.0 | {measured}" in capsys.readouterr().out
    (run / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "valid_s"}) + "\n"
                                               for r in records))  # fmt: skip
    trials.plans(runs)  # without the validations' seconds the run's speed is unknown, not the validations counted in
    assert "| emea_20.auto.s1 | 250 | 225 | 0.90 | 10.0 | 9.0 | 12 | 5,000, nan |  |  |" in capsys.readouterr().out


def test_a_point_fairseq_never_ran_still_sets_auto_against_the_recipe(tmp_path, capsys):
    # KDE4's second host: auto and this project's recipe only, two seeds (auto right in both, the recipe not)
    plan = [(r, s, q) for s in (1, 2) for r, q in (("auto", "right"), ("recipe", "worse"))]
    trials.table(write_runs(tmp_path, plan), plot=None)
    summary = next(line for line in capsys.readouterr().out.split("seeds pooled")[1].splitlines() if "EMEA" in line)
    cells = row_cells(summary)
    assert cells[:3] == ["EMEA De->En", "20", "2"] and cells[3] == "100.00"  # auto's pooled score, two seeds
    assert cells[4] == "" and float(cells[5]) < 100  # no fairseq score; the recipe's
    assert cells[-3] == "" and float(cells[-2].split(", ")[0]) > 10 and cells[-2].endswith("(2)")  # vs recipe only
    assert cells[-1] == ""  # the literature's variant did not run


def test_the_summary_sets_auto_against_the_literatures_variant_where_it_ran(tmp_path, capsys):
    # the never-seen corpora: auto, the recipe and the literature's variant, no fairseq run
    plan = [("auto", 1, "right"), ("recipe", 1, "right"), ("literature", 1, "worse")]
    trials.table(write_runs(tmp_path, plan), plot=None)
    summary = next(line for line in capsys.readouterr().out.split("seeds pooled")[1].splitlines() if "EMEA" in line)
    cells = row_cells(summary)
    assert cells[2] == "1" and cells[3] == "100.00" and float(cells[3 + trials.SCORED.index("literature")]) < 100
    assert cells[-2].startswith("+0.00") and float(cells[-1].split(", ")[0]) > 10 and cells[-1].endswith("(1)")


def test_autos_summary_score_is_over_the_most_seeds_it_shares_with_a_rival(tmp_path, capsys):
    # a second seed of auto and the recipe only (the never-seen corpora): auto's cell pools both seeds, not the one
    # it shares with the literature's variant
    plan = [("auto", 1, "right"), ("auto", 2, "worse"), ("recipe", 1, "worse"), ("recipe", 2, "worse")]
    trials.table(write_runs(tmp_path, [*plan, ("literature", 1, "worse")]), plot=None)
    summary = next(line for line in capsys.readouterr().out.split("seeds pooled")[1].splitlines() if "EMEA" in line)
    cells = row_cells(summary)
    assert cells[2] == "2" and float(cells[5]) < float(cells[3]) < 100  # both seeds of auto, the second worse
    assert cells[-2].endswith("(2)") and cells[-1].endswith("(1)")
