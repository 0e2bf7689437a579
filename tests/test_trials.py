"""The recipe-trial harness (benchmarks/quality/recipe_trials.sh) that issue 62's walk runs for hours: what it asks
train.py and translate.py for, several runs at once, and bad settings refused before anything runs. A stand-in
`python` on PATH records each call and writes the files a finished run leaves, so no model is trained."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRIALS = ROOT / "benchmarks" / "quality" / "recipe_trials.sh"

# Logs "start"/"end" with the time and the arguments; train.py takes a second and leaves the run's test
# hypotheses, translate.py its output; a trial named in FAIL fails its training.
FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$(date +%s.%N) start $*" >> "$CALLS"
case $1 in
    train.py)
        sleep 1
        for a in "$@"; do case $a in run_dir=*) run=${a#run_dir=} ;; esac; done
        [ -n "${FAIL:-}" ] && [[ $run == */$FAIL.s* ]] && exit 1
        mkdir -p "$run" && : > "$run/test_2016_flickr.hyp" ;;
    translate.py)
        for a in "$@"; do case $a in output=*) : > "${a#output=}" ;; esac; done ;;
esac
echo "$(date +%s.%N) end $1" >> "$CALLS"
"""


def trials(tmp_path: Path, *names: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    calls = tmp_path / "calls.log"
    # the harness's settings: none inherited from the environment the tests run in
    settings = ("OUT", "DATA", "MINUTES", "SEEDS", "WARMUP", "UPDATES", "DEVICE", "JOBS", "PAIR", "FAIL")
    inherited = {k: v for k, v in os.environ.items() if k not in settings}
    full_env = {**inherited, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
                "OUT": str(tmp_path / "out"), "DATA": str(tmp_path / "data"), **env}  # fmt: skip
    p = subprocess.run(["bash", str(TRIALS), *names], cwd=ROOT, capture_output=True, text=True, env=full_env,
                       timeout=60)  # fmt: skip
    lines = calls.read_text().splitlines() if calls.exists() else []
    return p, [line.split() for line in lines]


def test_jobs_train_runs_at_once_each_with_its_cache_the_update_cap_and_the_device(tmp_path):
    p, calls = trials(tmp_path, "replica", "r_d02", JOBS="2", UPDATES="3300", DEVICE="cuda", SEEDS="1")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out"
    trains = [c for c in calls if c[1:3] == ["start", "train.py"]]
    assert len(trains) == 2
    for name, call in zip(("replica", "r_d02"), sorted(trains, key=lambda c: "r_d02" in " ".join(c))):
        assert f"run_dir={out}/{name}.s1" in call
        assert "train.max_updates=3300" in call and "train.device=cuda" in call
        assert f"data.cache_dir={out}/{name}.s1.cache" in call  # runs at once never share a cache
        assert f"data.dir={tmp_path}/data/multi30k" in call
    assert "model.dropout=0.2" in next(c for c in trains if f"run_dir={out}/r_d02.s1" in c)
    first_end = min(float(c[0]) for c in calls if c[1:3] == ["end", "train.py"])
    assert max(float(c[0]) for c in trains) < first_end  # the second started before the first ended
    translates = [c for c in calls if c[1:3] == ["start", "translate.py"]]
    assert len(translates) == 2 and all("device=cuda" in c for c in translates)
    assert (out / "replica.s1.log").is_file() and (out / "r_d02.s1.log").is_file()


def test_one_at_a_time_by_default_and_no_cache_of_its_own(tmp_path):
    p, calls = trials(tmp_path, "replica", "r_gnmt", SEEDS="1")
    assert p.returncode == 0, p.stderr
    trains = [c for c in calls if c[1:3] == ["start", "train.py"]]
    assert len(trains) == 1 and not any(a.startswith(("data.cache_dir=", "train.max_updates=")) for a in trains[0])
    assert "train.device=cpu" in trains[0]
    decodes = [c for c in calls if c[1:3] == ["start", "translate.py"]]  # the replica's val, then r_gnmt's
    assert len(decodes) == 2 and "decode.length_penalty_type=gnmt" in decodes[1]


def test_a_failed_run_among_several_fails_the_harness_after_the_others_finish(tmp_path):
    p, calls = trials(tmp_path, "replica", "r_d02", JOBS="2", SEEDS="1", FAIL="r_d02")
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1].startswith("error: 1 of 2 runs failed")
    assert (tmp_path / "out" / "replica.s1" / "test_2016_flickr.hyp").is_file()  # the other run finished


@pytest.mark.parametrize(
    "env, key",
    [
        ({"JOBS": "0"}, "JOBS=0"),
        ({"JOBS": "two"}, "JOBS=two"),
        ({"UPDATES": "0"}, "UPDATES=0"),
        ({"UPDATES": "3k"}, "UPDATES=3k"),
        ({"PAIR": "en-fr"}, "PAIR=en-fr"),
    ],  # fmt: skip
)
def test_bad_settings_are_one_line_errors_before_anything_runs(tmp_path, env, key):
    p, calls = trials(tmp_path, "replica", **env)
    assert p.returncode == 2 and calls == []
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith(f"error: {key}: ")


@pytest.mark.parametrize("pair", ["en-de", "de-en"])
def test_const_is_refused_now_that_both_recipes_have_it(tmp_path, pair):
    p, calls = trials(tmp_path, "base", "const", PAIR=pair)
    assert p.returncode == 2 and calls == []
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith("error: const is base now")


def test_an_unknown_trial_is_named_before_anything_runs(tmp_path):
    p, calls = trials(tmp_path, "replica", "r_nope")
    assert p.returncode == 2 and calls == []
    assert p.stderr.strip() == f"error: unknown trial 'r_nope' (see overrides() in {TRIALS})"


def test_de_en_trains_its_own_recipe_and_the_replica_turned_round_never_reusing_an_en_de_run(tmp_path):
    finished_en_de = tmp_path / "out" / "base.s1"  # an En->De run of the same trial and seed, complete
    finished_en_de.mkdir(parents=True)
    (finished_en_de / "test_2016_flickr.hyp").touch()
    p, calls = trials(tmp_path, "base", "finit", "r_combo_const", PAIR="de-en", SEEDS="1", WARMUP="500")
    assert p.returncode == 0, p.stderr
    out, m30k = tmp_path / "out", tmp_path / "data" / "multi30k"
    trains = {next(a for a in c if a.startswith("run_dir=")): c for c in calls if c[1:3] == ["start", "train.py"]}
    assert sorted(trains) == [f"run_dir={out}/{t}.de-en.s1" for t in ("base", "finit", "r_combo_const")]
    base, finit, combo = (trains[f"run_dir={out}/{t}.de-en.s1"] for t in ("base", "finit", "r_combo_const"))
    assert "+experiment=multi30k_de_en" in base and "train.keep_last=10" in base
    assert "+experiment=multi30k_de_en" in finit and "model.init=fairseq" in finit
    assert "+experiment=multi30k_en_de_fairseq" in combo  # the replica's family, turned round
    assert "data.src_lang=de" in combo and "data.tgt_lang=en" in combo
    assert "train.warmup=400" in combo and "train.warmup=500" not in combo  # r_const sets its own warmup
    assert not any("data.src_lang=de" in c for c in (base, finit))  # De->En's recipe needs no turning round
    decodes = [c for c in calls if c[1:3] == ["start", "translate.py"]]
    assert len(decodes) == 3 and all(f"input={m30k}/val.de.gz" in c for c in decodes)
    table = next(c for c in calls if c[1:4] == ["start", "-m", "mt.compare"])
    assert f"{m30k}/val.en.gz" in table and f"{out}/val.de-en.s1.json" in table
    assert f"{out}/base.de-en.s1/val.hyp" in table


def test_en_de_by_default_runs_and_scores_as_before(tmp_path):
    p, calls = trials(tmp_path, "base", "finit", "r_d02", SEEDS="1")
    assert p.returncode == 0, p.stderr
    out, m30k = tmp_path / "out", tmp_path / "data" / "multi30k"
    trains = [c for c in calls if c[1:3] == ["start", "train.py"]]
    assert [c[3] for c in trains] == ["+experiment=multi30k_en_de"] * 2 + ["+experiment=multi30k_en_de_fairseq"]
    assert not any(a.startswith("data.src_lang=") for c in trains for a in c)
    runs = {a for c in trains for a in c if "run_dir=" in a}
    assert runs == {f"run_dir={out}/{t}.s1" for t in ("base", "finit", "r_d02")}
    table = next(c for c in calls if c[1:4] == ["start", "-m", "mt.compare"])
    assert f"{m30k}/val.de.gz" in table and f"{out}/val.s1.json" in table


def test_the_walks_conf_is_r_combo_const_key_for_key(tmp_path):
    """conf/experiment/multi30k_en_de_walk.yaml writes out the harness's r_combo_const (the replica and its
    overrides): the two compose to the same config, so a recipe change to the conf is the trial that was measured."""
    from omegaconf import OmegaConf

    from tests.test_config import compose_train

    p, calls = trials(tmp_path, "r_combo_const", SEEDS="1")
    assert p.returncode == 0, p.stderr
    (train,) = [c for c in calls if c[1:3] == ["start", "train.py"]]
    run_specific = ("train.seed=", "train.max_time=", "train.progress=", "run_dir=", "train.device=", "data.dir=")
    trial = [a for a in train[3:] if not a.startswith(run_specific)]
    assert "+experiment=multi30k_en_de_fairseq" in trial and "train.schedule=constant" in trial
    composed = OmegaConf.to_container(compose_train(trial))
    walk = OmegaConf.to_container(compose_train(["+experiment=multi30k_en_de_walk"]))
    assert walk == composed
