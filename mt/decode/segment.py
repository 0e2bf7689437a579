"""Sentence splitting for paragraphs and documents (translate.py `split=true`, `Translator.translate(split=True)`,
the server's `"split": true`, on by default in the page).

A model trained on sentences translates a paragraph badly: it stops early and drops sentences. Each input line is
split into sentences in the source language (by `sentencex`, chosen by benchmarks/quality/segmenters.py), the
sentences of all lines are translated as one batch, and each line's translations are joined back with the line's own
separators: its leading whitespace and what stood between its sentences are kept, so a plain-text document comes
back with its layout and one output line per input line.

A sentence still longer than the model's positions is cut into pieces at clause boundaries (after , ; : or a dash),
or between words where there is none, and the pieces are translated and joined, with a warning: never a translation
of only its first part.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from mt.config import ConfigError

log = logging.getLogger(__name__)

CLAUSE_END = re.compile(r"[,;:]\s+|\s+[-–—]\s+")


def split_sentences(text: str, lang: str) -> list[str]:
    """The sentences of `text` in language `lang` (an ISO code; sentencex falls back to related languages' rules for
    one it has none for)."""
    from sentencex import segment

    return [s for s in segment(lang, text) if s.strip()]


@dataclass
class Line:
    """One input line as sentences and the text around them: lead + s1 + seps[0] + s2 + seps[1] ... == the line."""

    lead: str
    sentences: list[str]
    seps: list[str]

    def join(self, translations: list[str]) -> str:
        return self.lead + "".join(t + s for t, s in zip(translations, self.seps))


def split_line(line: str, lang: str, splitter: Callable[[str, str], list[str]] = split_sentences) -> Line:
    """`line` as a Line. Text the splitter left out stays with the sentence after it, and from a sentence that
    cannot be found as the splitter returned it (a splitter that rewrote whitespace) the rest of the line is one
    sentence: nothing is dropped or copied untranslated."""
    lead = line[: len(line) - len(line.lstrip())]
    sentences: list[str] = []
    seps: list[str] = []
    at = len(lead)
    for s in splitter(line.strip(), lang) if line.strip() else []:
        start = line.find(s.strip(), at)
        if start < 0:
            break
        gap = line[at:start]
        space = gap[: len(gap) - len(gap.lstrip())]
        if sentences:
            seps[-1] = space
        sentences.append(line[at + len(space) : start + len(s.strip())])
        seps.append("")
        at = start + len(s.strip())
    rest = line[at:]
    if rest.strip():
        space = rest[: len(rest) - len(rest.lstrip())]
        if sentences:
            seps[-1] = space
        sentences.append(rest.strip())
        seps.append(rest[len(rest.rstrip()) :])
    elif sentences:
        seps[-1] = rest
    return Line(lead, sentences, seps)


def cut_long(sentence: str, n_tokens: Callable[[str], int], limit: int) -> list[str]:
    """`sentence` as pieces of at most `limit` tokens, cut after the last clause boundary that fits (else the last
    space that fits, else the last character); pieces keep their punctuation, and joined with single spaces they
    give back the sentence's words. Each cut looks only at a window of the rest a few times a piece's length, so
    the work grows with the sentence's length, not with its square."""
    pieces, rest = [], sentence
    while (window := _over_limit(rest, n_tokens, limit)) is not None:
        cut = _last_fitting([m.end() for m in CLAUSE_END.finditer(window)], window, n_tokens, limit)
        if cut is None:
            cut = _last_fitting([m.end() for m in re.finditer(r"\s+", window)], window, n_tokens, limit)
        if cut is None:
            cut = _last_fitting(list(range(1, len(window))), window, n_tokens, limit) or 1
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    return [*pieces, rest] if rest else pieces


def _over_limit(text: str, n_tokens: Callable[[str], int], limit: int) -> str | None:
    """A beginning of `text` of over `limit` tokens, as short as doubling from 8 characters a token finds; None when
    all of `text` fits."""
    size = 8 * limit
    while True:
        head = text[:size]
        if n_tokens(head) > limit:
            return head
        if size >= len(text):
            return None
        size *= 2


def _last_fitting(cuts: list[int], text: str, n_tokens: Callable[[str], int], limit: int) -> int | None:
    """The largest cut position whose prefix has at most `limit` tokens (token counts grow with the prefix)."""
    lo, hi, best = 0, len(cuts) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if text[: cuts[mid]].strip() and n_tokens(text[: cuts[mid]].strip()) <= limit:
            best, lo = cuts[mid], mid + 1
        else:
            hi = mid - 1
    return best


@dataclass
class Document:
    """Input lines split for translation: `sentences` to translate (all lines' together), and how to put the
    translations back."""

    lines: list[Line]
    sentences: list[str]
    parts: list[list[int]]  # per line, per sentence: how many consecutive translated pieces make it

    def cut(self) -> list[tuple[int, int]]:
        """(line index, pieces) of every sentence cut into pieces (over the model's positions)."""
        return [(i, n) for i, parts in enumerate(self.parts) for n in parts if n > 1]

    def line_of(self, piece: int) -> int:
        """The index of the line that `sentences[piece]` comes from."""
        ends = list(itertools.accumulate(sum(parts) for parts in self.parts))
        return bisect.bisect_right(ends, piece)

    def join(self, translations: list[str]) -> list[str]:
        out, at = [], 0
        for line, parts in zip(self.lines, self.parts):
            sentences = []
            for n in parts:
                sentences.append(" ".join(t for t in translations[at : at + n] if t))
                at += n
            out.append(line.join(sentences) if line.sentences else line.lead)
        return out


def split_document(
    lines: list[str],
    lang: str,
    count: Callable[[list[str]], list[int]],
    limit: int,
    first_line: int = 0,
    splitter: Callable[[str, str], list[str]] = split_sentences,
) -> Document:
    """Split every line into sentences, and a sentence over `limit` tokens (`count`: the token counts of a list of
    texts) into pieces, with a warning naming its line (`first_line`: the 0-based number of `lines[0]`)."""
    split = [split_line(text, lang, splitter) for text in lines]
    sizes = iter(count([s for line in split for s in line.sentences]))
    flat, parts = [], []
    n_tokens = lambda text: count([text])[0]  # noqa: E731
    for i, line in enumerate(split):
        counts = []
        for s in line.sentences:
            size = next(sizes)
            pieces = cut_long(s, n_tokens, limit) if size > limit else [s]
            if len(pieces) > 1:
                log.warning("line %d: a sentence of %d tokens, over the model's %d, is translated in %d pieces cut "
                            "at clause boundaries", first_line + i + 1, size, limit, len(pieces))  # fmt: skip
            flat.extend(pieces)
            counts.append(len(pieces))
        parts.append(counts)
    return Document(split, flat, parts)


def whole_line(text: str, lang: str) -> list[str]:
    """A "splitter" that keeps the line as one sentence: without `split`, a line over the model's positions is
    still translated whole, in pieces (`split_document`), never only its first part."""
    return [text]


def refuse_with_split(decode, prefix, constraints, key: str = "split") -> None:
    """What a line split into sentences cannot have: an n-best list, a prefix, per-line constraints."""
    refused = (
        (decode.nbest > 1, "n-best lists"),
        (prefix is not None, "target prefixes"),
        (constraints is not None, "per-line constraints (a glossary applies per sentence)"),
    )
    for given, what in refused:
        if given:
            raise ConfigError(f"{key}: a line split into sentences has no {what}; translate it without {key}")
