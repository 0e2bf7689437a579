"""translate.py on hostile text: random lines of every kind must give exit 0 and exactly one output line each.

    python benchmarks/reliability/fuzz_translate.py CHECKPOINT [--lines 10000] [--seed 0]

Lines mix control characters, "\\r", U+2028, U+0085 and other separators inside a line, emoji, right-to-left
scripts, combining marks, CJK, 20,000-character lines, and empty and blank lines. Input and output are split on
"\\n" only. Prints lines in, lines out, the exit code and the time.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"-()",
    "".join(chr(c) for c in range(0x00, 0x20) if c != 0x0A) + "\x7f",  # C0 controls (not "\n") and DEL
    "\r\u2028\u2029\u0085\u000b\u000c\u001c\u001d\u001e",  # what str.splitlines() would split on
    "😀🐶🚀👨‍👩‍👧‍👦🏳️‍🌈✨🇩🇪",  # emoji, ZWJ sequences, flags
    "שלום עולם مرحبا بالعالم \u200f\u200e\u202e",  # RTL scripts and direction marks
    "e\u0301a\u0308o\u0303\u0327\u0338\u20dd",  # combining marks
    "猫が走る狗在跑고양이",  # CJK
    "\ufeff\u200b\u00a0\u3000\ufffd\U0010fffd",  # BOM, zero-width space, odd spaces, replacement, private use
]


def fuzz_lines(n: int, seed: int) -> list[str]:
    """n lines (without "\\n"), a mix of every kind above, some empty, some blank, some 20,000 characters."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.05:
            lines.append("")
        elif kind < 0.08:
            lines.append(rng.choice([" ", "\t", "  \t ", "\u3000", "\r"]))
        else:
            length = 20_000 if i % 997 == 0 else rng.randint(1, 80)
            mixed = rng.sample(ALPHABETS, rng.randint(1, 3))
            lines.append("".join(rng.choice(rng.choice(mixed)) for _ in range(length)))
    return lines


def fuzz(checkpoint: str, n: int, seed: int) -> dict:
    lines = fuzz_lines(n, seed)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "fuzz.txt"
        src.write_bytes(data)
        start = time.time()
        p = subprocess.run(
            [sys.executable, "translate.py", f"checkpoint={checkpoint}", f"input={src}", "decode=greedy"],
            cwd=ROOT, capture_output=True, env=env, timeout=3000,
        )  # fmt: skip
    out = p.stdout.decode("utf-8", errors="replace").split("\n")
    if out and out[-1] == "":
        out.pop()
    return {"lines_in": len(lines), "lines_out": len(out), "rc": p.returncode, "seconds": time.time() - start,
            "stderr_tail": p.stderr.decode("utf-8", errors="replace")[-2000:]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    r = fuzz(args.checkpoint, args.lines, args.seed)
    print(f"lines in {r['lines_in']}, lines out {r['lines_out']}, exit code {r['rc']}, {r['seconds']:.0f} s")
    if r["rc"] != 0:
        print(r["stderr_tail"], file=sys.stderr)


if __name__ == "__main__":
    main()
