"""The training run's corpus: splits read, BPE trained or reused, tokenized (cached) and filtered, then cut into
token-budget batches; optionally re-segmented every epoch with BPE-dropout."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import torch.distributed as dist

from mt import checkpoint, data
from mt.batching import BatchLoader, TokenBucketSampler
from mt.config import Config, ConfigError
from mt.tokenizer import Vocabs, build_vocabs, tokenize, tokenize_pairs, with_bpe_dropout

log = logging.getLogger(__name__)


@dataclass
class Corpus:
    vocabs: Vocabs
    train: datasets.Dataset  # ids and lengths of the pairs kept by the filters
    valid: datasets.Dataset  # tokenized; `src`/`tgt` raw for BLEU
    train_text: data.TextPairs  # the training pairs as text (read again only for BPE-dropout)
    train_rows: np.ndarray  # which of them `train` kept
    train_lengths: tuple[np.ndarray, np.ndarray]  # `train`'s source and target lengths (no </s>, <s>)


def prepare_data(cfg: Config, run_dir: Path, max_positions: int) -> Corpus:
    """Train (or reuse) the BPE, tokenize the training pairs into the cache (or map the cached table), filter them
    by length; load and tokenize the validation split."""
    dc = cfg.data
    log.info("data: %s", data.describe(dc))
    text = data.TextPairs.of_split(dc, dc.train_split)
    resuming = checkpoint.resume_path(cfg.train.resume, run_dir) is not None
    vocabs = build_vocabs(cfg.tokenizer, text, run_dir, resuming, data.cache_root(dc))
    max_len = min(dc.max_len, max_positions - 1)  # -1: room for </s> or <s>
    tokens = tokenize_pairs(text, vocabs, data.cache_root(dc))
    src_len, tgt_len = data.length_columns(tokens)
    rows = data.length_filter(src_len, tgt_len, max_len, dc.max_ratio, text.where)
    valid = data.drop_empty(data.load_split(dc, dc.valid_split), f"{dc.name}/{dc.valid_split}")
    valid = truncate(tokenize(valid, vocabs), max_len, dc.valid_split)
    return Corpus(vocabs, data.select_rows(tokens, rows), valid, text, rows, (src_len[rows], tgt_len[rows]))


def truncate(ds: datasets.Dataset, max_len: int, name: str) -> datasets.Dataset:
    """Cut pairs longer than the model's positions (validation keeps every pair; training filters them out)."""
    too_long = ds.filter(
        lambda b: [max(len(s), len(t)) > max_len for s, t in zip(b["src_ids"], b["tgt_ids"])], batched=True
    )
    if not len(too_long):
        return ds
    log.warning("%s: %d pairs longer than %d tokens are truncated for validation", name, len(too_long), max_len)
    return ds.map(
        lambda b: {
            **{k: [x[:max_len] for x in b[k]] for k in ("src_ids", "tgt_ids")},
            **{k: [min(n, max_len) for n in b[k]] for k in ("src_len", "tgt_len")},
        },
        batched=True,
    )


def make_sampler(
    lengths: tuple[np.ndarray, np.ndarray], max_tokens: int, seed: int, shuffle: bool, world: int = 1, rank: int = 0
) -> TokenBucketSampler:
    """A sampler over pairs of these (source, target) token lengths, counted without specials."""
    src_lens = lengths[0].astype(np.int64) + 1  # + </s>
    tgt_lens = lengths[1].astype(np.int64) + 1  # + <s> (input) or </s> (output)
    return TokenBucketSampler(src_lens, tgt_lens, max_tokens, seed, shuffle, num_replicas=world, rank=rank)


def training_batches(corpus: Corpus, cfg: Config, world: int, rank: int, cuda: bool = False):
    """The sampler (this rank's shard of each epoch), the loader that collates its batches (on CUDA two batches
    ahead, in pinned memory), and the BPE-dropout segments the loader reads from (None without
    `train.bpe_dropout`)."""
    tc = cfg.train
    sampler = make_sampler(corpus.train_lengths, tc.max_tokens, tc.seed, True, world, rank)
    if n := sampler.oversized():
        longest = int(max(sampler.src_lens.max(), sampler.tgt_lens.max()))
        raise ConfigError(
            f"train.max_tokens={tc.max_tokens} is below the longest training pair ({longest} tokens, {n} pairs "
            "over it); raise train.max_tokens or lower data.max_len"
        )
    ahead = dict(prefetch=2, pin_memory=True) if cuda else {}
    if not tc.bpe_dropout:
        return sampler, BatchLoader(corpus.train.select_columns(["src_ids", "tgt_ids"]), sampler, **ahead), None
    if len(corpus.train) > BPE_DROPOUT_MAX_PAIRS:
        raise ConfigError(
            f"train.bpe_dropout={tc.bpe_dropout} re-segments every training pair in memory each epoch and sends "
            f"them to every rank, which holds up to {BPE_DROPOUT_MAX_PAIRS:,} pairs; this corpus has "
            f"{len(corpus.train):,}: set train.bpe_dropout=0"
        )
    max_len = min(cfg.data.max_len, cfg.model.max_positions - 1)
    segments = BPEDropoutSegments(corpus, tc.bpe_dropout, max_len, world, rank)
    return sampler, BatchLoader(segments, sampler, **ahead), segments


# BPE-dropout keeps the training text and this epoch's ids as Python lists (~1 KB a pair with both sides).
BPE_DROPOUT_MAX_PAIRS = 500_000


class BPEDropoutSegments:
    """The training pairs segmented afresh for every epoch with BPE-dropout (Provilkov et al., 2020).

    Each BPE merge is skipped with probability p, so a word reaches the model in several segmentations. Indexing
    it like a `datasets.Dataset` (`segments[indices]`) gives this epoch's ids, so a BatchLoader reads from it.
    A segmentation longer than `max_len` falls back to the deterministic one. `tokenizers` draws from an RNG that
    cannot be seeded: a resumed run sees other segmentations than an uninterrupted one would, and under DDP rank 0
    segments and broadcasts so that every rank cuts the same batches.
    """

    def __init__(self, corpus: Corpus, p: float, max_len: int, world: int, rank: int):
        pairs = list(corpus.train_text)
        kept = [pairs[i] for i in corpus.train_rows]
        self.texts = {"src_ids": [s for s, _ in kept], "tgt_ids": [t for _, t in kept]}
        ids = corpus.train.select_columns(["src_ids", "tgt_ids"])[:]
        self.fallback = {"src_ids": ids["src_ids"], "tgt_ids": ids["tgt_ids"]}
        self.ids = dict(self.fallback)
        vocabs = corpus.vocabs
        src = with_bpe_dropout(vocabs.src, p)
        self.tokenizers = {"src_ids": src, "tgt_ids": src if vocabs.joint else with_bpe_dropout(vocabs.tgt, p)}
        self.max_len, self.world, self.rank = max_len, world, rank

    def resegment(self) -> tuple[list[int], list[int]]:
        """Draw this epoch's segmentation; returns the source and target lengths the sampler batches by."""
        if self.rank == 0:
            for side, tok in self.tokenizers.items():
                drawn = (e.ids for e in tok.encode_batch(self.texts[side], add_special_tokens=False))
                self.ids[side] = [d if len(d) <= self.max_len else f for d, f in zip(drawn, self.fallback[side])]
        if self.world > 1:
            shared = [self.ids]
            dist.broadcast_object_list(shared, src=0)
            self.ids = shared[0]
        return [len(x) + 1 for x in self.ids["src_ids"]], [len(x) + 1 for x in self.ids["tgt_ids"]]  # + </s>, <s>

    def __getitem__(self, indices: list[int]) -> dict:
        return {side: [ids[i] for i in indices] for side, ids in self.ids.items()}
