"""Terminology for the Translator: each line's constraint phrases, from a constraints file or the API (given per line)
and from a glossary (the target terms whose source terms occur in the line), encoded for the constrained search
(mt/decode/constraints.py), and a tally of what the translations hold.

    glossary.tsv:   package leaflet<TAB>Packungsbeilage
                    tablet<TAB>Tablette

    python translate.py checkpoint=RUN glossary=glossary.tsv < in.en
    python translate.py checkpoint=RUN constraints=cons.de < in.en    # per line: phrase<TAB>phrase..., or empty
"""

from __future__ import annotations

import logging
import re
from dataclasses import astuple, dataclass
from functools import cache, cached_property
from pathlib import Path

from mt.config import ConfigError, DecodeConfig
from mt.data import files
from mt.data.pretokenize import JOINER
from mt.data.tokenizer import Vocab
from mt.decode.constraints import Constraints
from mt.decode.search import Hypothesis
from mt.errors import DataError

log = logging.getLogger(__name__)


def fold(text: str) -> str:
    """The form in which `glossary_ignore_case` compares terms and text: Unicode case folding, with the dotted
    capital I (U+0130, which folds to "i" and a combining dot) folded to "i" as Turkish and Azeri lowercase it. The
    dotless "ı" stays a letter of its own ("sıt" is not "sit"), unlike in `re.IGNORECASE`."""
    return text.casefold().replace("i\u0307", "i")


class Glossary:
    """Source term -> target term. A term matches as whole words (not inside a longer word), the longest term first
    where two overlap; with `ignore_case`, terms and text are compared in their `fold`ed forms (the pattern is
    matched against the folded line, so a match is always one of the keys)."""

    def __init__(self, terms: dict[str, str], ignore_case: bool = False):
        self.ignore_case = ignore_case
        self.terms = {self._key(s): t for s, t in terms.items()}
        self._alternatives = "|".join(re.escape(s) for s in sorted(self.terms, key=len, reverse=True))
        self.pattern = re.compile(rf"(?<!\w)(?:{self._alternatives})(?!\w)") if terms else None

    @cached_property
    def starts(self) -> re.Pattern | None:
        """The longest term at every place one starts (overlapping), for `Stacked`: compiled once, when first used
        (a server compiles its glossary's at load)."""
        return re.compile(rf"(?<!\w)(?=((?:{self._alternatives})(?!\w)))") if self.terms else None

    def compile(self) -> None:
        """Compile `starts` now (a server, at load, rather than in its first request with a glossary)."""
        _ = self.starts

    def longest_at(self, key: str) -> dict[int, tuple[int, str]]:
        """{start: (end, target term)} of the longest term starting at each place in `key` (a `_key`ed line)."""
        if self.starts is None:
            return {}
        return {m.start(): (m.end(1), self.terms[m.group(1)]) for m in self.starts.finditer(key)}

    def _key(self, term: str) -> str:
        return fold(term) if self.ignore_case else term

    def __len__(self) -> int:
        return len(self.terms)

    @classmethod
    def from_file(cls, path: str | Path, ignore_case: bool = False, key: str = "glossary") -> Glossary:
        """A TSV file: "source term<TAB>target term" per line; blank lines and lines starting with # are skipped."""
        if not Path(path).is_file():
            raise DataError(f"{key}={path}: no such file; give a TSV file of source term<TAB>target term lines")
        pairs = []
        for n, line in enumerate(files.read_lines(Path(path)), start=1):
            if not line.strip() or line.startswith("#"):
                continue
            cells = [c.strip() for c in line.rstrip("\n").split("\t")]
            if len(cells) != 2 or not all(cells):
                raise DataError(f"{path}:{n}: expected 'source term<TAB>target term', got {line.strip()!r}")
            pairs.append((cells[0], cells[1], f"{path}:{n}"))
        return cls.from_pairs(pairs, ignore_case)

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, str, str]], ignore_case: bool = False) -> Glossary:
        """From (source, target, where) triples; an empty term, or a source term given two different targets, is a
        one-line error naming `where`."""
        terms: dict[str, str] = {}
        seen: dict[str, tuple[str, str]] = {}
        for src, tgt, where in pairs:
            src, tgt = src.strip(), tgt.strip()
            if not src or not tgt:  # an empty source term would match between any two non-word characters
                raise ConfigError(f"{where}: an empty {'source' if not src else 'target'} term; give both terms")
            key = fold(src) if ignore_case else src
            if key in seen and seen[key][0] != tgt:
                raise ConfigError(f"{where}: {src!r} is translated {tgt!r} here but {seen[key][0]!r} at "
                                  f"{seen[key][1]}; keep one")  # fmt: skip
            seen[key] = (tgt, where)
            terms[src] = tgt
        return cls(terms, ignore_case)

    def merged(self, other: Glossary) -> Glossary | Stacked:
        """This glossary with `other`'s terms on top (a request's terms over the server's). Where both compare
        alike (`ignore_case`), a `Stacked` pair that matches each on its own and so compiles nothing new (a
        request's few terms must not recompile a server's 20,000); else one glossary, linear in the terms, that
        ignores case (either did)."""
        if self.ignore_case == other.ignore_case:
            return Stacked(self, other)
        ignore_case = self.ignore_case or other.ignore_case
        key = fold if ignore_case else (lambda term: term)
        return Glossary({**{key(s): t for s, t in self.terms.items()}, **{key(s): t for s, t in other.terms.items()}},
                        ignore_case)  # fmt: skip

    def find(self, line: str) -> list[str]:
        """The target terms of the source terms in `line`, in order of first occurrence, each once."""
        if self.pattern is None:
            return []
        found = (self.terms[m.group(0)] for m in self.pattern.finditer(self._key(line)))
        return list(dict.fromkeys(found))


class Stacked:
    """A glossary over another (a request's over the server's), matched as their merge would be: left to right,
    at each place the longest term of either, the top one's target where both have the term."""

    def __init__(self, base: Glossary, top: Glossary):
        self.base, self.top, self.ignore_case = base, top, base.ignore_case

    def __len__(self) -> int:
        return len(self.base) + sum(term not in self.base.terms for term in self.top.terms)

    def find(self, line: str) -> list[str]:
        key = self.base._key(line)
        below, above = self.base.longest_at(key), self.top.longest_at(key)
        found, pos = [], 0
        for start in sorted(below.keys() | above.keys()):
            if start < pos:  # inside the match before
                continue
            end, target = max(below.get(start, (0, "")), above.get(start, (0, "")), key=lambda m: m[0])
            if above.get(start, (0,))[0] == end:  # the same term in both: the top one's target
                target = above[start][1]
            found.append(target)
            pos = end
        return list(dict.fromkeys(found))


@dataclass
class Tally:
    """What the constraints of a run asked and what its translations hold."""

    lines: int = 0  # lines with constraints
    phrases: int = 0
    met: int = 0
    glossary_lines: int = 0  # lines where a glossary term occurs
    glossary_terms: int = 0
    glossary: bool = False  # a glossary was applied

    def log(self) -> None:
        if self.glossary:
            log.info("glossary: terms in %d lines (%d terms)", self.glossary_lines, self.glossary_terms)
        if self.lines:
            log.info("constraints: %d of %d met (%.1f%%) in %d lines", self.met, self.phrases,
                     100 * self.met / self.phrases, self.lines)  # fmt: skip


@cache
def word_boundaries(vocab: Vocab) -> frozenset[int]:
    """The tokens before which a word has ended: those that begin a word (Metaspace's mark) and punctuation."""
    skip = set(astuple(vocab.specials))  # <pad>, <unk>, <s>, </s>
    return frozenset(i for tok, i in vocab.get_vocab().items()
                     if i not in skip and (tok.startswith("\u2581") or not any(c.isalnum() for c in tok))
                     and not _joins_word(tok))  # fmt: skip


def _joins_word(token: str) -> bool:
    """A Moses model's token that continues the word before it: a joiner, then a letter or digit ("▁￭n't")."""
    rest = token.lstrip("\u2581")
    return rest.startswith(JOINER) and rest[1:2].isalnum()


def check_search(decode: DecodeConfig, where: str) -> None:
    """Constraints need beam search: sampling and greedy search are refused in one line."""
    if decode.sampling:
        raise ConfigError(f"{where}: constraints need beam search, not sampling; unset decode.sampling")
    if decode.beam_size < 2:
        raise ConfigError(f"{where}: constraints need decode.beam_size >= 2 (the beam is shared among hypotheses by "
                          f"the constraints they met), not {decode.beam_size}")  # fmt: skip


def line_constraints(
    vocab: Vocab,
    lines: list[str],
    phrases: list[list[str]] | None,
    glossary: Glossary | None,
    decode: DecodeConfig,
    where: str = "constraints",
    first_line: int = 0,
    tally: Tally | None = None,
) -> list[Constraints] | None:
    """Each line's constraints (its own phrases, then its glossary terms) as target token ids, or None when no line
    has any. A phrase is encoded as it appears inside a sentence (a word's first piece has the word-start mark) and
    must be followed by a word boundary; one the vocabulary cannot produce (an <unk>) is a one-line error naming
    the line."""
    if phrases is None and glossary is None:
        return None
    check_search(decode, where)  # whatever the lines hold: a glossary's fate must not depend on the text
    if phrases is not None and len(phrases) != len(lines):
        raise ConfigError(f"{where}: {len(phrases)} lines of constraints for {len(lines)} input lines; one per line")
    per_line = []
    if tally is not None and glossary is not None:
        tally.glossary = True
    for i, line in enumerate(lines):
        own = [p.strip() for p in (phrases[i] if phrases is not None else []) if p.strip()]
        terms = glossary.find(line) if glossary is not None and line else []
        if tally is not None and terms:
            tally.glossary_lines, tally.glossary_terms = tally.glossary_lines + 1, tally.glossary_terms + len(terms)
        per_line.append(list(dict.fromkeys(own + terms)) if line else [])
    if not any(per_line):
        return None
    flat = [p for ps in per_line for p in ps]
    ids = iter(vocab.encode_batch(flat))
    out = []
    for i, ps in enumerate(per_line):
        encoded = [next(ids) for _ in ps]
        for p, e in zip(ps, encoded):
            if (back := vocab.unchanged(p)) is not None:
                raise ConfigError(f"{where}:{first_line + i + 1}: the constraint {p!r} would come back as {back!r}: "
                                  f"{vocab.why_changed(p)}")  # fmt: skip
            unk = vocab.specials.unk
            if unk in e:
                bad = "".join(dict.fromkeys(c for c in p if unk in vocab.encode(c)))
                raise ConfigError(f"{where}:{first_line + i + 1}: the constraint {p!r} has characters the model's "
                                  f"vocabulary cannot produce ({bad!r}); remove or respell it")  # fmt: skip
        ordered = decode.constraint_order == "ordered"
        out.append(Constraints(encoded, ordered, word_boundaries(vocab), vocab.specials.eos))
    return out


def check(constraints: list[Constraints] | None, hyps: list[list[Hypothesis]], first_line: int, tally: Tally) -> None:
    """Count the constraints each line's best translation holds; warn for a line that misses any (no translation
    within its length limit could hold them all, and it was translated without them)."""
    for i, (rule, hs) in enumerate(zip(constraints or [], hyps)):
        if not rule:
            continue
        met = rule.count_met(hs[0].tokens)
        tally.lines, tally.phrases, tally.met = tally.lines + 1, tally.phrases + len(rule.phrases), tally.met + met
        if met < len(rule.phrases):
            log.warning("line %d: %d of %d constraints not met: no translation within the length limit holds them all "
                        "(decode.max_len_a/max_len_b); translated without them", first_line + i + 1,
                        len(rule.phrases) - met, len(rule.phrases))  # fmt: skip
