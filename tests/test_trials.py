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
    settings = ("OUT", "DATA", "MINUTES", "SEEDS", "WARMUP", "UPDATES", "DEVICE", "JOBS", "FAIL")  # none inherited
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
    ],  # fmt: skip
)
def test_bad_settings_are_one_line_errors_before_anything_runs(tmp_path, env, key):
    p, calls = trials(tmp_path, "replica", **env)
    assert p.returncode == 2 and calls == []
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith(f"error: {key}: ")


def test_an_unknown_trial_is_named_before_anything_runs(tmp_path):
    p, calls = trials(tmp_path, "replica", "r_nope")
    assert p.returncode == 2 and calls == []
    assert p.stderr.strip() == f"error: unknown trial 'r_nope' (see overrides() in {TRIALS})"
