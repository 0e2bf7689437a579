"""The data path at WMT size: what a first and a second `train.py` run cost before their first update.

    python benchmarks/speed/scale.py --pairs 4500000 [--work /tmp/mt-scale] [--repo .] [--label after]

Makes the corpus with make_corpus.py if WORK/corpus-N is missing, then runs the same train.py command twice
(transformer_base, joint 32k BPE, max_tokens 4096, local gzipped files, its own datasets cache under WORK):

- run 1: an empty cache and run dir; stopped with SIGTERM once its first update is logged (it saves a checkpoint,
  as a user's Ctrl-C would);
- run 2: the same command again, which resumes that run; stopped after its first update likewise.

For each it prints the wall-clock from launch to the first update's metrics record, the peak RSS (the sum over the
process tree, sampled every 0.2 s; datasets' worker processes included), and the stage times read from the log
timestamps: BPE training, tokenization and filtering (pairs/s). Then the cache's size on disk against the gzipped
corpus, and the time to cut one epoch into batches, timed with the sampler of the repo under test on the run's
lengths. `--repo` points at another checkout (e.g. a `git worktree` of an older commit) to measure the code before
a change with the same script; `--label` names the row in the summary appended to WORK/scale.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOALS = {"first": 15 * 60, "second": 60, "rss_gb": 6.0, "cache_ratio": 2.5, "batching_s": 2.0}


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def train_updates(metrics: Path) -> list[int]:
    """The updates of the train records in metrics.jsonl so far."""
    updates = []
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if record.get("kind") == "train":
            updates.append(record["update"])
    return updates


def first_update_after(metrics: Path, after: int) -> int | None:
    return next((u for u in train_updates(metrics) if u > after), None)


def run_once(cmd: list[str], repo: Path, metrics: Path, log_path: Path, after: int, timeout: float) -> dict:
    """Launch, wait for an update beyond `after`, SIGTERM, wait for the checkpoint and exit."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=repo, stdout=log, stderr=subprocess.STDOUT, env=env)
        peak, reached, update = 0, None, None
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            if reached is None and (update := first_update_after(metrics, after)) is not None:
                reached = time.perf_counter() - t0
                proc.send_signal(signal.SIGTERM)
            if reached is None and time.perf_counter() - t0 > timeout:
                proc.send_signal(signal.SIGTERM)
                reached = float("inf")
            time.sleep(0.2)
    return {"to_first_update_s": reached, "update": update, "peak_rss_gb": peak / 1e9, "rc": proc.returncode}


STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def stage_times(log_path: Path) -> dict:
    """Seconds between the log lines that bound each stage (the same lines in the code before and after)."""
    marks: dict[str, float] = {}
    patterns = {
        "start": r"\] - data: ",
        "read": r"pairs read, \d+ dropped as empty",
        "bpe": r"tokenizer: (trained BPE|reusing)",
        "filtered": r"longer than \d+ tokens, \d+ with length ratio",
        "model": r"\] - model: \d+ parameters",
    }
    pairs = None
    for line in log_path.read_text(errors="replace").splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for name, pat in patterns.items():
            if name not in marks and re.search(pat, line):
                marks[name] = t
        if pairs is None and (m2 := re.search(r"train: (\d+) pairs; removed", line)):
            pairs = int(m2.group(1))
    out = {}
    text = log_path.read_text(errors="replace")
    if m := re.search(r"trained BPE on (\d+) of (\d+) pairs in ([\d.]+) s", text):  # the code logs its own figures
        out["bpe_pairs"], out["bpe_s"] = int(m.group(1)), float(m.group(3))
    if m := re.search(r"tokenized (\d+) pairs in ([\d.]+) s \((\d+) pairs/s\)", text):
        out["tokenize_s"], out["tokenize_pairs_per_s"] = float(m.group(2)), int(m.group(3))
    if "reusing the tokenized corpus" in text:  # a second run: nothing to time but the whole
        out["cached"] = True
    if out:
        out["start_to_model_s"] = (
            round(marks["model"] - marks["start"], 1) if {"start", "model"} <= set(marks) else None
        )
        return out
    span = lambda a, b: round(marks[b] - marks[a], 1) if a in marks and b in marks else None  # noqa: E731
    out["read_s"], out["bpe_s"], out["tokenize_filter_s"] = span("start", "read"), span("read", "bpe"), None
    if (s := span("bpe", "filtered")) is not None:
        out["tokenize_filter_s"] = s
        out["tokenize_pairs_per_s"] = round(pairs / s) if pairs and s > 0 else None
    out["start_to_model_s"] = span("start", "model")
    return out


BATCHING = """
import sys, time, numpy as np
sys.path.insert(0, sys.argv[1])
from mt.data.batching import TokenBucketSampler
lens = np.load(sys.argv[2])
sampler = TokenBucketSampler(lens[0] + 1, lens[1] + 1, int(sys.argv[3]), seed=1)
t = time.perf_counter()
n = len(sampler.batches())
print(time.perf_counter() - t, n)
"""


def training_lengths(cache: Path, out: Path) -> bool:
    """The tokenized training set's (source, target) lengths, from the newest Arrow files in the cache that have
    length columns and at least a million rows; saved as one .npy for the batching timer."""
    import datasets
    import numpy as np

    groups: dict[str, list[Path]] = {}  # map output written by several processes: name_0000N_of_0000M.arrow
    for arrow in sorted(cache.rglob("*.arrow"), key=lambda p: p.stat().st_mtime):
        groups.setdefault(re.sub(r"_\d{5}_of_\d{5}$", "", str(arrow.with_suffix(""))), []).append(arrow)
    best = None
    for files in groups.values():
        try:
            parts = [datasets.Dataset.from_file(str(f)) for f in files]
        except Exception:
            continue
        if {"src_len", "tgt_len"} <= set(parts[0].column_names) and sum(map(len, parts)) > 10_000:
            best = datasets.concatenate_datasets(parts)
    if best is None:
        return False
    cols = best.select_columns(["src_len", "tgt_len"]).with_format("numpy")[:]
    np.save(out, np.stack([cols["src_len"], cols["tgt_len"]]))
    return True


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4_500_000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/mt-scale"))
    ap.add_argument("--repo", type=Path, default=HERE.parents[1], help="the checkout whose train.py is measured")
    ap.add_argument("--label", default="")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=45, help="minutes a run may take to its first update")
    ap.add_argument("--overrides", nargs="*", default=[], help="extra train.py overrides")
    args = ap.parse_args()
    repo, work = args.repo.resolve(), args.work.resolve()
    corpus = work / f"corpus-{args.pairs}"
    if not (corpus / "train.de.gz").is_file():
        make = HERE / "make_corpus.py"
        subprocess.run([sys.executable, str(make), str(corpus), "--pairs", str(args.pairs)], check=True)
    tag = f"{args.label or 'run'}-{args.pairs}"
    cache, run_dir = work / f"cache-{tag}", work / f"run-{tag}"
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "train.py", "data=local", "data.name=synthetic", f"data.dir={corpus}",
           "data.src_lang=en", "data.tgt_lang=de", "data.valid_split=val", "data.max_ratio=1.5",
           "data.test_splits=[]", f"data.cache_dir={cache}", "tokenizer=bpe32k", "model=transformer_base",
           f"run_dir={run_dir}",
           f"train.max_tokens={args.max_tokens}", "train.log_every=1", "train.progress=false",
           "train.valid_bleu=false", "train.average_last=0", "train.max_time=0", *args.overrides]  # fmt: skip
    gz = sum(p.stat().st_size for p in corpus.glob("train.*.gz"))
    print(f"{tag}: {args.pairs:,} pairs, {gz / 1e9:.2f} GB gzipped; repo {repo}")
    rows = {}
    for name in ("first", "second"):
        after = max(train_updates(run_dir / "metrics.jsonl"), default=0)  # a stop finishes its update first
        log_path = work / f"{tag}-{name}.log"
        r = run_once(cmd, repo, run_dir / "metrics.jsonl", log_path, after, args.timeout * 60)
        r.update(stage_times(log_path))
        if name == "first":
            r["cache_gb"] = du(cache) / 1e9
            r["cache_ratio"] = r["cache_gb"] / (gz / 1e9)
        rows[name] = r
        print(f"  {name:6s} run: {json.dumps(r)}", flush=True)
    lengths = work / f"{tag}-lengths.npy"
    if training_lengths(cache, lengths):
        out = subprocess.run([sys.executable, "-c", BATCHING, str(repo), str(lengths), str(args.max_tokens)],
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        rows["batching"] = {"epoch_s": round(float(out[0]), 2), "batches": int(out[1])}
        print(f"  batching: one epoch cut in {float(out[0]):.2f} s ({int(out[1]):,} batches of {args.max_tokens})")
    f, s = rows["first"], rows["second"]
    print(
        f"  goals: first run {f['to_first_update_s'] / 60:.1f} min (<= 15), second {s['to_first_update_s']:.0f} s"
        f" (<= 60), peak RSS {max(f['peak_rss_gb'], s['peak_rss_gb']):.1f} GB (<= 6), cache "
        f"{f['cache_ratio']:.2f}x gz (<= 2.5), epoch batching {rows.get('batching', {}).get('epoch_s')} s (<= 2)"
    )
    with open(work / "scale.jsonl", "a") as out:
        out.write(json.dumps({"label": args.label, "pairs": args.pairs, "repo": str(repo), **rows}) + "\n")


if __name__ == "__main__":
    main()
