"""Corpus filtering with `python -m mt.score`: does it find injected noise, and does training on what it keeps pay?

    python benchmarks/quality/filtering.py --out /tmp/filtering [--updates 1400] [--seeds 1 2] [--parallel 2]
    python benchmarks/quality/filtering.py --out /tmp/filtering --seeds 1 --threads 1  # one lane beside another job

The corpus: OPUS EMEA De->En (../shared/data/opus_emea_de_en), 500 of its 5,000 training pairs held out clean as
valid, and 10% of the other 4,500 made noise: half get another pair's target (shuffled), half a target cut after
its first half of words (truncated). The runs, each `+experiment=multi30k_de_en` (`multi30k_en_de` for the
reverse model) on that corpus with warmup 200, held to a number of updates (not a clock, so that runs sharing the
machine are the runs the machine alone would make):

    all_s{seed}   De->En on the noisy corpus; all_s1 is also the scoring model
    rev_s1        En->De on the noisy corpus (the reverse model of the dual conditional cross-entropy)
    kept_s{seed}  De->En on the pairs `mt.score checkpoint=all_s1 reverse=rev_s1 keep=0.85 output=kept` keeps

Then: the share of the injected pairs in the bottom 15% by each score (the forward model's mean log-probability
and the dual score; a length-ratio baseline beside them), and kept against all on EMEA's test (mt.compare, each
seed, and the seeds pooled once all have run); --catch-only stops after the ranking. Outputs in OUT, nothing in
the repository; a finished run is not run again, so calls with --seeds 1 and --seeds 2 may go side by side (once
the ranking is written) and a last call with --seeds 1 2 reports.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
EMEA = ROOT.parent / "shared" / "data" / "opus_emea_de_en"
SRC, TGT = "de", "en"


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def write(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def make_corpus(out: Path, noise: float, valid: int, seed: int = 1) -> dict:
    """OUT/noisy: train (with noise), valid (clean), test (EMEA's); returns the injected lines of train."""
    info = out / "injected.json"
    if info.is_file():
        return json.loads(info.read_text())
    src, tgt = read(EMEA / f"train.{SRC}.gz"), read(EMEA / f"train.{TGT}.gz")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(src))
    held, rest = sorted(order[:valid]), sorted(order[valid:])
    train_src, train_tgt = [src[i] for i in rest], [tgt[i] for i in rest]
    long_enough = [i for i, t in enumerate(train_tgt) if len(t.split()) >= 4]
    picked = rng.choice(long_enough, size=round(noise * len(train_src)), replace=False)
    shuffled, truncated = sorted(picked[: len(picked) // 2]), sorted(picked[len(picked) // 2 :])
    moved = [train_tgt[i] for i in shuffled]  # each gets the next one's target (a cycle: none keeps its own)
    for i, t in zip(shuffled, moved[1:] + moved[:1]):
        train_tgt[i] = t
    for i in truncated:
        words = train_tgt[i].split()
        train_tgt[i] = " ".join(words[: len(words) // 2])
    out.mkdir(parents=True, exist_ok=True)
    write(out / f"train.{SRC}.gz", train_src)
    write(out / f"train.{TGT}.gz", train_tgt)
    write(out / f"valid.{SRC}.gz", [src[i] for i in held])
    write(out / f"valid.{TGT}.gz", [tgt[i] for i in held])
    for lang in (SRC, TGT):
        link(out / f"test.{lang}.gz", EMEA / f"test.{lang}.gz")
    injected = {"shuffled": [int(i) for i in shuffled], "truncated": [int(i) for i in truncated],
                "train": len(train_src)}  # fmt: skip
    info.write_text(json.dumps(injected))
    return injected


def link(path: Path, target: Path) -> None:
    if not path.exists():
        path.symlink_to(target.resolve())


def train_cmd(run: Path, data: Path, seed: int, updates: int, reverse: bool = False) -> list[str]:
    recipe = "multi30k_en_de" if reverse else "multi30k_de_en"
    src, tgt = (TGT, SRC) if reverse else (SRC, TGT)
    return [sys.executable, "train.py", f"+experiment={recipe}", "data=local", f"data.dir={data}",
            f"data.src_lang={src}", f"data.tgt_lang={tgt}", "data.valid_split=valid", "data.test_splits=[test]",
            f"train.seed={seed}", "train.max_time=0", f"train.max_updates={updates}", "train.warmup=200",
            "train.progress=false", f"run_dir={run}"]  # fmt: skip


def train_all(jobs: list[tuple[Path, list[str]]], parallel: int, threads: int) -> None:
    """Each (run dir, command) unless it finished, `parallel` at a time, each on `threads` threads."""
    todo = [(run, cmd) for run, cmd in jobs if not (run / "checkpoint_final.pt").is_file()]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    for start in range(0, len(todo), parallel):
        procs = []
        for run, cmd in todo[start : start + parallel]:
            print(f"training {run.name}: {' '.join(cmd[1:])}", file=sys.stderr)
            log = open(run.parent / f"{run.name}.log", "a")  # noqa: SIM115
            procs.append((run, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)))
        for run, proc in procs:
            if proc.wait() != 0:
                sys.exit(f"{run.name} failed: see {run.parent / (run.name + '.log')}")


def catch_rates(scores: np.ndarray, injected: dict, bottom: float) -> dict:
    """The share of the injected pairs (all, shuffled, truncated) among the `bottom` fraction of `scores`."""
    n_low = round(bottom * len(scores))
    low = set(np.argsort(scores, kind="stable")[:n_low].tolist())
    rate = {kind: sum(i in low for i in injected[kind]) / len(injected[kind]) for kind in ("shuffled", "truncated")}
    every = injected["shuffled"] + injected["truncated"]
    return {"injected": sum(i in low for i in every) / len(every), **rate}


def length_ratio_scores(data: Path) -> np.ndarray:
    """The baseline: how far a pair's word-count ratio is from the corpus median (in log), negated."""
    ratios = np.array([np.log((len(t.split()) + 1) / (len(s.split()) + 1))
                       for s, t in zip(read(data / f"train.{SRC}.gz"), read(data / f"train.{TGT}.gz"))])  # fmt: skip
    return -np.abs(ratios - np.median(ratios))


def compare(out: Path, names: list[str], hyps: list[Path], refs: Path, tag: str) -> dict:
    result = out / f"compare_{tag}.json"
    subprocess.run([sys.executable, "-m", "mt.compare", *map(str, hyps), "--refs", str(refs),
                    "--names", ",".join(names), "--json", str(result)], cwd=ROOT, check=True)  # fmt: skip
    return json.loads(result.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--updates", type=int, default=1400)
    ap.add_argument("--catch-only", action="store_true", help="the scoring models and the ranking, no more runs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--keep", type=float, default=0.85)
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time (update-bounded, so the same models)")
    ap.add_argument("--threads", type=int, default=0, help="threads per run (default: the cores / --parallel)")
    args = ap.parse_args()
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.parallel)
    out = args.out.resolve()
    noisy, kept = out / "noisy", out / "kept"
    injected = make_corpus(noisy, args.noise, valid=500)
    first = [(out / "all_s1", train_cmd(out / "all_s1", noisy, 1, args.updates)),
             (out / "rev_s1", train_cmd(out / "rev_s1", noisy, 1, args.updates, reverse=True))]  # fmt: skip
    train_all(first, args.parallel, threads)
    if not (kept / "scores.txt").is_file():
        subprocess.run([sys.executable, "-m", "mt.score", f"checkpoint={out / 'all_s1'}",
                        f"reverse={out / 'rev_s1'}", f"src={noisy / f'train.{SRC}.gz'}",
                        f"tgt={noisy / f'train.{TGT}.gz'}", f"keep={args.keep}", f"output={kept}"],
                       cwd=ROOT, check=True)  # fmt: skip
    for split in ("valid", "test"):
        for lang in (SRC, TGT):
            link(kept / f"{split}.{lang}.gz", noisy / f"{split}.{lang}.gz")
    if not args.catch_only:
        rest = [(out / f"all_s{s}", train_cmd(out / f"all_s{s}", noisy, s, args.updates)) for s in args.seeds]
        rest += [(out / f"kept_s{s}", train_cmd(out / f"kept_s{s}", kept, s, args.updates)) for s in args.seeds]
        train_all(rest, args.parallel, threads)

    columns = np.loadtxt(kept / "scores.txt", ndmin=2)
    bottom = 1 - args.keep
    found = {"score (forward mean log-probability)": catch_rates(columns[:, 0], injected, bottom),
             "dual conditional cross-entropy (kept by)": catch_rates(columns[:, -1], injected, bottom),
             "length ratio (baseline)": catch_rates(length_ratio_scores(noisy), injected, bottom)}  # fmt: skip
    print(
        f"\n## Injected pairs in the bottom {bottom:.0%} ({len(injected['shuffled'])} shuffled, "
        f"{len(injected['truncated'])} truncated of {injected['train']} pairs)\n"
    )
    print("| ranked by | all injected | shuffled | truncated |\n|---|---|---|---|")
    for name, r in found.items():
        print(f"| {name} | {r['injected']:.1%} | {r['shuffled']:.1%} | {r['truncated']:.1%} |")
    refs = noisy / f"test.{TGT}.gz"
    results = {"catch": found, "updates": args.updates}
    if args.catch_only:
        (out / "filtering_catch.json").write_text(json.dumps(results, indent=1))
        return
    for s in args.seeds:
        print(f"\n## Seed {s}: trained on the kept pairs against all\n")
        results[f"seed{s}"] = compare(out, ["all", "kept"], [out / f"all_s{s}/test.hyp", out / f"kept_s{s}/test.hyp"],
                                      refs, f"s{s}")  # fmt: skip
    if len(args.seeds) > 1:
        pooled = {}
        for name in ("all", "kept"):  # both seeds' outputs one after the other, against the references twice
            pooled[name] = out / f"pooled_{name}.hyp"
            pooled[name].write_text("".join((out / f"{name}_s{s}/test.hyp").read_text() for s in args.seeds))
        pooled_refs = out / "pooled_refs.txt"
        pooled_refs.write_text("".join("\n".join(read(refs)) + "\n" for _ in args.seeds))
        print("\n## The seeds pooled\n")
        results["pooled"] = compare(out, ["all", "kept"], [pooled["all"], pooled["kept"]], pooled_refs, "pooled")
    (out / f"filtering_s{'_'.join(map(str, args.seeds))}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
