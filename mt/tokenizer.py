"""Subword vocabularies: BPE trained with Hugging Face `tokenizers`, saved as `tokenizer.json` in the run dir.

Metaspace turns spaces into a visible marker (as SentencePiece does) and its decoder turns them back, and the
punctuation split only cuts between characters, so `decode(encode(s)) == s` for any NFC text whose characters
were seen in training. Special tokens take fixed ids: <pad>=0, <unk>=1, <s>=2, </s>=3.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from mt.config import TokenizerConfig

log = logging.getLogger(__name__)

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
PAD, UNK, BOS, EOS = 0, 1, 2, 3


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used; the message names it and what to do."""


class Vocab:
    """One BPE tokenizer: text <-> ids without special tokens (the model adds <s> and </s> itself)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        for i, tok in enumerate(SPECIALS):
            if tokenizer.token_to_id(tok) != i:
                raise TokenizerError(f"tokenizer has {tok} at id {tokenizer.token_to_id(tok)}, expected {i}")

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def tokens(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def decode_batch(self, batch: list[list[int]]) -> list[str]:
        return self.tokenizer.decode_batch(batch, skip_special_tokens=True)

    def digest(self) -> str:
        return hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str | Path) -> Vocab:
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as e:
            raise TokenizerError(f"{path}: not a usable tokenizer.json ({e}); delete it to retrain") from None


def with_bpe_dropout(vocab: Vocab, p: float) -> Tokenizer:
    """A copy of `vocab`'s tokenizer that skips each BPE merge with probability `p` (for training data only)."""
    tok = Tokenizer.from_str(vocab.tokenizer.to_str())
    tok.model.dropout = p
    return tok


@dataclass
class Vocabs:
    """Source and target vocabularies; one shared object when the vocabulary is joint."""

    src: Vocab
    tgt: Vocab

    @property
    def joint(self) -> bool:
        return self.src is self.tgt

    def files(self, dir: Path) -> dict[str, Path]:
        if self.joint:
            return {"joint": dir / "tokenizer.json"}
        return {"src": dir / "tokenizer.src.json", "tgt": dir / "tokenizer.tgt.json"}

    def save(self, dir: Path) -> None:
        dir.mkdir(parents=True, exist_ok=True)
        for side, path in self.files(dir).items():
            (self.src if side in ("joint", "src") else self.tgt).tokenizer.save(str(path))

    def to_json(self) -> dict:
        """The tokenizers as JSON strings, stored inside checkpoints so a checkpoint is self-contained."""
        return {"src": self.src.tokenizer.to_str(), "tgt": None if self.joint else self.tgt.tokenizer.to_str()}

    @classmethod
    def from_json(cls, d: dict) -> Vocabs:
        src = Vocab(Tokenizer.from_str(d["src"]))
        return cls(src, src if d["tgt"] is None else Vocab(Tokenizer.from_str(d["tgt"])))


def new_tokenizer(normalization: str) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = getattr(normalizers, normalization)()
    # Spaces become "▁" (kept on the following word); punctuation is split off so that "dog." and "dog" share
    # a subword, which matters on small corpora. Both steps are undone exactly by the Metaspace decoder.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    tok.decoder = decoders.Metaspace()
    return tok


def _texts(ds: datasets.Dataset, columns: tuple[str, ...]) -> Iterator[list[str]]:
    for batch in ds.iter(batch_size=2000):
        for c in columns:
            yield batch[c]


def train_vocab(cfg: TokenizerConfig, ds: datasets.Dataset, columns: tuple[str, ...]) -> Vocab:
    tok = new_tokenizer(cfg.normalization)
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIALS),
        show_progress=False,
    )
    tok.train_from_iterator(_texts(ds, columns), trainer=trainer, length=len(ds) * len(columns))
    return Vocab(tok)


def _meta_key(cfg: TokenizerConfig, train_fingerprint: str) -> str:
    return hashlib.sha256(json.dumps([asdict(cfg), train_fingerprint], sort_keys=True).encode()).hexdigest()[:16]


def load_run_vocabs(cfg: TokenizerConfig, run_dir: Path) -> Vocabs:
    if cfg.joint:
        vocab = Vocab.from_file(run_dir / "tokenizer.json")
        return Vocabs(vocab, vocab)
    return Vocabs(Vocab.from_file(run_dir / "tokenizer.src.json"), Vocab.from_file(run_dir / "tokenizer.tgt.json"))


def build_vocabs(cfg: TokenizerConfig, train: datasets.Dataset, run_dir: Path, resuming: bool = False) -> Vocabs:
    """Load `cfg.path`, or reuse the run dir's tokenizer if data and config are unchanged, or train a new one.
    `resuming`: the run dir holds a run to continue, whose tokenizer must not be replaced by another."""
    if cfg.path:
        if not Path(cfg.path).is_file():
            raise TokenizerError(f"tokenizer.path={cfg.path}: no such file; train one by unsetting tokenizer.path")
        vocab = Vocab.from_file(cfg.path)
        log.info("tokenizer: loaded %s (%d types)", cfg.path, len(vocab))
        return Vocabs(vocab, vocab)
    key = _meta_key(cfg, train._fingerprint)
    meta = run_dir / "tokenizer.meta.json"
    if meta.is_file() and json.loads(meta.read_text()).get("key") == key:
        log.info("tokenizer: reusing %s (data and tokenizer config unchanged)", run_dir)
        return load_run_vocabs(cfg, run_dir)
    if resuming and meta.is_file():  # the run's tokenizer stays: its checkpoint was trained with those ids
        saved = json.loads(meta.read_text()).get("config", {})
        changed = sorted(k for k, v in asdict(cfg).items() if saved.get(k) != v)
        if changed:
            raise TokenizerError(
                f"{meta}: the run in {run_dir} was trained with tokenizer.{changed[0]}={saved.get(changed[0])}; "
                "use a new run_dir, or train.resume=never to start over in this one"
            )
        log.warning("tokenizer: the corpus changed or moved since %s was trained; resuming keeps it", run_dir)
        return load_run_vocabs(cfg, run_dir)
    if cfg.joint:
        vocab = train_vocab(cfg, train, ("src", "tgt"))
        vocabs = Vocabs(vocab, vocab)
    else:
        vocabs = Vocabs(train_vocab(cfg, train, ("src",)), train_vocab(cfg, train, ("tgt",)))
    vocabs.save(run_dir)
    meta.write_text(json.dumps({"key": key, "config": asdict(cfg)}, indent=2))
    log.info(
        "tokenizer: trained BPE, %d source / %d target types, saved in %s", len(vocabs.src), len(vocabs.tgt), run_dir
    )
    return vocabs


def tokenize(ds: datasets.Dataset, vocabs: Vocabs) -> datasets.Dataset:
    """Add `src_ids`, `tgt_ids` (and their lengths) columns; cached by datasets, keyed on corpus and tokenizer."""

    def encode(batch: dict) -> dict:
        src, tgt = vocabs.src.encode_batch(batch["src"]), vocabs.tgt.encode_batch(batch["tgt"])
        # Lengths as their own columns: the batch sampler reads them without loading every id into memory.
        return {"src_ids": src, "tgt_ids": tgt, "src_len": [len(x) for x in src], "tgt_len": [len(x) for x in tgt]}

    # The cache key covers the corpus, both tokenizers and this function's code (a changed `encode` must not
    # reuse columns cached by an older version).
    code = hashlib.sha256(inspect.getsource(encode).encode()).hexdigest()
    key = f"{ds._fingerprint}:{vocabs.src.digest()}:{vocabs.tgt.digest()}:{code}"
    fingerprint = hashlib.sha256(key.encode()).hexdigest()
    return ds.map(encode, batched=True, batch_size=2000, new_fingerprint=fingerprint[:32], desc="tokenize")
