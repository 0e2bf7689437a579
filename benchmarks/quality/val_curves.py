"""Validation loss against updates, this project's runs beside fairseq's, in one PNG and a table.

    python benchmarks/quality/val_curves.py --ours runs/fsq_replica.s1 --fairseq runs/fairseq.s1 \
        --names "this project, fairseq's recipe, seed 1" "fairseq, seed 1" --out docs/val_curves_fairseq.png

`--names` gives each run its legend entry (the `--ours` runs first, then the `--fairseq` ones); without it a run
is named by its directory.

The two toolkits segment the val set with their own BPE (this project's tokenizer; subword-nmt in fairseq's
run.sh), so their losses per target token are not comparable. Both are turned into the same unit: nats per
reference word, the total NLL over the val targets (</s> included, as both count it) divided by the number of
whitespace-separated words of Multi30k's val.de. For this project a run's `metrics.jsonl` gives `valid_nll` (nats
per target token) at each validation, and its own tokenizer gives the val set's target tokens; for fairseq its
train.out gives `nll_loss` (bits per target token) at each validation (`VALID_EVERY=250` in run.sh), and its
BPE'd val file the tokens.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VAL_DE = ROOT.parent / "shared" / "data" / "multi30k" / "val.de.gz"


def reference_words() -> int:
    with gzip.open(VAL_DE, "rt", encoding="utf-8") as f:
        return sum(len(line.split()) for line in f)


def ours(run: Path) -> list[tuple[int, float]]:
    """(update, total val NLL in nats) of a run: `valid_nll` times its val targets' tokens (</s> included)."""
    sys.path.insert(0, str(ROOT))
    from mt.config import TokenizerConfig
    from mt.data.tokenizer import load_run_vocabs

    vocabs = load_run_vocabs(TokenizerConfig(joint=(run / "tokenizer.json").is_file()), run)
    with gzip.open(VAL_DE, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    tokens = sum(len(ids) + 1 for ids in vocabs.tgt.encode_batch(lines))  # + </s>
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["update"], r["valid_nll"] * tokens) for r in records if r.get("kind") == "valid" and "valid_nll" in r]


def fairseq(work: Path) -> list[tuple[int, float]]:
    """(update, total val NLL in nats) from fairseq's train.out and its BPE'd val targets."""
    tokens = sum(len(line.split()) + 1 for line in (work / "data" / "val.bpe.de").read_text().splitlines())
    out = []
    for line in (work / "train.out").read_text().splitlines():
        if "valid on 'valid' subset" not in line:
            continue
        nll = float(re.search(r"\| nll_loss ([\d.]+)", line).group(1)) * math.log(2)  # bits -> nats per token
        out.append((int(re.search(r"\| num_updates (\d+)", line).group(1)), nll * tokens))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", type=Path, nargs="*", default=[], help="this project's run dirs")
    ap.add_argument("--fairseq", type=Path, nargs="*", default=[], help="run.sh's WORK dirs")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--names", nargs="*", default=[], help="a legend entry per run: the --ours runs, then --fairseq")
    ap.add_argument("--title", default="Validation loss: this project's fairseq replica beside fairseq")
    args = ap.parse_args()
    runs = [*args.ours, *args.fairseq]
    if args.names and len(args.names) != len(runs):
        print(f"error: --names gives {len(args.names)} names for {len(runs)} runs: one a run, --ours first",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    default = {**{run: f"mt: {run.name}" for run in args.ours}, **{run: f"fairseq: {run.name}" for run in args.fairseq}}
    names = dict(zip(runs, args.names)) if args.names else default
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    words = reference_words()
    fig, ax = plt.subplots(figsize=(8, 5))
    table: dict[str, dict[int, float]] = {}
    for kind, paths, read, style in (("mt", args.ours, ours, "-"), ("fairseq", args.fairseq, fairseq, "--")):
        for path in paths:
            points = read(path)
            table[names[path]] = {u: n / words for u, n in points}
            if not points:
                sys.exit(f"error: {path}: no validation records; see the module docstring")
            ax.plot([u for u, _ in points], [n / words for _, n in points], style, label=names[path])
            last = points[-1]
            print(f"{kind:8s} {path}: {len(points)} validations, last at update {last[0]}: "
                  f"{last[1] / words:.4f} nats per reference word")  # fmt: skip
    updates = sorted({u for points in table.values() for u in points})
    print("| update | " + " | ".join(table) + " |")
    print("|---|" + "---|" * len(table))
    for u in updates:
        print(f"| {u:,} | " + " | ".join(f"{t[u]:.3f}" if u in t else "" for t in table.values()) + " |")
    ax.set_xlabel("updates")
    ax.set_ylabel("val NLL, nats per reference word (Multi30k val.de)")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
