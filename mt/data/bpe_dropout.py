"""BPE-dropout's training pairs (Provilkov et al., 2020): the corpus segmented afresh every epoch."""

from __future__ import annotations

import torch.distributed as dist

from mt.data.tokenizer import Vocabs, with_bpe_dropout


class BPEDropoutSegments:
    """The training pairs segmented afresh for every epoch with BPE-dropout (Provilkov et al., 2020).

    Each BPE merge is skipped with probability p, so a word reaches the model in several segmentations. Indexing
    it like a `datasets.Dataset` (`segments[indices]`) gives this epoch's ids, so a BatchLoader reads from it.
    A segmentation longer than `max_len` falls back to the deterministic one. `tokenizers` draws from an RNG that
    cannot be seeded: a resumed run sees other segmentations than an uninterrupted one would, and under DDP rank 0
    segments and broadcasts so that every rank cuts the same batches.
    """

    def __init__(self, kept: list[tuple[str, str]], train, vocabs: Vocabs, p: float, max_len: int, world: int,
                 rank: int):  # fmt: skip
        """`kept`: the training pairs that passed the filters, as text; `train`: their tokenized table."""
        # (the texts as the BPE sees them: Moses-tokenized with tokenizer.pretokenize)
        self.texts = {"src_ids": vocabs.src.pretokenized([s for s, _ in kept]),
                      "tgt_ids": vocabs.tgt.pretokenized([t for _, t in kept])}  # fmt: skip
        ids = train.select_columns(["src_ids", "tgt_ids"])[:]
        self.fallback = {"src_ids": ids["src_ids"], "tgt_ids": ids["tgt_ids"]}
        self.ids = dict(self.fallback)
        src = with_bpe_dropout(vocabs.src, p)
        self.tokenizers = {"src_ids": src, "tgt_ids": src if vocabs.joint else with_bpe_dropout(vocabs.tgt, p)}
        self.max_len, self.world, self.rank = max_len, world, rank

    @classmethod
    def of(cls, corpus, p: float, max_len: int, world: int, rank: int) -> BPEDropoutSegments:
        """For a run's corpus (mt.data.corpus.Corpus: its training text, the rows the filters kept, their table and
        vocabularies)."""
        pairs = list(corpus.train_text)
        kept = [pairs[i] for i in corpus.train_rows]
        return cls(kept, corpus.train, corpus.vocabs, p, max_len, world, rank)

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
