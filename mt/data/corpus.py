"""The training run's corpus, assembled from the layers below it: splits read (mt/data/read.py), BPE trained or reused
(vocabularies from mt/data/tokenizer.py, kept in the run dir and a data-level cache), tokenized into a cached Arrow
table and filtered, then cut into token-budget batches; optionally re-segmented every epoch with BPE-dropout."""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
from datasets.arrow_writer import ArrowWriter

from mt.config import Config, ConfigError, CorpusConfig, DataConfig, parse_direction
from mt.data import read
from mt.data.batching import BatchLoader, TokenBucketSampler
from mt.data.bpe_dropout import BPEDropoutSegments
from mt.data.holdout import Without, held_out_pairs, hold_out
from mt.data.read import TextPairs
from mt.data.tokenizer import Framing, Vocabs
from mt.data.vocabularies import _meta_key, build_vocabs  # noqa: F401  (_meta_key: the tests read the cache key)
from mt.run_dir import resume_path

log = logging.getLogger(__name__)


@dataclass
class Mix:
    """Several training corpora in one table: which corpus each row comes from, their weights, and the tag id put
    before each row's source (-1: none)."""

    part: np.ndarray  # (rows,) corpus index
    weights: list[float]
    tags: np.ndarray  # (rows,) tag id or -1

    def epoch_rows(self, seed: int, epoch: int) -> np.ndarray:
        """The rows an epoch trains on: corpus i's rows int(w_i) times each, and a random fraction w_i - int(w_i)
        of them once more, drawn from (seed, epoch) alone (a resumed run draws the same)."""
        rng, out = np.random.default_rng([seed, epoch, 0x6D6978]), []
        for i, weight in enumerate(self.weights):
            rows = np.flatnonzero(self.part == i)
            out += [rows] * int(weight)
            if extra := round((weight - int(weight)) * len(rows)):
                out.append(np.sort(rng.choice(rows, size=extra, replace=False)))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


@dataclass
class Direction:
    """One direction of a multilingual run: its name ("en-de"), its data config, its target-language token's id,
    and its validation split (tokenized, the token first)."""

    name: str
    config: DataConfig
    tag: int
    valid: datasets.Dataset


def target_token(lang: str) -> str:
    """The token that asks a multilingual model for `lang` (Johnson et al. 2017)."""
    return f"<2{lang}>"


@dataclass
class Corpus:
    vocabs: Vocabs
    train: datasets.Dataset  # ids and lengths of the pairs kept by the filters
    valid: datasets.Dataset  # tokenized; `src`/`tgt` raw for BLEU
    train_text: read.TextPairs  # the training pairs as text (read again only for BPE-dropout)
    train_rows: np.ndarray  # which of them `train` kept
    train_lengths: tuple[np.ndarray, np.ndarray]  # `train`'s source and target lengths (no </s>, <s>; tags in)
    mix: Mix | None = None  # with `data.corpora` or `data.directions`
    directions: list[Direction] | None = None  # with `data.directions`; `valid` is then theirs end to end
    framing: Framing = Framing()  # the model's special ids and language tokens (an imported model's differ)


def training_parts(dc: DataConfig) -> list[tuple[DataConfig, str | None, float]]:
    """(data config, tag, weight) of each training corpus: each direction of `data.directions` (the main corpus in
    that direction, its target-language token as tag) and each of `data.corpora` (in a multilingual run also led
    by its target language's token, as inference will lead it); or the main corpus alone."""
    parts = [(direction_config(dc, d), target_token(parse_direction(d)[1]), 1.0) for d in dc.directions]
    for i, c in enumerate(dc.corpora):
        if c.dir is not None and not Path(c.dir).is_dir():
            raise read.DataError(f"data.corpora[{i}].dir={c.dir!r} is not a directory; point it at that corpus's "
                                 "files ({split}.{lang}[.gz] for the parallel format)")  # fmt: skip
        config, tag = read.corpus_config(dc, c), c.tag
        if dc.directions:
            if tag is not None:
                raise ConfigError(f"data.corpora[{i}].tag={tag}: in a data.directions run each source starts with "
                                  f"its target-language token ({target_token(config.tgt_lang)}), and a second tag "
                                  "is not supported; unset the tag")  # fmt: skip
            tag = target_token(config.tgt_lang)
        parts.append((config, tag, c.weight))
    return parts or [(dc, None, 1.0)]


def direction_config(dc: DataConfig, direction: str) -> DataConfig:
    src, tgt = parse_direction(direction)
    return read.corpus_config(dc, CorpusConfig(name=f"{dc.name}.{direction}", src_lang=src, tgt_lang=tgt))


def with_tag(ds: datasets.Dataset, tag: int) -> datasets.Dataset:
    """A tokenized table whose sources start with token `tag`."""
    return ds.map(lambda b: {"src_ids": [[tag, *s] for s in b["src_ids"]], "src_len": [n + 1 for n in b["src_len"]]},
                  batched=True, desc="tag")  # fmt: skip


def prepare_data(cfg: Config, run_dir: Path, max_positions: int, vocabs: Vocabs | None = None) -> Corpus:
    """Train (or reuse) the BPE, tokenize the training pairs into the cache (or map the cached table), filter them
    by length; load and tokenize the validation split (or hold one out: `data.valid_from_train`). With
    `data.corpora`, BPE learns from all of them (their tags as special tokens), each is tokenized and cached on its
    own (adding a corpus re-tokenizes only that one), and the training table is theirs end to end, mixed by weight
    every epoch (`Mix`). `vocabs`: tokenizers to use as they are (a fine-tuning run's parent's)."""
    dc = cfg.data
    log.info("data: %s", read.describe(dc))
    if not dc.directions:
        read.check_valid_split(dc)  # before the BPE is learnt
    parts = training_parts(dc)
    texts = [read.TextPairs.of_split(p, p.train_split) for p, _, _ in parts]
    tags = tuple(sorted({tag for _, tag, _ in parts if tag}))
    resuming = resume_path(cfg.train.resume, run_dir) is not None
    held = hold_out(texts[0], dc.valid_from_train, cfg.train.seed) if dc.valid_from_train else None
    every = texts[0] if len(texts) == 1 else read.ChainedPairs(texts)
    learn = [Without(texts[0], held), *texts[1:]] if held is not None else texts  # what the BPE may see
    learn_from = learn[0] if len(learn) == 1 else read.ChainedPairs(learn)
    languages = [(t, p.src_lang, p.tgt_lang) for t, (p, _, _) in zip(texts, parts)] if dc.directions else None
    if vocabs is None:
        vocabs = build_vocabs(cfg.tokenizer, learn_from, run_dir, resuming, read.cache_root(dc), tags, languages,
                              (dc.src_lang, dc.tgt_lang))  # fmt: skip
        source = f"tokenizer.path={cfg.tokenizer.path}"
    else:
        vocabs.save(run_dir)
        source = f"train.init_from={cfg.train.init_from}: its tokenizer"
    missing = [tag for tag in tags if vocabs.src.token_to_id(tag) is None]
    if missing:
        raise ConfigError(f"{source} has no {missing[0]} token, which this run puts before sources "
                          "(data.directions, data.corpora tags); give a tokenizer trained with it")  # fmt: skip
    framing = vocabs.framing(dc.src_lang, dc.tgt_lang)  # (a language the model lacks: a one-line error, now)
    leads = len(framing.src_lead), len(framing.tgt_lead)
    max_len = min(dc.max_len, max_positions - 1)  # -1: room for </s> or <s>
    tables, lengths, kept, tag_ids = [], [], [], []
    for text, (_, tag, _) in zip(texts, parts):
        tokens = tokenize_pairs(text, vocabs, read.cache_root(dc))
        src_len, tgt_len = read.length_columns(tokens)
        src_len = src_len + 1 if tag else src_len  # the tag is a source token too
        src_len, tgt_len = src_len + leads[0], tgt_len + leads[1]  # and an imported model's language tokens
        rows = read.length_filter(src_len, tgt_len, max_len, dc.max_ratio, text.where)
        if held is not None and not kept:  # the main corpus: the first
            rows = np.setdiff1d(rows, held, assume_unique=True)
        tables.append(read.select_rows(tokens, rows))
        lengths.append((src_len[rows], tgt_len[rows]))
        kept.append(rows)
        tag_ids.append(np.full(len(rows), vocabs.src.token_to_id(tag) if tag else -1, dtype=np.int64))
    if dc.directions:
        directions = validation_directions(dc, vocabs, max_len)
        valid = datasets.concatenate_datasets([d.valid for d in directions])
    else:
        directions = None
        if held is not None:
            valid = held_out_pairs(texts[0], held, run_dir)
        else:
            valid = read.drop_empty(read.load_split(dc, dc.valid_split), f"{dc.name}/{dc.valid_split}")
        valid = truncate(tokenize(valid, vocabs), max_len - max(leads), dc.valid_split)
    if len(parts) == 1 and not tags:
        return Corpus(vocabs, tables[0], valid, texts[0], kept[0], lengths[0], framing=framing)
    part = np.concatenate([np.full(len(r), i, dtype=np.int64) for i, r in enumerate(kept)])
    mix = Mix(part, [w for _, _, w in parts], np.concatenate(tag_ids))
    train_lengths = (np.concatenate([s for s, _ in lengths]), np.concatenate([t for _, t in lengths]))
    for (p, tag, weight), rows in zip(parts, kept):
        log.info("corpus %s: %d pairs, weight %g%s", p.name, len(rows), weight, f", tag {tag}" if tag else "")
    return Corpus(vocabs, datasets.concatenate_datasets(tables), valid, every, np.concatenate(kept), train_lengths,
                  mix, directions, framing)  # fmt: skip


def validation_directions(dc: DataConfig, vocabs: Vocabs, max_len: int) -> list[Direction]:
    """Each direction's validation split, tokenized, its target-language token first (as in training)."""
    out = []
    for name in dc.directions:
        config = direction_config(dc, name)
        tag = vocabs.src.token_to_id(target_token(config.tgt_lang))
        split = read.drop_empty(read.load_split(config, dc.valid_split), f"{config.name}/{dc.valid_split}")
        valid = with_tag(truncate(tokenize(split, vocabs), max_len - 1, dc.valid_split), tag)
        out.append(Direction(name, config, tag, valid))
    return out


class TaggedRows:
    """A training table whose rows' sources start with their corpus's tag (`Mix.tags`), read like the table."""

    def __init__(self, table: datasets.Dataset, tags: np.ndarray):
        self.table, self.tags = table, tags

    def __getitem__(self, indices: list[int]) -> dict:
        rows = self.table[indices]
        rows["src_ids"] = [[int(t), *s] if t >= 0 else s for t, s in zip(self.tags[indices], rows["src_ids"])]
        return rows


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
        return tokenize(read.drop_empty(pairs.table, pairs.where), vocabs, keep_text=False)
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


def make_sampler(lengths: tuple[np.ndarray, np.ndarray], max_tokens: int, seed: int, shuffle: bool, world: int = 1,
                 rank: int = 0, formation: str = "pools") -> TokenBucketSampler:  # fmt: skip
    """A sampler over pairs of these (source, target) token lengths, counted without specials."""
    src_lens = lengths[0].astype(np.int64) + 1  # + </s>
    tgt_lens = lengths[1].astype(np.int64) + 1  # + <s> (input) or </s> (output)
    return TokenBucketSampler(src_lens, tgt_lens, max_tokens, seed, shuffle, num_replicas=world, rank=rank,
                              formation=formation)  # fmt: skip


def training_batches(corpus: Corpus, cfg: Config, world: int, rank: int, cuda: bool = False):
    """The sampler (this rank's shard of each epoch), the loader that collates its batches (on CUDA two batches
    ahead, in pinned memory), and the BPE-dropout segments the loader reads from (None without
    `train.bpe_dropout`)."""
    tc = cfg.train
    sampler = make_sampler(corpus.train_lengths, tc.max_tokens, tc.seed, True, world, rank, cfg.data.batching)
    sampler.mix = corpus.mix.epoch_rows if corpus.mix is not None else None
    if n := sampler.oversized():
        longest = int(max(sampler.src_lens.max(), sampler.tgt_lens.max()))
        raise ConfigError(
            f"train.max_tokens={tc.max_tokens} is below the longest training pair ({longest} tokens, {n} pairs "
            "over it); raise train.max_tokens or lower data.max_len"
        )
    ahead = dict(prefetch=2, pin_memory=True) if cuda else {}
    if not tc.bpe_dropout:
        table = corpus.train.select_columns(["src_ids", "tgt_ids"])
        rows = TaggedRows(table, corpus.mix.tags) if corpus.mix is not None else table
        return sampler, BatchLoader(rows, sampler, framing=corpus.framing, **ahead), None
    if corpus.mix is not None:
        raise ConfigError("train.bpe_dropout with data.corpora is not supported; set train.bpe_dropout=0")
    if corpus.vocabs.family != "bpe":
        raise ConfigError("train.bpe_dropout re-segments with this project's BPE; an imported model's tokenizer "
                          "(train.init_from) has none: set train.bpe_dropout=0")  # fmt: skip
    if len(corpus.train) > BPE_DROPOUT_MAX_PAIRS:
        raise ConfigError(
            f"train.bpe_dropout={tc.bpe_dropout} re-segments every training pair in memory each epoch and sends "
            f"them to every rank, which holds up to {BPE_DROPOUT_MAX_PAIRS:,} pairs; this corpus has "
            f"{len(corpus.train):,}: set train.bpe_dropout=0"
        )
    max_len = min(cfg.data.max_len, cfg.model.max_positions - 1)
    segments = BPEDropoutSegments.of(corpus, tc.bpe_dropout, max_len, world, rank)
    return sampler, BatchLoader(segments, sampler, **ahead), segments


# BPE-dropout keeps the training text and this epoch's ids as Python lists (~1 KB a pair with both sides).
BPE_DROPOUT_MAX_PAIRS = 500_000
