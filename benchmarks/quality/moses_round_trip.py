"""How much text comes back unchanged from `tokenizer.pretokenize=moses`: raw -> tokenized -> detokenized, line by
line, on every corpus in ../shared/data (every split, both sides), with this project's joiner marks (what new Moses
models do) beside plain Moses detokenization (what models trained before the joiners get). A line counts as
restored when it comes back equal up to runs of whitespace, which is what a model that copies its input can give.

    python benchmarks/quality/moses_round_trip.py [--data ../shared/data] [--split test] [--examples 3]
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

from mt.data.pretokenize import moses


def restored(lines: list[str], lang: str, joiner: str | None) -> tuple[int, list[tuple[str, str]]]:
    m = moses(lang, joiner) if joiner else moses(lang, None)
    good, bad = 0, []
    for line in lines:
        back = m.detokenize(m.tokenize(line))
        if back.split() == line.split():
            good += 1
        else:
            bad.append((line, back))
    return good, bad


def main() -> None:
    from mt.data.pretokenize import JOINER

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2].parent / "shared" / "data"))
    ap.add_argument("--split", default="", help="only files of this split (e.g. test); default: every split")
    ap.add_argument("--examples", type=int, default=0, help="print this many lines that do not come back, per file")
    args = ap.parse_args()
    print(f"{'file':<44} {'lines':>7} {'joiners':>9} {'Moses detok':>12}")
    for path in sorted(Path(args.data).glob(f"*/{args.split}*.gz")):
        lang = path.name.split(".")[-2]
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
        new, misses = restored(lines, lang, JOINER)
        old, _ = restored(lines, lang, None)
        name = f"{path.parent.name}/{path.name}"
        print(f"{name:<44} {len(lines):>7} {new / len(lines):>9.2%} {old / len(lines):>12.2%}", flush=True)
        for line, back in misses[: args.examples]:
            print(f"    {line!r}\n -> {back!r}")


if __name__ == "__main__":
    main()
