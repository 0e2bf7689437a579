"""Length-bucketed batches under a token budget, and collation into padded tensors.

A batch's cost is its padded size, `n_sentences * longest`, on the source and on the target side; the sampler
packs sentences of similar length so that little of that budget is padding. Two ways to form them
(`data.batching`), both from the seed alone, so that an epoch can be replayed or resumed mid-way exactly:
- "pools" (default): each epoch, sentences are shuffled, sorted by target then source length within large pools,
  cut into batches, and the batch order is shuffled, all from (seed, epoch): batches differ between epochs.
- "fixed", fairseq's: once per run, sentences are shuffled by the seed and stable-sorted by source length (ties
  by target length), cut greedily (`fairseq_batches`: sentences x max(source, target) length within the budget, a
  full batch's size a multiple of 8); each epoch only the order of these batches is shuffled (seed, epoch).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Sampler

from mt.config import BATCH_FORMATIONS
from mt.data.tokenizer import PAD, PAPER_FRAMING, Framing


def make_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, order: np.ndarray) -> list[np.ndarray]:
    """Cut `order` (indices, already sorted by length) greedily into batches whose padded size fits `max_tokens`.

    Greedy: a batch takes sentences in order while `n_sentences * longest` (source or target) stays within the
    budget. Each cut is found with numpy over a window of the sentences that follow (a running maximum of the
    lengths times the running count), the window growing until it holds the cut. A sentence that alone exceeds the
    budget gets a batch of its own (the caller filters those out if it wants).
    """
    longest = np.maximum(src_lens[order], tgt_lens[order])
    batches, start, window, n = [], 0, 64, len(order)
    while start < n:
        stop = min(n, start + window)
        size = np.maximum.accumulate(longest[start:stop]) * np.arange(1, stop - start + 1)
        over = np.flatnonzero(size[1:] > max_tokens)  # the first sentence always fits: size[0] is never a cut
        if len(over) == 0 and stop < n:
            window *= 2  # the batch may go on past the window
            continue
        end = start + 1 + int(over[0]) if len(over) else n
        batches.append(order[start:end])
        window = max(64, 2 * (end - start))
        start = end
    return batches


def fairseq_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, order: np.ndarray,
                    multiple: int = 8) -> list[np.ndarray]:  # fmt: skip
    """fairseq's `batch_by_size` over `order`: sentences are taken in order while (sentences + 1) x the longest
    max(source, target) length fits `max_tokens`; a full batch keeps the largest multiple of `multiple` sentences
    it holds (all of them when fewer), and the rest begin the next batch."""
    longest = np.maximum(src_lens, tgt_lens)[order].tolist()
    batches, batch, lens, sample_len = [], [], [], 0
    for idx, length in zip(order.tolist(), longest):
        lens.append(length)
        sample_len = max(sample_len, length)
        if batch and (len(batch) + 1) * sample_len > max_tokens:
            keep = max(multiple * (len(batch) // multiple), len(batch) % multiple)
            batches.append(np.array(batch[:keep], dtype=np.int64))
            batch, lens = batch[keep:], lens[keep:]
            sample_len = max(lens)  # (the remainder and this sentence)
        batch.append(idx)
    if batch:
        batches.append(np.array(batch, dtype=np.int64))
    return batches


def fairseq_order(src_lens: np.ndarray, tgt_lens: np.ndarray, seed: int) -> np.ndarray:
    """fairseq's `ordered_indices`: a shuffle by the seed, then stable sorts by target and by source length, so that
    source length is the first key, target length the second, and ties keep the shuffled order."""
    order = np.random.default_rng([seed, 0x5EED]).permutation(len(src_lens))
    order = order[np.argsort(tgt_lens[order], kind="stable")]
    return order[np.argsort(src_lens[order], kind="stable")]


class TokenBucketSampler(Sampler[list[int]]):
    """Yields lists of example indices; each list is one batch of at most `max_tokens` padded tokens.

    Lengths are the tensor lengths the model sees (source with </s>, target with <s> or </s>).
    With `num_replicas > 1`, each rank gets every `num_replicas`-th batch of the same epoch order; the batch list
    is wrapped around to a multiple of `num_replicas` so that every rank runs the same number of steps.
    """

    def __init__(
        self,
        src_lens: Sequence[int],
        tgt_lens: Sequence[int],
        max_tokens: int,
        seed: int = 1,
        shuffle: bool = True,
        pool_size: int = 1 << 17,
        num_replicas: int = 1,
        rank: int = 0,
        formation: str = "pools",
    ):
        self.src_lens = np.asarray(src_lens, dtype=np.int64)
        self.tgt_lens = np.asarray(tgt_lens, dtype=np.int64)
        if len(self.src_lens) != len(self.tgt_lens) or len(self.src_lens) == 0:
            raise ValueError("need one source and one target length per example, and at least one example")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.max_tokens, self.seed, self.shuffle, self.pool_size = max_tokens, seed, shuffle, pool_size
        if formation not in BATCH_FORMATIONS:
            raise ValueError(f"batch formation {formation!r} is not one of {', '.join(BATCH_FORMATIONS)}")
        self.num_replicas, self.rank, self.formation = num_replicas, rank, formation
        self._fixed: list[np.ndarray] | None = None  # formation "fixed": the run's batches, in their first order
        self.epoch, self.position = 0, 0  # position: batches of this epoch already handed out on this rank
        self._batches: list[np.ndarray] | None = None
        # Several corpora mixed by weight: mix(seed, epoch) -> the rows (with repeats) an epoch trains on.
        self.mix: Callable[[int, int], np.ndarray] | None = None

    def oversized(self) -> int:
        """How many examples alone exceed the budget (each gets a batch of its own)."""
        return int((np.maximum(self.src_lens, self.tgt_lens) > self.max_tokens).sum())

    def set_lengths(self, src_lens: Sequence[int], tgt_lens: Sequence[int]) -> None:
        """New lengths for the same examples (a re-segmented corpus); the current epoch's batches are recut."""
        if len(src_lens) != len(self.src_lens) or len(tgt_lens) != len(self.tgt_lens):
            raise ValueError("set_lengths needs one source and one target length per example, as before")
        self.src_lens = np.asarray(src_lens, dtype=np.int64)
        self.tgt_lens = np.asarray(tgt_lens, dtype=np.int64)
        self._batches = self._fixed = None

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position, self._batches = epoch, 0, None

    def _epoch_batches(self) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, self.epoch])
        if self.formation == "fixed":
            if self.mix is not None:
                raise ValueError("fixed batches need the same rows every epoch, not a mix of corpora")
            if self._fixed is None:
                order = fairseq_order(self.src_lens, self.tgt_lens, self.seed)
                self._fixed = fairseq_batches(self.src_lens, self.tgt_lens, self.max_tokens, order)
            order = rng.permutation(len(self._fixed)) if self.shuffle else range(len(self._fixed))
            return self._for_this_rank([self._fixed[i] for i in order])
        rows = self.mix(self.seed, self.epoch) if self.mix is not None else None
        n = len(self.src_lens) if rows is None else len(rows)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        if rows is not None:
            order = rows[order]
        batches = []
        # Sort key: target length, then source length, in one integer (16 bits when it fits: numpy radix-sorts those).
        key = self.tgt_lens * (int(self.src_lens.max()) + 1) + self.src_lens
        key = key.astype(np.uint16) if key.max() < 1 << 16 else key
        for start in range(0, n, self.pool_size):
            pool = order[start : start + self.pool_size]
            # A stable sort: ties keep the shuffled order, so batch contents vary by epoch.
            pool = pool[np.argsort(key[pool], kind="stable")]
            batches += make_batches(self.src_lens, self.tgt_lens, self.max_tokens, pool)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return self._for_this_rank(batches)

    def _for_this_rank(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """Every `num_replicas`-th batch from `rank`, the list wrapped around to a multiple of `num_replicas`."""
        if self.num_replicas > 1:
            per_rank = -(-len(batches) // self.num_replicas)
            batches = [batches[i % len(batches)] for i in range(per_rank * self.num_replicas)]
            batches = batches[self.rank :: self.num_replicas]
        return batches

    def batches(self) -> list[np.ndarray]:
        if self._batches is None:
            self._batches = self._epoch_batches()
        return self._batches

    def __len__(self) -> int:
        return len(self.batches())

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        while self.position < len(batches):
            batch = batches[self.position]
            self.position += 1
            yield batch.tolist()
        self.set_epoch(self.epoch + 1)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.seed = state["seed"]
        self.epoch, self._batches = state["epoch"], None
        self.position = state["position"]

    def padding_efficiency(self) -> float:
        """Share of real (non-pad) tokens in this epoch's padded batches, source and target sides together."""
        real = padded = 0
        for b in self.batches():
            s, t = self.src_lens[b], self.tgt_lens[b]
            real += int(s.sum() + t.sum())
            padded += len(b) * int(s.max() + t.max())
        return real / padded


@dataclass
class Batch:
    """A padded batch. `src` ends with </s>; the decoder reads `tgt_in` = <s> y and predicts `tgt_out` = y </s>."""

    src: torch.Tensor  # (B, S) token ids
    tgt_in: torch.Tensor  # (B, T)
    tgt_out: torch.Tensor  # (B, T)
    src_pad_mask: torch.Tensor  # (B, S) True at padding
    n_src_tokens: int
    n_tgt_tokens: int  # non-pad target tokens: the loss normaliser
    ids: list[int]  # dataset indices, to restore the input order after length-sorted decoding

    def pin_memory(self) -> Batch:
        """Page-locked copies, so that `to(cuda)` is an asynchronous copy."""
        pin = lambda t: t.pin_memory()  # noqa: E731
        return Batch(pin(self.src), pin(self.tgt_in), pin(self.tgt_out), pin(self.src_pad_mask), self.n_src_tokens,
                     self.n_tgt_tokens, self.ids)  # fmt: skip

    def to(self, device: torch.device) -> Batch:
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return Batch(
            move(self.src),
            move(self.tgt_in),
            move(self.tgt_out),
            move(self.src_pad_mask),
            self.n_src_tokens,
            self.n_tgt_tokens,
            self.ids,
        )


def pad(seqs: list[list[int]], value: int = PAD) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def collate(src_ids: list[list[int]], tgt_ids: list[list[int]] | None, ids: list[int],
            framing: Framing = PAPER_FRAMING) -> Batch:  # fmt: skip
    """Build a Batch from token ids without specials; `tgt_ids=None` for decoding-only batches. `framing`: the
    model's special ids and language tokens (this project's by default)."""
    sp, src_lead, tgt_lead = framing.specials, list(framing.src_lead), list(framing.tgt_lead)
    src = pad([src_lead + s + [sp.eos] for s in src_ids], sp.pad)
    src_pad_mask = src.eq(sp.pad)
    if tgt_ids is None:
        empty = torch.zeros(len(src_ids), 0, dtype=torch.long)
        return Batch(src, empty, empty, src_pad_mask, int((~src_pad_mask).sum()), 0, ids)
    tgt_in = pad([[sp.start] + tgt_lead + t for t in tgt_ids], sp.pad)
    tgt_out = pad([tgt_lead + t + [sp.eos] for t in tgt_ids], sp.pad)
    n_tgt = int(tgt_out.ne(sp.pad).sum())
    return Batch(src, tgt_in, tgt_out, src_pad_mask, int((~src_pad_mask).sum()), n_tgt, ids)


class BatchLoader:
    """Iterates Batches of a tokenized dataset in the order a TokenBucketSampler gives.

    `dataset[indices]` must return {"src_ids": [...], "tgt_ids": [...]}: a `datasets.Dataset` does, reading only
    those rows from its memory-mapped Arrow file. With `prefetch` > 0 a background thread collates that many batches
    ahead (while the GPU computes), optionally into pinned memory; the sampler's position still counts only the
    batches handed out, so a checkpoint taken between two of them resumes exactly.
    """

    def __init__(self, dataset, sampler: TokenBucketSampler, prefetch: int = 0, pin_memory: bool = False,
                 framing: Framing = PAPER_FRAMING):  # fmt: skip
        self.dataset, self.sampler, self.prefetch, self.pin_memory = dataset, sampler, prefetch, pin_memory
        self.framing = framing

    def __len__(self) -> int:
        return len(self.sampler)

    def _collate(self, idx: list[int]) -> Batch:
        rows = self.dataset[idx]
        batch = collate(rows["src_ids"], rows["tgt_ids"], idx, self.framing)
        return batch.pin_memory() if self.pin_memory else batch

    def __iter__(self) -> Iterator[Batch]:
        if not self.prefetch:
            for idx in self.sampler:
                yield self._collate(idx)
            return
        yield from self._prefetched()

    def _prefetched(self) -> Iterator[Batch]:
        sampler = self.sampler
        epoch, start, batches = sampler.epoch, sampler.position, sampler.batches()
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def work() -> None:
            try:
                for i in range(start, len(batches)):
                    if stop.is_set():
                        return
                    ready.put(self._collate(batches[i].tolist()))
            except BaseException as e:  # handed to the consumer, which raises it
                ready.put(e)

        worker = threading.Thread(target=work, name="batch-prefetch", daemon=True)
        worker.start()
        try:
            for i in range(start, len(batches)):
                item = ready.get()
                if isinstance(item, BaseException):
                    raise item
                sampler.position = i + 1
                yield item
            sampler.set_epoch(epoch + 1)
        finally:  # the consumer stopped (or finished): let the worker end
            stop.set()
            while worker.is_alive():
                with contextlib.suppress(queue.Empty):
                    ready.get_nowait()
                worker.join(timeout=0.01)
