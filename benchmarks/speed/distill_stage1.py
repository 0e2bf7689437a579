"""Stage 1 of `+experiment=distill` at scale: the teacher translating `distill.source_text` of N lines, its peak
memory (flat in N: the text is streamed chunk by chunk into the cache) and its lines/s beside translate.py's on
the same teacher and lines (the stage adds nothing to decoding).

    python benchmarks/speed/distill_stage1.py TEACHER_RUN --lines 100000 1000000 [--out /tmp/stage1] [--compare 5000]
        [--decode beam_size=1]

The source text is synthetic: Multi30k's English training sentences drawn at random (seeded), one a line, written
to OUT/source_N.txt. Each N runs stage 1 in a child process of its own (`train.py +experiment=distill ...
distill.source_text=OUT/source_N.txt distill.translate_only=true`, no time budget, so the teacher translates the
training sources and every line of the text, and no student trains), whose peak resident memory is the child's
`ru_maxrss` (the student's own data grows with the text it trains on; stage 1's memory should not). The stage's
lines/s: the text's lines over the wall-clock time of its fill as the log gives it (reading, decoding, writing,
fsync), and over the decoding time the cache records (mt/decode/teacher.py); translate.py translates the first
--compare lines of the same text with the same teacher and its own decoding settings, or with the --decode settings
given to both (`+distill.teacher_decode.K=V` and `decode.K=V`). Run it with the machine alone; outputs in OUT,
nothing in the repository.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def write_text(path: Path, n: int, seed: int = 1) -> Path:
    """`n` English lines drawn from Multi30k's training sources."""
    if path.is_file() and sum(1 for _ in open(path, encoding="utf-8")) == n:
        return path
    with gzip.open(MULTI30K / "train.en.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as out:
        for start in range(0, n, 100_000):
            picks = rng.integers(len(sentences), size=min(100_000, n - start))
            out.writelines(sentences[i] + "\n" for i in picks)
    return path


def run(args: list[str], log: Path) -> tuple[int, str, float, float]:
    """A child process: (its exit status, its stderr, its peak resident memory in GiB, its wall-clock seconds)."""
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (ru_maxrss: KiB on Linux)
    return os.waitstatus_to_exitcode(status), log.read_text(), usage.ru_maxrss / 2**20, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("teacher", help="the teacher: a run dir of this project (e.g. a compact Multi30k En->De run)")
    ap.add_argument("--lines", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--out", type=Path, default=Path("/tmp/distill_stage1"))
    ap.add_argument("--compare", type=int, default=5_000, help="lines translate.py translates for its lines/s")
    ap.add_argument("--decode", nargs="*", default=[], metavar="K=V", help="decode.* settings over the teacher's own")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.lines:
        text = write_text(args.out / f"source_{n}.txt", n)
        run_dir, cache = args.out / f"run_{n}", args.out / "cache"  # (the training sources: translated once)
        command = ["train.py", "+experiment=distill", f"distill.teacher={args.teacher}", "data=multi30k",
                   f"distill.source_text={text}", f"distill.cache_dir={cache}", "distill.min_speedup=0",
                   "distill.translate_only=true", "train.max_time=0", "train.progress=false",
                   f"run_dir={run_dir}", "train.resume=never",
                   *(f"+distill.teacher_decode.{kv}" for kv in args.decode)]  # fmt: skip
        status, err, peak, seconds = run(command, args.out / f"train_{n}.log")
        if status != 0:
            sys.exit(f"{n} lines: train.py failed:\n{err[-3000:]}")
        record = json.loads((run_dir / "distill.json").read_text())
        (entry,) = [t for t in record["texts"] if t["text"].startswith("distill.source_text")]
        progress = json.loads((Path(entry["cache"]) / "progress.json").read_text())
        rate = progress["lines"] / progress["seconds"] if progress.get("seconds") else float("nan")
        fill = re.search(r"distill\.source_text=.*lines translated \(.*, this run ([\d.]+) (s|min)\)", err)
        fill_s = float(fill.group(1)) * (60 if fill.group(2) == "min" else 1) if fill else float("nan")
        rows.append((n, entry["lines"], peak, seconds, entry["lines"] / fill_s, rate))
    head = args.out / "head.txt"
    with open(text, encoding="utf-8") as f, open(head, "w", encoding="utf-8") as out:
        out.writelines(line for _, line in zip(range(args.compare), f))
    _, err, _, _ = run(["translate.py", f"checkpoint={args.teacher}", f"input={head}",
                        f"output={args.out / 'head.hyp'}", *(f"decode.{kv}" for kv in args.decode)],
                       args.out / "translate.log")  # fmt: skip
    m = re.search(r"([\d.]+) sentences/s", err)
    translate_rate = float(m.group(1)) if m else float("nan")
    settings = ", ".join(args.decode) or "its own decoding settings"
    print(f"teacher {args.teacher} ({settings}); {os.cpu_count()} CPUs; synthetic Multi30k English lines")
    print("| source_text lines | translated | peak RSS (GiB) | wall-clock (min) | lines/s (fill) | (decoding) |")
    print("|---|---|---|---|---|---|")
    for n, done, peak, seconds, wall_rate, rate in rows:
        print(f"| {n:,} | {done:,} | {peak:.2f} | {seconds / 60:.1f} | {wall_rate:.1f} | {rate:.1f} |")
    print(f"translate.py on the first {args.compare:,} lines, the same settings: {translate_rate:.1f} lines/s")


if __name__ == "__main__":
    main()
