"""Case markup (`tokenizer.case_markup=true`): the BPE and the model see lowercase words, each one that was
capitalized or all in capitals preceded by a mark, and translations get their case back from the marks, as
OpenNMT's tokenizer does with its `case_markup` option (Etchegoyhen & Gete 2020 compare the ways of handling case).

"Das Haus", "das Haus" and "DAS HAUS" then share their subwords (a lowercased vocabulary learns each word once,
which is fairseq's and JoeyNMT's reason to lowercase small corpora), yet the output is cased text:

    mark("Der BMW fährt")  == "\ue0c1 der \ue0c2 bmw fährt"      restore(that) == "Der BMW fährt"

A mark describes the next run of letters and digits and is a word of its own (so the word after it keeps the
subwords it has anywhere else): before the word for its first run, before the run for a later one ("Blut-Hirn"
-> "\ue0c1 blut-\ue0c1 hirn"). Marks are characters of Unicode's private use area, which real text does not hold;
inputs have any such character removed. Runs of mixed case ("iPhone", "McDonald") and runs whose case would not
come back exactly (the German "GROß" would return as "GROSS") stay as they are. The text is split at single
spaces only, so `restore(mark(s)) == s` for any `s` without the marks: prefixes and constraints mean the same
text in the output as in the request.
"""

from __future__ import annotations

import re

TITLE = "\ue0c1"  # the next word starts with a capital: "Haus"
UPPER = "\ue0c2"  # the next word is all capitals: "BMW"
MARKS = (TITLE, UPPER)
STRAY = str.maketrans("", "", TITLE + UPPER)
_RUN = re.compile(r"[^\W_]+")  # a run of letters and digits: the unit a mark describes
# A run of marks (the last one counts), the space after it (the one `mark` put there), the punctuation before the
# run it describes ("(", a quote, "_": not part of a run either) and the run. A model may also glue a mark to its
# word or end with one.
_MARKED = re.compile(f"([{TITLE}{UPPER}]+) ?((?:[^\\w\\s{TITLE}{UPPER}]|_)*)([^\\W_]*)")


def _title(lower: str) -> str:
    """`lower` with its first cased character in upper case."""
    for i, c in enumerate(lower):
        if c.upper() != c:
            return lower[:i] + c.upper() + lower[i + 1 :]
    return lower


def _cased(kind: str, lower: str) -> str:
    return lower.upper() if kind == UPPER else _title(lower)


def _kind(run: str) -> str | None:
    """The mark that gives `run` back from its lowercase, or None (lowercase already, mixed case, or a case that
    would not come back exactly)."""
    lower = run.lower()
    if lower == run:
        return None
    if _title(lower) == run:
        return TITLE
    if lower.upper() == run and sum(c.upper() != c for c in lower) >= 2:
        return UPPER
    return None


def mark_word(word: str) -> str:
    """`word` (no spaces) with its runs of letters and digits lowercased, each that was capitalized or in capitals
    marked: the word's first run by a mark before the word ("(Hallo" -> "\ue0c1 (hallo"), a later one by a mark
    before the run ("Blut-Hirn" -> "\ue0c1 blut-\ue0c1 hirn")."""
    lead, parts, pos = "", [], 0
    for i, m in enumerate(_RUN.finditer(word)):
        kind = _kind(m.group())
        parts.append(word[pos : m.start()])
        if kind is not None:
            if i == 0:
                lead = f"{kind} "
            else:
                parts.append(f"{kind} ")
        parts.append(m.group().lower() if kind is not None else m.group())
        pos = m.end()
    return lead + "".join(parts) + word[pos:]


def mark(text: str) -> str:
    """`text` with its words lowercased and marked (`mark_word`); split at single spaces, which stay as they are."""
    return " ".join(mark_word(w) for w in text.translate(STRAY).split(" "))


def restore(text: str) -> str:
    """Text with marks (`mark`'s, or a model's output) in its case: each mark applied to the run of letters and
    digits after it and removed with the space it put there."""
    return _MARKED.sub(lambda m: m.group(2) + _cased(m.group(1)[-1], m.group(3)), text)
