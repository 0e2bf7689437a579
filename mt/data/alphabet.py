"""The alphabet a BPE keeps: every character of a Latin, Cyrillic or Greek text, the frequent ones of a Chinese or
Japanese text, whose thousands of characters would otherwise fill a small vocabulary (SentencePiece's
`character_coverage`, 0.9995 for those languages in its documentation)."""

from __future__ import annotations

import logging
from collections import Counter

from mt.config import TokenizerConfig

log = logging.getLogger(__name__)

ALPHABET_SHARE = 4  # an alphabet over 1/ALPHABET_SHARE of the vocabulary is cut to the coverage below,
LARGE_ALPHABET = 1_000  # and over this many characters: alphabetic scripts stay under it, accents and symbols included
CJK_COVERAGE = 0.9995


def alphabet_limit(cfg: TokenizerConfig, texts: list[list[str]]) -> int | None:
    """The characters BPE keeps as its alphabet (None: all of them). `tokenizer.character_coverage` set: the most
    frequent characters that make that share of the text's. Unset: all of them, unless the alphabet is larger than
    LARGE_ALPHABET and takes more than 1/ALPHABET_SHARE of the vocabulary (Chinese or Japanese text: thousands of
    characters would fill a 4k-8k vocabulary and leave no room for merges); then CJK_COVERAGE of the text, at most
    half the vocabulary. A character left out reads as <unk>."""
    coverage, counts = cfg.character_coverage, Counter()
    bound = max(cfg.vocab_size // ALPHABET_SHARE, LARGE_ALPHABET)
    for i, chunk in enumerate(texts):
        for sentence in chunk:
            counts.update(sentence)
        if coverage is None and i == 9 and len(counts) <= bound // 2:
            return None  # the first 10 chunks' alphabet is small: a Latin or Cyrillic text, not worth counting on
    counts.pop(" ", None)
    if coverage is None:
        if len(counts) <= bound:
            return None
        coverage = CJK_COVERAGE
    if coverage >= 1:
        return None
    total, covered, kept = sum(counts.values()), 0, 0
    for _, count in counts.most_common():
        if covered >= coverage * total:
            break
        covered, kept = covered + count, kept + 1
    if cfg.character_coverage is None:
        kept = min(kept, cfg.vocab_size // 2)
    log.info("tokenizer: an alphabet of %d characters for %d entries: the %d most frequent kept (%.2f%% of the "
             "text's characters), the others read as <unk>", len(counts), cfg.vocab_size, kept,
             100 * sum(c for _, c in counts.most_common(kept)) / max(total, 1))  # fmt: skip
    return kept
