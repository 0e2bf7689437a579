"""Write a synthetic WMT-size parallel corpus built from Multi30k, for measuring the data path at scale.

    python benchmarks/speed/make_corpus.py OUT_DIR [--pairs 4500000] [--src en --tgt de] [--seed 1]

Writes OUT_DIR/{train,val}.{src,tgt}.gz (val: 3,000 pairs, the size of a WMT newstest). Each pair joins randomly
drawn Multi30k pairs until the source reaches a length drawn from a log-normal (mean ~27 words, long tail cut at
250), cutting both sides at the same fraction, and turns some words into variants ("house" -> "housek", "hhouse",
...) so that the vocabulary has a WMT-like long tail of rare types instead of Multi30k's 10k words. Both sides stay
roughly aligned, so BPE, tokenization, length filters and batching all do the work they would on real data; the
corpus is for measuring speed and memory, not for training a translator. The output goes outside the repo.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path

import numpy as np

MULTI30K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"
MEAN_WORDS, SIGMA, MAX_WORDS = 27.0, 0.75, 250
VARIANT_RATE = 0.08  # share of words replaced by one of their variants
N_VARIANTS = 40
LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def read_sentences(path: Path) -> list[list[str]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.split() for line in f]


def variant(word: str, k: int) -> str:
    """The k-th made-up relative of `word`: a letter added at one end or doubled inside, deterministic in k."""
    letter = LETTERS[k % 26]
    if k < 26:
        return word + letter
    return letter + word if k < 33 else word[:1] + word


def perturb(words: list[str], rng: np.random.Generator) -> list[str]:
    hits = np.flatnonzero(rng.random(len(words)) < VARIANT_RATE)
    if len(hits):
        words = list(words)
        for i, k in zip(hits, rng.integers(0, N_VARIANTS, len(hits))):
            words[i] = variant(words[i], int(k))
    return words


def make_pairs(src: list[list[str]], tgt: list[list[str]], n: int, rng: np.random.Generator):
    """Yield `n` (source, target) lines."""
    mu = np.log(MEAN_WORDS) - SIGMA**2 / 2
    chunk = 100_000
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        targets = np.clip(np.rint(rng.lognormal(mu, SIGMA, m)), 1, MAX_WORDS).astype(int)
        draws = iter(rng.integers(0, len(src), m * 8).tolist())
        for want in targets.tolist():
            s_words: list[str] = []
            t_words: list[str] = []
            while len(s_words) < want:
                i = next(draws, None)
                if i is None:
                    i = int(rng.integers(0, len(src)))
                s_words += src[i]
                t_words += tgt[i]
            if len(s_words) > want:  # cut both sides at the same fraction
                keep_t = max(1, round(len(t_words) * want / len(s_words)))
                s_words, t_words = s_words[:want], t_words[:keep_t]
            yield " ".join(perturb(s_words, rng)), " ".join(perturb(t_words, rng))


def write_split(out: Path, split: str, langs: tuple[str, str], pairs) -> int:
    n = 0
    with (
        gzip.open(out / f"{split}.{langs[0]}.gz", "wt", encoding="utf-8", compresslevel=6) as fs,
        gzip.open(out / f"{split}.{langs[1]}.gz", "wt", encoding="utf-8", compresslevel=6) as ft,
    ):
        for s, t in pairs:
            fs.write(s + "\n")
            ft.write(t + "\n")
            n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--pairs", type=int, default=4_500_000)
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--multi30k", type=Path, default=MULTI30K)
    args = ap.parse_args()
    if Path(__file__).resolve().parents[2] in args.out.resolve().parents:
        sys.exit("error: write the corpus outside the repository (data is never committed)")
    args.out.mkdir(parents=True, exist_ok=True)
    src = read_sentences(args.multi30k / f"train.{args.src}.gz")
    tgt = read_sentences(args.multi30k / f"train.{args.tgt}.gz")
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    langs = (args.src, args.tgt)
    n = write_split(args.out, "train", langs, make_pairs(src, tgt, args.pairs, rng))
    write_split(args.out, "val", langs, make_pairs(src, tgt, 3000, rng))
    size = sum(p.stat().st_size for p in args.out.glob("train.*.gz"))
    print(f"{args.out}: {n:,} training pairs, {size / 2**20:,.0f} MiB gzipped, in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
