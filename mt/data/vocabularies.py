"""The run's BPE vocabularies: loaded (`tokenizer.path`), reused (the run dir's, or the one trained on the same
corpus with the same settings in the data-level cache), or trained on a sample of the corpus, as the text will be
seen (Moses-tokenized, case-marked) and balanced across a multilingual run's languages."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

from mt.config import ConfigError, TokenizerConfig
from mt.data import casing
from mt.data.pretokenize import JOINER, moses
from mt.data.read import TextPairs
from mt.data.tokenizer import (
    Vocab,
    Vocabs,
    balanced_sample,
    folded_joiner,
    load_run_vocabs,
    protect,
    sample_pairs,
    train_vocab,
    train_vocab_on,
)
from mt.errors import TokenizerError

log = logging.getLogger(__name__)


def _meta_key(cfg: TokenizerConfig, train_fingerprint: str, tags: tuple[str, ...] = (), balanced: bool = False) -> str:
    config = asdict(cfg)
    for key, off in (("pretokenize", "none"), ("case_markup", False)):  # (a run without them: the key of before)
        if config[key] == off:
            del config[key]
    what = [config, train_fingerprint, *([list(tags)] if tags else []), *(["balanced"] if balanced else [])]
    what += ["punctuation keeps its space", "joiner marks"] if cfg.pretokenize == "moses" else []  # `new_tokenizer`'s
    if cfg.pretokenize == "moses" and folded_joiner(cfg.normalization) != JOINER:
        what.append("real joiners protected")  # (NFKC, NFKD: `protect`)
    # (without tags, balance or Moses: the keys of before)
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def build_vocabs(
    cfg: TokenizerConfig,
    pairs: TextPairs,
    run_dir: Path,
    resuming: bool = False,
    cache: Path | None = None,
    tags: tuple[str, ...] = (),
    languages: list[tuple[TextPairs, str, str]] | None = None,
    langs: tuple[str, str] | None = None,
) -> Vocabs:
    """Load `cfg.path`; or reuse the run dir's tokenizer, or the one trained on the same corpus with the same
    config in `cache`; or train one on (a sample of) `pairs` and save it in both.
    `resuming`: the run dir holds a run to continue, whose tokenizer must not be replaced by another.
    `tags`: special tokens the corpora put before their sources, each one id after the fixed four. `languages`:
    (pairs, source language, target language) of a multilingual run's directions, for a joint BPE whose sample
    is balanced across languages (`balanced_sample`). `langs`: the run's (source, target) languages, which
    `tokenizer.pretokenize=moses` tokenizes in."""
    if cfg.pretokenize != "none" and langs is None:
        raise ConfigError(f"tokenizer.pretokenize={cfg.pretokenize} needs the run's languages")
    if cfg.path:
        if not Path(cfg.path).is_file():
            raise TokenizerError(f"tokenizer.path={cfg.path}: no such file; train one by unsetting tokenizer.path")
        vocab = Vocab.from_file(cfg.path)
        log.info("tokenizer: loaded %s (%d types)", cfg.path, len(vocab))
        return Vocabs(vocab, vocab).pretokenizing(cfg.pretokenize, *(langs or ("", "")), cfg.case_markup)
    key = _meta_key(cfg, pairs.fingerprint, tags, balanced=bool(languages))
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
        vocabs, record = (
            _train_vocabs(cfg, pairs, key, tags, langs) if not languages else _train_balanced(cfg, languages, key, tags)
        )
        if shared is not None:
            _save(vocabs, record, shared)
    _save(vocabs, record, run_dir)
    return vocabs


def _train_vocabs(cfg: TokenizerConfig, pairs: TextPairs, key: str, tags: tuple[str, ...],
                  langs: tuple[str, str] | None) -> tuple[Vocabs, dict]:  # fmt: skip
    start = time.perf_counter()
    sample, seen = sample_pairs(pairs, cfg.sample_pairs)
    if cfg.pretokenize == "moses":  # the BPE learns from the text as it will see it (`Vocab.pretokenized`)
        src, tgt, folded = moses(langs[0]), moses(langs[1]), folded_joiner(cfg.normalization)
        sample = [
            (src.tokenize(protect(s, folded, JOINER)), tgt.tokenize(protect(t, folded, JOINER))) for s, t in sample
        ]
    if cfg.case_markup:  # (after Moses, as `Vocab.pretokenized`)
        sample = [(casing.mark(s), casing.mark(t)) for s, t in sample]
    if cfg.joint:
        vocab = train_vocab(cfg, sample, (0, 1), tags)
        vocabs = Vocabs(vocab, vocab)
    else:
        vocabs = Vocabs(train_vocab(cfg, sample, (0,), tags), train_vocab(cfg, sample, (1,)))
    vocabs = vocabs.pretokenizing(cfg.pretokenize, *(langs or ("", "")), cfg.case_markup)
    log.info(
        "tokenizer: trained BPE on %d of %d pairs in %.1f s: %d source / %d target types",
        len(sample),
        seen,
        time.perf_counter() - start,
        len(vocabs.src),
        len(vocabs.tgt),
    )
    return vocabs, {"key": key, "config": asdict(cfg), "pairs": seen, "sampled_pairs": len(sample)}


def _train_balanced(cfg: TokenizerConfig, languages, key: str, tags: tuple[str, ...]) -> tuple[Vocabs, dict]:
    start = time.perf_counter()
    texts = balanced_sample(languages, cfg.sample_pairs)
    if cfg.case_markup:
        texts = {lang: [casing.mark(t) for t in sentences] for lang, sentences in texts.items()}
    chunks = (sentences[i : i + 2000] for sentences in texts.values() for i in range(0, len(sentences), 2000))
    vocab = train_vocab_on(cfg, chunks, sum(len(t) for t in texts.values()), tags)
    counts = {lang: len(t) for lang, t in texts.items()}
    sentences = ", ".join(f"{n} {lang}" for lang, n in counts.items())
    seconds = time.perf_counter() - start
    log.info("tokenizer: trained a joint BPE on %s sentences in %.1f s: %d types", sentences, seconds, len(vocab))
    vocabs = Vocabs(vocab, vocab).pretokenizing("none", "", "", cfg.case_markup)
    return vocabs, {"key": key, "config": asdict(cfg), "sentences": counts}


def _save(vocabs: Vocabs, record: dict, dir: Path) -> None:
    """The tokenizer files, then their record (written last: a dir with a record holds a whole tokenizer)."""
    vocabs.save(dir)
    tmp = dir / "tokenizer.meta.json.tmp"
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(dir / "tokenizer.meta.json")
