"""What `tokenizer.case_markup=true` costs in length: BPE tokens per test sentence on each side, a joint BPE
trained on the corpus's training split with and without case markup (the vocabulary size `+experiment=auto` picks
for the corpus), side by side, and the marks per sentence.

    python benchmarks/quality/case_markup_length.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

from mt.config import TokenizerConfig
from mt.data.casing import MARKS, mark
from mt.data.tokenizer import Vocabs, train_vocab

CORPORA = [  # directory, source, target, test split, BPE size (the auto rule's tier for the corpus)
    ("iwslt_ted_de_en", "de", "en", "test", 4_000),
    ("multi30k", "en", "de", "test_2016_flickr", 8_000),
    ("multi30k", "en", "fr", "test_2016_flickr", 8_000),
]


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    args = ap.parse_args()
    print("| corpus | BPE | side | tokens a sentence, plain | with case markup | more | marks a sentence |")
    print("|---|---|---|---|---|---|---|")
    for name, src, tgt, split, size in CORPORA:
        d = args.data / name
        train = list(zip(read(d / f"train.{src}.gz"), read(d / f"train.{tgt}.gz")))
        test = {lang: read(d / f"{split}.{lang}.gz") for lang in (src, tgt)}
        lengths = {}
        for case in (False, True):
            cfg = TokenizerConfig(vocab_size=size, case_markup=case)
            vocab = train_vocab(cfg, [(mark(s), mark(t)) for s, t in train] if case else train, (0, 1))
            vocabs = Vocabs(vocab, vocab).pretokenizing("none", "", "", case_markup=case)
            for lang, lines in test.items():
                lengths[lang, case] = sum(len(ids) for ids in vocabs.src.encode_batch(lines)) / len(lines)
        for lang, lines in test.items():
            plain, cased = lengths[lang, False], lengths[lang, True]
            marks = sum(mark(line).count(m) for line in lines for m in MARKS) / len(lines)
            print(f"| {name} {src}->{tgt} | {size:,} | {lang} | {plain:.2f} | {cased:.2f} | "
                  f"{cased / plain - 1:+.0%} | {marks:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
