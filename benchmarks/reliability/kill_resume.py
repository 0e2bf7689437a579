"""kill -9 at random moments loses nothing: a tiny `train.py` job is SIGKILLed again and again, the same command is
re-run until it finishes, and its final weights are compared bitwise with an uninterrupted run's.

    python benchmarks/reliability/kill_resume.py [--kills 8] [--seed 0] [--workdir DIR]

The kills are aimed at the phases where work can be lost: data preparation (reading, BPE training), the middle of
an epoch, a validation, a checkpoint write, and the end of the run (averaging, the test report). To make the short
phases hittable, the child process (this file with `--child`) runs the real train.py with a pause of 0.3 s inside
every `torch.save` (after the bytes are written, before the fsync and the rename) and at the start of every
validation, and prints a marker line when it enters one. Prints one line per kill and a summary.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# (what to wait for on the child's stderr, its n-th occurrence in that run, delay range in seconds after it, phase):
# one kill per entry, in turn. Each epoch end logs "validation at update" and writes three checkpoints (best,
# epoch, last), so counting markers aims the kills at later epochs of the resumed runs too.
TARGETS = [
    ("data: ", 1, (0.0, 0.6), "data preparation (reading, BPE, tokenizing)"),
    ("validation at update", 1, (1.0, 1.5), "mid-epoch, after an epoch end"),
    ("HARNESS validate", 2, (0.05, 0.25), "during validation"),
    ("HARNESS save", 3, (0.05, 0.25), "during a checkpoint write (checkpoint_last)"),
    ("data: ", 1, (0.0, 0.3), "data preparation (from the cache)"),
    ("resumed from", 1, (0.1, 0.5), "mid-epoch, just after resuming"),
    ("HARNESS save", 5, (0.0, 0.1), "during a checkpoint write (an epoch checkpoint)"),
    ("HARNESS validate", 1, (0.0, 0.2), "during validation"),
    ("training stopped", 1, (0.0, 0.4), "averaging / test report"),
]


def train_args(corpus: Path, run_dir: Path) -> list[str]:
    return [
        "data=local",
        f"data.dir={corpus}",
        "data.src_lang=xx",
        "data.tgt_lang=yy",
        "model=transformer_tiny",
        "tokenizer.vocab_size=60",
        "tokenizer.min_frequency=1",
        "train.max_epochs=8",
        "train.max_tokens=300",
        "train.keep_last=3",
        "train.average_last=2",
        "train.progress=false",
        "train.device=cpu",
        "train.tensorboard=false",
        f"data.cache_dir={run_dir.parent / 'cache'}",
        "decode=greedy",
        f"run_dir={run_dir}",
    ]


def child(args: list[str]) -> None:
    """train.py with pauses in checkpoint writes and validations, and marker lines on stderr."""
    import runpy

    import torch

    from mt.train.trainer import Trainer

    real_save, real_validate = torch.save, Trainer.validate

    def slow_save(obj, f, *a, **k):
        print("HARNESS save", file=sys.stderr, flush=True)
        real_save(obj, f, *a, **k)
        time.sleep(0.3)

    def slow_validate(self, *a, **k):
        print("HARNESS validate", file=sys.stderr, flush=True)
        time.sleep(0.3)
        return real_validate(self, *a, **k)

    torch.save, Trainer.validate = slow_save, slow_validate
    sys.argv = [str(ROOT / "train.py"), *args]
    runpy.run_path(str(ROOT / "train.py"), run_name="__main__")


def launch(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    return subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)


def run_and_kill(args: list[str], wait_for: str, nth: int, delay: float, log: list[str]) -> tuple[bool, str]:
    """Start the command, SIGKILL it `delay` s after the `nth` line with `wait_for` on its stderr. Returns (killed,
    its last line)."""
    proc, seen = launch(args), threading.Event()
    last, count = [""], [0]

    def read():
        for line in proc.stderr:
            log.append(line)
            last[0] = line.strip()
            count[0] += wait_for in line
            if count[0] >= nth:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while not seen.is_set() and proc.poll() is None:
        time.sleep(0.01)
    if proc.poll() is None:
        time.sleep(delay)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join(timeout=10)
    return killed, last[0]


def run_to_end(args: list[str], log: list[str]) -> int:
    proc = launch(args)
    _, err = proc.communicate()
    log.append(err)
    return proc.returncode


def weights(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def same_weights(a: Path, b: Path) -> bool:
    import torch

    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def campaign(workdir: Path, kills: int, seed: int, verbose: bool = True) -> dict:
    """Kill, re-run until finished, compare with an uninterrupted run: {"kills", "phases", "reruns", "resumes",
    "bitwise_equal", "hyps_equal", "orphans"}."""
    from tests.conftest import write_toy_corpus

    rng = random.Random(seed)
    corpus = write_toy_corpus(workdir / "corpus")
    log: list[str] = []
    straight, killed_dir = workdir / "straight" / "run", workdir / "killed" / "run"
    if run_to_end(train_args(corpus, straight), log) != 0:
        raise RuntimeError("the uninterrupted run failed:\n" + "".join(log[-1:])[-3000:])
    args, phases = train_args(corpus, killed_dir), []
    for i in range(kills):
        wait_for, nth, (lo, hi), phase = TARGETS[i % len(TARGETS)]
        killed, last = run_and_kill(args, wait_for, nth, rng.uniform(lo, hi), log)
        phases.append((phase, killed, last))
        if verbose:
            print(f"kill {i + 1}: {phase}: {'SIGKILL' if killed else 'finished first'}; last line: {last[:110]}")
        if (killed_dir / "checkpoint_final.pt").is_file() and not killed:
            break  # finished before this kill: nothing left to interrupt
    reruns = 0
    while not (killed_dir / "test.report.json").is_file() or reruns == 0:
        reruns += 1
        rc = run_to_end(args, log)
        if rc != 0 or reruns > 5:
            raise RuntimeError(f"re-run {reruns} exited {rc}:\n" + log[-1][-3000:])
    # The weights at the end of training, every kept epoch checkpoint, and the final (best or averaged) ones.
    names = ["checkpoint_last.pt", "checkpoint_final.pt"] + [p.name for p in straight.glob("checkpoint[0-9]*.pt")]
    equal = all((killed_dir / n).is_file() and same_weights(straight / n, killed_dir / n) for n in names)
    hyps = (straight / "test.hyp").read_text() == (killed_dir / "test.hyp").read_text()
    orphans = [p.name for p in killed_dir.glob(".*tmp*")]
    done = sum(k for _, k, _ in phases)
    resumes = sum("resumed from" in line for line in log)
    return {"kills": done, "phases": phases, "reruns": reruns, "resumes": resumes, "bitwise_equal": equal,
            "hyps_equal": hyps, "orphans": orphans}  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=len(TARGETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, help="default: a temporary directory, removed at the end")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kill_resume_"))
    start = time.time()
    try:
        r = campaign(workdir, args.kills, args.seed)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"{r['kills']} kills survived, {r['resumes']} resumes, {r['reruns']} re-run(s) to finish; weights bitwise "
        f"equal to the uninterrupted run's (last, epoch and final checkpoints): {r['bitwise_equal']}; test "
        f"translations equal: {r['hyps_equal']}; orphaned temp files: {len(r['orphans'])} ({time.time() - start:.0f} s)"
    )


if __name__ == "__main__":
    main()
