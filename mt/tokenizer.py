"""Subword vocabularies: BPE trained with Hugging Face `tokenizers`, saved as `tokenizer.json` in the run dir.

Metaspace turns spaces into a visible marker (as SentencePiece does) and its decoder turns them back, and the
punctuation split only cuts between characters, so `decode(encode(s)) == s` for any NFC text whose characters
were seen in training. Special tokens take fixed ids: <pad>=0, <unk>=1, <s>=2, </s>=3.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import logging
import math
import os
import random
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
from datasets.arrow_writer import ArrowWriter
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from mt import data
from mt.config import TokenizerConfig
from mt.data import TextPairs

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
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets, which nothing here reads.
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=False)]

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


def sample_pairs(pairs: Iterable[tuple[str, str]], k: int, seed: int = 0) -> tuple[list[tuple[str, str]], int]:
    """A uniform random sample of `k` pairs (all of them if there are fewer; k = 0: all) in one pass, and the number
    of pairs seen. Reservoir sampling with geometric skips (Li's algorithm L), so a corpus of millions costs a few
    thousand random draws beyond reading it."""
    it = iter(pairs)
    sample = list(itertools.islice(it, k)) if k else list(it)
    seen = len(sample)
    if not k or seen < k:
        return sample, seen
    rng = random.Random(seed)
    w = math.exp(math.log(rng.random()) / k)
    while True:
        skip = int(math.log(rng.random()) / math.log(1 - w))
        taken = list(itertools.islice(it, skip + 1))
        seen += len(taken)
        if len(taken) <= skip:
            return sample, seen
        sample[rng.randrange(k)] = taken[-1]
        w *= math.exp(math.log(rng.random()) / k)


def train_vocab(cfg: TokenizerConfig, pairs: list[tuple[str, str]], sides: tuple[int, ...]) -> Vocab:
    """BPE on the sentences of `pairs` (side 0: source, 1: target), fed in chunks of 2,000 pairs, side by side."""
    tok = new_tokenizer(cfg.normalization)
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIALS),
        show_progress=False,
    )
    texts = ([p[side] for p in pairs[i : i + 2000]] for i in range(0, len(pairs), 2000) for side in sides)
    tok.train_from_iterator(texts, trainer=trainer, length=len(pairs) * len(sides))
    return Vocab(tok)


def _meta_key(cfg: TokenizerConfig, train_fingerprint: str) -> str:
    return hashlib.sha256(json.dumps([asdict(cfg), train_fingerprint], sort_keys=True).encode()).hexdigest()[:16]


def load_run_vocabs(cfg: TokenizerConfig, run_dir: Path) -> Vocabs:
    if cfg.joint:
        vocab = Vocab.from_file(run_dir / "tokenizer.json")
        return Vocabs(vocab, vocab)
    return Vocabs(Vocab.from_file(run_dir / "tokenizer.src.json"), Vocab.from_file(run_dir / "tokenizer.tgt.json"))


def build_vocabs(
    cfg: TokenizerConfig, pairs: TextPairs, run_dir: Path, resuming: bool = False, cache: Path | None = None
) -> Vocabs:
    """Load `cfg.path`; or reuse the run dir's tokenizer, or the one trained on the same corpus with the same
    config in `cache`; or train one on (a sample of) `pairs` and save it in both.
    `resuming`: the run dir holds a run to continue, whose tokenizer must not be replaced by another."""
    if cfg.path:
        if not Path(cfg.path).is_file():
            raise TokenizerError(f"tokenizer.path={cfg.path}: no such file; train one by unsetting tokenizer.path")
        vocab = Vocab.from_file(cfg.path)
        log.info("tokenizer: loaded %s (%d types)", cfg.path, len(vocab))
        return Vocabs(vocab, vocab)
    key = _meta_key(cfg, pairs.fingerprint)
    meta = run_dir / "tokenizer.meta.json"
    if meta.is_file() and json.loads(meta.read_text()).get("key") == key:
        log.info("tokenizer: reusing %s (data and tokenizer config unchanged)", run_dir)
        return load_run_vocabs(cfg, run_dir)
    if resuming and meta.is_file():  # the run's tokenizer stays: its checkpoint was trained with those ids
        saved = json.loads(meta.read_text()).get("config", {})
        changed = sorted(k for k, v in asdict(cfg).items() if k in saved and saved[k] != v)
        if changed:
            raise TokenizerError(
                f"{meta}: the run in {run_dir} was trained with tokenizer.{changed[0]}={saved.get(changed[0])}; "
                "use a new run_dir, or train.resume=never to start over in this one"
            )
        log.warning("tokenizer: the corpus changed or moved since %s was trained; resuming keeps it", run_dir)
        return load_run_vocabs(cfg, run_dir)
    shared = cache / "mt-tokenizers" / key if cache is not None else None
    if shared is not None and (shared / "tokenizer.meta.json").is_file():
        vocabs, record = load_run_vocabs(cfg, shared), json.loads((shared / "tokenizer.meta.json").read_text())
        log.info("tokenizer: reusing the BPE trained on this corpus with this config (%s)", shared)
    else:
        vocabs, record = _train_vocabs(cfg, pairs, key)
        if shared is not None:
            _save(vocabs, record, shared)
    _save(vocabs, record, run_dir)
    return vocabs


def _train_vocabs(cfg: TokenizerConfig, pairs: TextPairs, key: str) -> tuple[Vocabs, dict]:
    start = time.perf_counter()
    sample, seen = sample_pairs(pairs, cfg.sample_pairs)
    if cfg.joint:
        vocab = train_vocab(cfg, sample, (0, 1))
        vocabs = Vocabs(vocab, vocab)
    else:
        vocabs = Vocabs(train_vocab(cfg, sample, (0,)), train_vocab(cfg, sample, (1,)))
    log.info(
        "tokenizer: trained BPE on %d of %d pairs in %.1f s: %d source / %d target types",
        len(sample),
        seen,
        time.perf_counter() - start,
        len(vocabs.src),
        len(vocabs.tgt),
    )
    return vocabs, {"key": key, "config": asdict(cfg), "pairs": seen, "sampled_pairs": len(sample)}


def _save(vocabs: Vocabs, record: dict, dir: Path) -> None:
    """The tokenizer files, then their record (written last: a dir with a record holds a whole tokenizer)."""
    vocabs.save(dir)
    tmp = dir / "tokenizer.meta.json.tmp"
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(dir / "tokenizer.meta.json")


def id_features(vocabs: Vocabs, text: bool = False) -> datasets.Features:
    """Ids as uint16 when both vocabularies fit (2 bytes a token instead of 8), lengths as int32 columns."""
    ids = datasets.Sequence(datasets.Value("uint16" if max(len(vocabs.src), len(vocabs.tgt)) <= 1 << 16 else "int32"))
    columns = {"src": datasets.Value("string"), "tgt": datasets.Value("string")} if text else {}
    lengths = {"src_len": datasets.Value("int32"), "tgt_len": datasets.Value("int32")}
    return datasets.Features({**columns, "src_ids": ids, "tgt_ids": ids, **lengths})


def tokenize_pairs(pairs: TextPairs, vocabs: Vocabs, cache: Path) -> datasets.Dataset:
    """The training table: `src_ids`, `tgt_ids` and their lengths, nothing else (the text is not stored twice).

    Local files are read and encoded in one streaming pass into an Arrow file under `cache`, named after the files'
    fingerprint, the tokenizers and this module's encoding code: a second run maps that file without reading the
    corpus. A hub table is mapped instead, its text columns dropped."""
    if pairs.reader is None:
        return tokenize(data.drop_empty(pairs.table, pairs.where), vocabs, keep_text=False)
    code = inspect.getsource(_write_tokenized)
    key = f"{pairs.fingerprint}:{vocabs.src.digest()}:{vocabs.tgt.digest()}:{code}"
    path = cache / "mt-tokenized" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.arrow"
    if path.is_file():
        log.info("%s: reusing the tokenized corpus %s", pairs.where, path)
    else:
        _write_tokenized(pairs, vocabs, path)
    return datasets.Dataset.from_file(str(path))


def _write_tokenized(pairs: TextPairs, vocabs: Vocabs, path: Path) -> None:
    """Encode `pairs` in chunks (`tokenizers` spreads each over the cores) and write them with datasets' Arrow
    writer, a chunk at a time; the file appears under its name only once complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    start, n = time.perf_counter(), 0
    try:
        with ArrowWriter(features=id_features(vocabs), path=str(tmp)) as writer:
            for chunk in pairs.chunks(10_000):
                src = vocabs.src.encode_batch([s for s, _ in chunk])
                tgt = vocabs.tgt.encode_batch([t for _, t in chunk])
                lengths = {"src_len": [len(x) for x in src], "tgt_len": [len(x) for x in tgt]}
                writer.write_batch({"src_ids": src, "tgt_ids": tgt, **lengths})
                n += len(chunk)
            writer.finalize()
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    log.info("%s: %d pairs read, %d dropped as empty on either side", pairs.where, pairs.n_read, pairs.n_empty)
    log.info("%s: tokenized %d pairs in %.1f s (%.0f pairs/s)", pairs.where, n, seconds, n / max(seconds, 1e-9))


def tokenize(ds: datasets.Dataset, vocabs: Vocabs, keep_text: bool = True) -> datasets.Dataset:
    """Add `src_ids`, `tgt_ids` (and their lengths) columns to a table of `src`/`tgt` text, or replace the text with
    them (`keep_text=False`); cached by datasets, keyed on corpus and tokenizers."""

    def encode(batch: dict) -> dict:
        src, tgt = vocabs.src.encode_batch(batch["src"]), vocabs.tgt.encode_batch(batch["tgt"])
        # Lengths as their own columns: the batch sampler reads them without loading every id into memory.
        return {"src_ids": src, "tgt_ids": tgt, "src_len": [len(x) for x in src], "tgt_len": [len(x) for x in tgt]}

    # The cache key covers the corpus, both tokenizers and this function's code (a changed `encode` must not
    # reuse columns cached by an older version).
    code = hashlib.sha256(inspect.getsource(encode).encode()).hexdigest()
    key = f"{ds._fingerprint}:{vocabs.src.digest()}:{vocabs.tgt.digest()}:{code}:{keep_text}"
    fingerprint = hashlib.sha256(key.encode()).hexdigest()
    return ds.map(
        encode,
        batched=True,
        batch_size=2000,
        features=id_features(vocabs, text=keep_text),
        remove_columns=None if keep_text else ["src", "tgt"],
        new_fingerprint=fingerprint[:32],
        desc="tokenize",
    )
