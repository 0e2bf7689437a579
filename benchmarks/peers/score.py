"""Score a peer's detokenized test output exactly as this project's reports do, and print its table row.

    python benchmarks/peers/score.py --hyp OUT.de --out WORK/ --toolkit joeynmt --version 2.3.0 \
        [--split test_2016_flickr --src en --tgt de] [--meta params=... epochs=... train_tok_s=... sent_s=...]

Sources and references are read from Multi30k (`MULTI30K`, default ../shared/data/multi30k), never from the
peer's own preprocessed files, so every toolkit is scored against the same untouched references. Writes
`{split}.report.json/.md` (this project's report: cased and lowercased BLEU, chrF, signatures) into --out, with
the --meta fields added, and prints the row of the issue-34 table.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mt.evaluate.report import write_report  # noqa: E402

COLUMNS = ("toolkit", "version", "params", "epochs", "train_tok_s", "bleu_lowercase", "bleu", "chrf", "sent_s")


def read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hyp", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--toolkit", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--split", default="test_2016_flickr")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--meta", nargs="*", default=[], help="key=value fields added to the report")
    args = ap.parse_args()
    data = Path(os.environ.get("MULTI30K", ROOT.parent / "shared" / "data" / "multi30k"))
    for path in (args.hyp, data / f"{args.split}.{args.src}.gz", data / f"{args.split}.{args.tgt}.gz"):
        if not path.is_file():
            print(f"error: {path} not found (the peer's output, or Multi30k: set MULTI30K=/path/to/multi30k)")
            return 2
    srcs = read_lines(data / f"{args.split}.{args.src}.gz")
    refs = read_lines(data / f"{args.split}.{args.tgt}.gz")
    hyps = read_lines(args.hyp)
    if len(hyps) != len(refs):
        print(f"error: {args.hyp} has {len(hyps)} lines, the references {len(refs)}: the peer's output is incomplete")
        return 2
    extra = {"toolkit": args.toolkit, "version": args.version}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"error: --meta {item!r} is not key=value")
            return 2
        extra[key] = value
    report = write_report(args.out, args.split, srcs, hyps, refs, extra)
    print("| " + " | ".join(COLUMNS) + " |")
    print("| " + " | ".join(str(report.get(c, "")) for c in COLUMNS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
