"""The data pipeline on real Multi30k: loading, BPE training, tokenization, batching efficiency and cost.

    python benchmarks/speed/data_pipeline.py [--dir ../shared/data/multi30k] [--src en --tgt de] [--max-tokens 2500]

Prints the pairs read before filtering, the seconds each stage takes (a fresh tokenizer in a temporary run dir;
datasets' cache makes a second tokenization free), the padding efficiency of the token-bucket sampler next to
the same budget without length grouping, and the time to fetch and collate one epoch of batches.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import datasets
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mt.config import DataConfig, TokenizerConfig  # noqa: E402
from mt.data import read  # noqa: E402
from mt.data.batching import BatchLoader, make_batches  # noqa: E402
from mt.data.corpus import build_vocabs, make_sampler, tokenize  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=str(ROOT.parent / "shared/data/multi30k"))
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--max-tokens", type=int, default=2500)
    args = ap.parse_args()
    datasets.disable_progress_bars()
    logging.basicConfig(level=logging.WARNING)
    cfg = DataConfig(name="multi30k", dir=args.dir, src_lang=args.src, tgt_lang=args.tgt)

    t = time.perf_counter()
    train = read.load_split(cfg, "train")
    n_raw = len(train)
    train = read.drop_empty(train, "train")
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    vocabs = build_vocabs(
        TokenizerConfig(vocab_size=args.vocab_size), read.TextPairs.of_table(train), Path(tempfile.mkdtemp())
    )
    t_bpe = time.perf_counter() - t
    t = time.perf_counter()
    ds = read.filter_lengths(tokenize(train, vocabs), cfg.max_len, cfg.max_ratio, "train")
    t_tok = time.perf_counter() - t

    sampler = make_sampler(read.length_columns(ds), args.max_tokens, seed=1, shuffle=True)
    src = np.array([len(s) + 1 for s in ds["src_ids"]])
    tgt = np.array([len(s) + 1 for s in ds["tgt_ids"]])
    rnd = make_batches(src, tgt, args.max_tokens, np.random.default_rng(1).permutation(len(src)))
    rnd_eff = sum(int(src[b].sum() + tgt[b].sum()) for b in rnd) / sum(
        len(b) * int(src[b].max() + tgt[b].max()) for b in rnd
    )
    t = time.perf_counter()
    n_batches = sum(1 for _ in BatchLoader(ds.select_columns(["src_ids", "tgt_ids"]), sampler))
    t_epoch = time.perf_counter() - t

    print(f"Multi30k {args.src}->{args.tgt} from {args.dir}")
    print(f"  train pairs read (before filtering): {n_raw:,}; after filters: {len(ds):,}")
    print(f"  load {t_load:.1f}s | BPE training ({len(vocabs.src)} types, joint) {t_bpe:.1f}s | tokenize {t_tok:.1f}s")
    print(
        f"  padding efficiency at {args.max_tokens} tokens: {sampler.padding_efficiency():.3f} (bucketed), "
        f"{rnd_eff:.3f} (same budget, random order)"
    )
    print(
        f"  one epoch of batches fetched from Arrow and collated: {n_batches} batches in {t_epoch:.2f}s "
        f"({1000 * t_epoch / n_batches:.1f} ms per batch)"
    )


if __name__ == "__main__":
    main()
