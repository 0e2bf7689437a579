"""Changes to `+experiment=auto`'s rule tried at a CPU budget's update count, many at once on a GPU (docs/auto.md).

A CPU trial of 30 minutes tests one setting; a lent GPU trains ten such small models at once in a few minutes. Each
trial here is the rule with one change (a patch of a table in mt/train/auto.py, or overrides on its choices), or
fairseq's recipe with one change, run to the number of updates the CPU budget holds for it: the rule's own count,
from the CPU run's measured corpus (its auto.json) and the CPU's speed of the trial's shape. So a trial that makes
the model cheaper per token (`ff256`) gets the extra updates it would get on the CPU.

    # here, on the CPU machine, after the CPU runs of the point (auto_trials.py run iwslt_30 auto fairseq):
    python benchmarks/quality/auto_replay.py plan iwslt_30 auto noextras ff512 fairseq \
        --cpu-runs runs/trials --data .gpudata --out .gpudata/plan.json
    # there, on the GPU machine (after benchmarks/gpu_kit.sh prepare, data and plan carried in .gpudata):
    python benchmarks/quality/auto_replay.py run .gpudata/plan.json --device cuda --jobs 10 --out OUT
    # anywhere: each run's test scores, then the val table (whole val set, paired bootstrap against the first run)
    python benchmarks/quality/auto_replay.py table OUT iwslt_30 --refs val.en   # --split test: the test set

The CPU speed of a trial's shape and vocabulary is the CPU run's (its auto.json) times the ratio of the probe's
speeds of the two (mt/train/probe.py), measured on this CPU, and every auto trial's count is scaled by the CPU run's
updates over the rule's plan for it (the probe's 24-token sentences run at another rate than a corpus's); fairseq's
trials run the CPU run's own update count (same shape, same speed). The CPU run of `auto` read is the rule as it is
now (its auto.json records the compact shape's speed); the trials of the rule's earlier forms ran at the commits
docs/experiments/auto.md names.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))

from auto_trials import CORPORA, POINTS, RECIPES, run_dir  # noqa: E402

from mt.train import auto  # noqa: E402

NO_EXTRAS = {"FLORES_EPOCHS": math.inf}  # FLoRes' extras never (attention/activation dropout 0, smoothing 0.1)
FF512 = {"SHAPES": {**auto.SHAPES, "compact": {**auto.SHAPES["compact"], "d_ff": 512}}}
LONG = {"LONG_RUN_UPDATES": 0}  # fairseq's schedule and 8,192-token updates at any budget
SHORT = {"LONG_RUN_UPDATES": math.inf}  # the quickstart's schedule and 2,500-token updates at any budget

# name -> (the recipe it changes, patches of mt/train/auto.py's tables, overrides on the choices). The trials of the
# rule's earlier forms (docs/experiments/auto.md) ran at the commits the record names: their patches were of tables
# the rule no longer has.
TRIALS: dict[str, tuple[str, dict, list[str]]] = {
    "auto": ("auto", {}, []),  # the rule as it is
    "noextras": ("auto", NO_EXTRAS, []),
    "ff512": ("auto", FF512, []),  # the paper's FFN ratio on the compact shape: fewer updates
    "long_now": ("auto", LONG, []),  # fairseq's schedule, warmup and 8,192-token updates
    "short_now": ("auto", SHORT, []),
    "v4k_now": ("auto", {}, ["tokenizer.vocab_size=4000"]),
    "v8k_now": ("auto", {}, ["tokenizer.vocab_size=8000"]),
    "v10k_now": ("auto", {}, ["tokenizer.vocab_size=10000"]),
    "dropout01_now": ("auto", {}, ["model.dropout=0.1"]),
    "dropout02_now": ("auto", {}, ["model.dropout=0.2"]),
    "dropout03_now": ("auto", {}, ["model.dropout=0.3"]),
    "avg10_now": ("auto", {}, ["train.keep_last=10", "train.average_last=10"]),
    "fairseq": ("fairseq", {}, []),
    "fairseq_cased4k": (
        "fairseq",
        {},
        ["tokenizer.normalization=NFC", "tokenizer.pretokenize=none", "tokenizer.vocab_size=4000"],
    ),  # fmt: skip
    "fairseq_case": (
        "fairseq",
        {},
        ["tokenizer.normalization=NFC", "tokenizer.pretokenize=none", "tokenizer.case_markup=true"],
    ),  # fmt: skip
}


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


@contextlib.contextmanager
def patched(patches: dict):
    """mt/train/auto.py with some of its tables replaced, for the length of a with block."""
    if missing := sorted(set(patches) - set(vars(auto))):
        raise KeyError(f"mt/train/auto.py has no {', '.join(missing)}: the patch would change nothing")
    saved = {name: getattr(auto, name) for name in patches}
    try:
        for name, value in patches.items():
            setattr(auto, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(auto, name, value)


def rule_with(patches: dict, corpus: auto.CorpusStats, budget: auto.Budget, speed) -> tuple[list[str], int]:
    """The rule's choices (as overrides) and its update count with `patches` applied to its tables."""
    with patched(patches):
        chosen = auto.choose(corpus, budget, speed)
    choices = {c.key: c.value for c in chosen if c.key not in (auto.NOTE, auto.PLAN)}
    updates = next(c.value["updates"] for c in chosen if c.key == auto.PLAN)
    return [f"{k}={_value(v)}" for k, v in choices.items()], updates


def recorded_speed(record: dict) -> auto.Speed:
    """The speed a CPU run's auto.json planned with: points (shape, vocabulary, extras), or an older run's one figure
    a shape."""
    if isinstance(record["speed"], dict):
        return auto.Speed(flat=record["speed"])
    return auto.Speed({(shape, vocab, extras): rate for shape, vocab, extras, rate in record["speed"]})


def compact_speed(record: dict, vocab: int) -> float:
    """The compact shape's speed with `vocab` (no extras) in a CPU run's auto.json."""
    return recorded_speed(record)("compact", vocab)


@functools.cache
def _speed(shape: tuple, vocab: int) -> float:
    """The probe's padded tokens/s of `shape` with a `vocab`-type output layer on this CPU (median of three)."""
    import torch

    from mt.train import probe

    return sorted(probe.measure(dict(shape), torch.device("cpu"), vocab=vocab) for _ in range(3))[1]


def cpu_speed(shape: dict, vocab: int, recorded: float, recorded_vocab: int) -> float:
    """Padded tokens/s of `shape` with `vocab` types on this CPU: the CPU run's own figure (the compact shape, its
    vocabulary) times the ratio of the probe's speeds of the two, measured here."""
    if shape == auto.SHAPES["compact"] and vocab == recorded_vocab:
        return recorded
    key = lambda d: tuple(sorted(d.items()))  # noqa: E731
    return recorded * _speed(key(shape), vocab) / _speed(key(auto.SHAPES["compact"]), recorded_vocab)


def cpu_updates(run: Path) -> int:
    return max(json.loads(line).get("update", 0) for line in (run / "metrics.jsonl").open() if line.strip())


def plan(point: str, names: list[str], cpu_runs: Path, data: Path, seeds: list[int]) -> list[dict]:
    corpus_name, _ = POINTS[point]
    corpus = CORPORA[corpus_name]
    record = json.loads((run_dir(cpu_runs, point, "auto", 1) / "auto.json").read_text())
    c = record["corpus"]
    stats = auto.CorpusStats(c["pairs"], c["src_words"], c["tgt_words"],
                             {int(k): auto.Epoch(**e) for k, e in c.get("epochs", {}).items()},
                             c.get("frequent_types", 0))  # fmt: skip
    budget = auto.Budget(**record["budget"])
    fairseq_updates = cpu_updates(run_dir(cpu_runs, point, "fairseq", 1))
    # The rule's count against the CPU run's: the probe's speed is of 24-token sentences, and a corpus of shorter
    # or longer ones trains at another rate (EMEA: 23% more updates than planned). Every auto trial is scaled so.
    _, planned = rule_with({}, stats, budget, recorded_speed(record))
    calibration = cpu_updates(run_dir(cpu_runs, point, "auto", 1)) / planned
    data_args = [a.replace(str(Path("../shared/data")), str(data)) for a in corpus.overrides(data)]
    if not any(a.startswith("data.dir=") for a in data_args):  # the whole of Multi30k: its config's dir is ../shared
        data_args.append(f"data.dir={data / 'multi30k'}")
    out = []
    for name in names:
        recipe, patches, extra = TRIALS[name]
        if recipe == "auto":
            run_vocab = next(c["value"] for c in record["choices"] if c["key"] == "tokenizer.vocab_size")
            with patched(patches):
                given = dict(e.split("=", 1) for e in extra)
                ruled = {c.key: c.value for c in auto.choose(stats, budget, recorded_speed(record))}
                vocab = int(given.get("tokenizer.vocab_size", 0)) or ruled["tokenizer.vocab_size"]
                shape = auto.SHAPES["compact"]
            speed = {"compact": cpu_speed(shape, vocab, compact_speed(record, run_vocab), run_vocab)}
            trial_stats = dataclasses.replace(stats, measured_at=run_vocab)  # the run measured its own BPE's epoch
            choices, updates = rule_with(patches, trial_stats, budget, speed)
            updates = round(updates * calibration)
            # Hydra takes one value a key: the trial's wins
            args = ["+experiment=auto", "auto.enabled=false", *[c for c in choices if c.split("=", 1)[0] not in given]]
        else:
            args, updates = list(RECIPES[recipe]), fairseq_updates
        for seed in seeds:
            out.append({"name": f"{point}.{name}", "seed": seed, "updates": updates, "split": corpus.split,
                        "args": [*args, *extra, *data_args, "train.max_time=0", f"train.max_updates={updates}",
                                 f"train.seed={seed}", "train.progress=false"]})  # fmt: skip
    return out


def run(plan_file: Path, device: str, jobs: int, out: Path) -> None:
    trials = json.loads(plan_file.read_text())
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // jobs))}

    def one(t: dict) -> str:
        run = out / f"{t['name']}.s{t['seed']}"
        start = time.time()
        with open(f"{run}.log", "w") as log:
            rc = subprocess.run([sys.executable, "train.py", *t["args"], f"train.device={device}",
                                 f"run_dir={run}", f"data.cache_dir={run}.cache"], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT).returncode  # fmt: skip
            arg = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in t["args"] if "=" in a}
            val = ROOT / arg.get("data.dir", "") / f"val.{arg.get('data.src_lang', 'en')}.gz"
            if rc == 0 and "data.dir" in arg and val.is_file():  # corpora with a val file; else the test alone
                rc = subprocess.run([sys.executable, "translate.py", f"checkpoint={run}", f"input={val}",
                                     f"output={run}/val.hyp", f"device={device}"], cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT).returncode  # fmt: skip
        return f"{run.name}: exit {rc}, {time.time() - start:.0f} s"

    with ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(one, trials):
            print(line, flush=True)


def table(out: Path, refs: Path, point: str, split: str) -> None:
    """Each run's updates, its best whole-val loss and test scores, then the val table: every run's val
    hypotheses against the first's, paired bootstrap (mt.compare)."""
    runs = sorted(p for p in out.iterdir() if p.name.startswith(f"{point}.") and (p / f"{split}.hyp").is_file())
    for p in runs:
        r = json.loads(next(p.glob("test*.report.json")).read_text())
        metrics = p / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        rows = [json.loads(line) for line in lines if line.strip()]
        nll = min((row["valid_nll"] for row in rows if "valid_nll" in row), default=float("nan"))
        updates = max((row.get("update", 0) for row in rows), default=0)
        print(f"{p.name}: {updates:,} updates, best val nll {nll:.3f}; test lc BLEU {r['bleu_lowercase']:.2f}, "
              f"BLEU {r['bleu']:.2f}, chrF {r['chrf']:.2f}")  # fmt: skip
    subprocess.run([sys.executable, "-m", "mt.compare", *[str(p / f"{split}.hyp") for p in runs], "--refs", str(refs),
                    "--names", ",".join(p.name for p in runs)], cwd=ROOT, check=False)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="action", required=True)
    p = sub.add_parser("plan")
    p.add_argument("point", choices=list(POINTS))
    p.add_argument("trials", nargs="+", choices=list(TRIALS))
    p.add_argument("--cpu-runs", type=Path, required=True)
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--seed", type=int, nargs="+", default=[1])
    p.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("plan", type=Path)
    r.add_argument("--device", default="cuda")
    r.add_argument("--jobs", type=int, default=8)
    r.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("out", type=Path)
    t.add_argument("point", choices=list(POINTS))
    t.add_argument("--split", choices=["val", "test"], default="val")
    t.add_argument("--refs", type=Path, required=True, help="the split's references (plain text)")
    args = ap.parse_args()
    if args.action == "plan":
        trials = plan(args.point, args.trials, args.cpu_runs, args.data, args.seed)
        args.out.write_text(json.dumps(trials, indent=1) + "\n")
        for t in trials:
            print(f"{t['name']}.s{t['seed']}: {t['updates']:,} updates")
    elif args.action == "run":
        run(args.plan, args.device, args.jobs, args.out.resolve())
    else:
        table(args.out, args.refs, args.point, args.split)


if __name__ == "__main__":
    main()
