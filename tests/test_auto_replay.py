"""The plan of benchmarks/quality/auto_replay.py (rule changes tried at a CPU budget's update count on a GPU): each
trial is the rule with its patches, run to the count the CPU budget holds for its shape and vocabulary, and its
train.py line composes with one value a key."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys

import pytest

from mt.config_checks import to_dataclass
from mt.train import auto
from tests.conftest import ROOT
from tests.test_config import compose_train

sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))
spec = importlib.util.spec_from_file_location("auto_replay", ROOT / "benchmarks" / "quality" / "auto_replay.py")
replay = importlib.util.module_from_spec(spec)
sys.modules["auto_replay"] = replay
spec.loader.exec_module(replay)

IWSLT = auto.CorpusStats(9_527, 155_604, 165_564, {2_500: auto.Epoch(143, 307_053), 4_096: auto.Epoch(95, 323_583)})
SPEED = 8_777.0  # the compact shape's padded tokens/s on the CPU run


@pytest.fixture
def cpu_runs(tmp_path, monkeypatch):
    """A point's CPU runs as the plan reads them: auto's auto.json (the rule now) and both runs' update counts."""
    budget = auto.Budget(minutes=30)
    choices = auto.choose(IWSLT, budget, {"compact": SPEED})
    record = {"corpus": dataclasses.asdict(IWSLT), "budget": vars(budget), "speed": {"compact": SPEED},
              "choices": [vars(c) for c in choices]}  # fmt: skip
    for recipe, updates in (("auto", 7_400), ("fairseq", 2_276)):
        run = tmp_path / f"iwslt_30.{recipe}.s1"
        run.mkdir()
        (run / "metrics.jsonl").write_text(json.dumps({"update": updates}) + "\n")
        if recipe == "auto":
            (run / "auto.json").write_text(json.dumps(record))
    # The probe's speed of each shape and vocabulary: FFN 512 at 1/1.25 of 256, 8k types 6% slower than 4k.
    monkeypatch.setattr(replay, "_speed", lambda shape, vocab: 1.0 / (1.25 if dict(shape)["d_ff"] == 512 else 1.0)
                        / (1.06 if vocab == 8_000 else 1.0))  # fmt: skip
    return tmp_path


def test_each_trial_runs_the_count_its_cpu_budget_holds(cpu_runs):
    plan = {t["name"].split(".")[1]: t for t in replay.plan("iwslt_30", ["auto", "ff512", "v8k_now", "fairseq"],
                                                            cpu_runs, cpu_runs / "data", [1, 2])}  # fmt: skip
    # the rule now: the CPU run's own count (its plan, scaled by the run's updates over that plan)
    assert plan["auto"]["updates"] == 7_400
    # FFN 512 at 1/1.25 of the speed, so ~1/1.25 of the updates (still the short schedule; not exactly: the plan's
    # validations cost as many tokens at any speed, so a slower model loses a few more updates)
    assert plan["ff512"]["updates"] == pytest.approx(7_400 / 1.25, rel=0.02)
    assert plan["ff512"]["updates"] < 7_400 / 1.25
    assert plan["v8k_now"]["updates"] == pytest.approx(7_400 / 1.06, rel=0.02)  # the 8k output layer's cost
    assert plan["fairseq"]["updates"] == 2_276  # fairseq's CPU run's own count


@pytest.mark.parametrize("name", list(replay.TRIALS))
def test_every_trial_composes_with_one_value_a_key(cpu_runs, name):
    (trial, _) = replay.plan("iwslt_30", [name], cpu_runs, cpu_runs / "data", [1, 2])
    keys = [a.split("=", 1)[0] for a in trial["args"]]
    assert len(keys) == len(set(keys))  # Hydra refuses a key given twice
    cfg = to_dataclass(compose_train([*trial["args"], "run_dir=x"]))
    assert cfg.train.max_updates == trial["updates"] and cfg.train.max_time == 0
    assert cfg.data.dir == str(cpu_runs / "data" / "iwslt_ted_de_en") and not cfg.auto.enabled
    recipe, patches, extra = replay.TRIALS[name]
    if recipe == "auto":
        assert cfg.model.d_ff == {**auto.SHAPES, **patches.get("SHAPES", {})}["compact"]["d_ff"]
    for override in extra:
        key, value = override.split("=", 1)
        section, field = key.split(".")
        assert replay._value(getattr(getattr(cfg, section), field)) == value


def test_a_patch_of_a_table_the_rule_lacks_is_refused_and_none_leaks(cpu_runs):
    with pytest.raises(KeyError, match="no GROWN_VOCABULARY: the patch would change nothing"):
        with replay.patched({"GROWN_VOCABULARY": {}}):
            pass
    (trial,) = replay.plan("iwslt_30", ["ff512"], cpu_runs, cpu_runs / "data", [1])
    assert dict(a.split("=", 1) for a in trial["args"])["model.d_ff"] == "512"
    assert auto.SHAPES["compact"]["d_ff"] == 256 and auto.LONG_RUN_UPDATES == 3_000  # the patch did not leak


def test_the_whole_of_multi30k_reads_the_carried_copy(cpu_runs):
    """Multi30k uncut sets no data.dir (its config reads ../shared/data, which the GPU machine lacks): the plan
    points it at the copy under --data, as it does the cuts."""
    for recipe in ("auto", "fairseq"):
        (cpu_runs / f"iwslt_30.{recipe}.s1").rename(cpu_runs / f"m30k_29000_30.{recipe}.s1")
    for (trial,) in (replay.plan("m30k_29000_30", [name], cpu_runs, cpu_runs / "data", [1]) for name in
                     ("auto", "fairseq")):  # fmt: skip
        cfg = to_dataclass(compose_train([*trial["args"], "run_dir=x"]))
        assert cfg.data.name == "multi30k" and cfg.data.dir == str(cpu_runs / "data" / "multi30k")
