"""Sentence splitting for paragraphs and documents (mt/decode/segment.py) and the Translator's `split`."""

import logging

import pytest

from mt.config import ConfigError
from mt.decode.segment import cut_long, split_document, split_line


def count(texts: list[str]) -> list[int]:
    return [len(t.split()) for t in texts]


@pytest.mark.parametrize(
    "line",
    [
        "A dog runs. Two men talk.",
        "    Indented: Dr. Smith arrived at 3.30 p.m. on Monday.  He was late!   Was he?",
        "One sentence without an end",
        "",
        "   ",
        "Wait... Is that really true? „Ja“, sagte er.",
    ],
)
def test_a_line_comes_back_whole_from_its_sentences_and_separators(line):
    split = split_line(line, "en")
    assert split.join(split.sentences) == line
    assert all(s == s.strip() and s for s in split.sentences)


def test_sentences_and_their_separators():
    split = split_line("  Dr. Smith came at 3.30 p.m. on Monday.  He was late.", "en")
    assert split.lead == "  " and split.sentences == ["Dr. Smith came at 3.30 p.m. on Monday.", "He was late."]
    assert split.seps == ["  ", ""]
    assert split_line("Am 1. Mai ist ein Feiertag. Die Geschäfte sind zu.", "de").sentences == [
        "Am 1. Mai ist ein Feiertag.",
        "Die Geschäfte sind zu.",
    ]


def test_text_a_splitter_leaves_out_or_rewrites_is_still_translated():
    dropping = lambda text, lang: ["one.", "three."]  # noqa: E731 (it skipped "two")
    split = split_line("one. two three.", "en", dropping)
    assert split.sentences == ["one.", "two three."] and split.join(split.sentences) == "one. two three."
    rewriting = lambda text, lang: ["one.", "two  three"]  # noqa: E731 (whitespace changed: not found)
    split = split_line("one. two three", "en", rewriting)
    assert split.sentences == ["one.", "two three"]


def test_a_long_sentence_is_cut_at_clause_boundaries_then_between_words():
    s = "first part here, second part is here; and a third part follows here"
    pieces = cut_long(s, lambda t: len(t.split()), 6)
    assert all(len(p.split()) <= 6 for p in pieces) and " ".join(pieces) == s
    assert pieces[0] == "first part here,"  # the clause boundary, not the 6th word
    no_clause = "w " * 20
    pieces = cut_long(no_clause.strip(), lambda t: len(t.split()), 7)
    assert [len(p.split()) for p in pieces] == [7, 7, 6]
    assert cut_long("x" * 30, len, 8) == ["x" * 8] * 3 + ["x" * 6]


def test_cutting_a_long_line_is_linear_in_its_length():
    """Before: every piece re-tokenized the whole rest of the line (a binary search over all of it), so an
    88k-character line cost 16x a 22k one (5.1 s against 0.31 s with the real tokenizer). Counted here as the
    characters handed to the tokenizer: 4x the line, about 4x the work."""
    work = []

    def n_tokens(text: str) -> int:
        work[-1] += len(text)
        return len(text.split())

    for copies in (2_000, 8_000):
        work.append(0)
        line = " ".join(["the cat sees a dog, and"] * copies)
        pieces = cut_long(line, n_tokens, 100)
        assert " ".join(pieces).split() == line.split() and max(len(p.split()) for p in pieces) <= 100
    assert work[1] < 5 * work[0]


def test_a_document_keeps_its_lines_and_warns_of_a_cut_sentence(caplog):
    lines = [
        "A dog runs. Two men talk here.",
        "",
        "  Six dogs run on the long beach in the sun, and two men talk.",
        "Hi.",
    ]
    with caplog.at_level(logging.WARNING, logger="mt.decode.segment"):
        doc = split_document(lines, "en", count, limit=10, first_line=10)
    assert "line 13: a sentence of 14 tokens" in caplog.text
    assert doc.sentences[:2] == ["A dog runs.", "Two men talk here."] and doc.parts[1] == [] and doc.parts[2] == [2]
    assert doc.sentences[2:4] == ["Six dogs run on the long beach in the sun,", "and two men talk."]
    upper = [line.upper() for line in lines]
    assert doc.join([s.upper() for s in doc.sentences]) == upper
    assert [doc.line_of(k) for k in range(len(doc.sentences))] == [0, 0, 2, 2, 3]  # (the server's warnings)


def test_the_translator_splits_paragraphs_and_batches_their_sentences(toy_run, monkeypatch):
    from mt.decode.translator import Translator

    t = Translator.load(toy_run, beam_size=2)
    sentences = ["the cat sees a dog.", "a red house.", "the big tree."]
    alone = t.translate(sentences)
    batches = []
    real = t.hypotheses
    monkeypatch.setattr(t, "hypotheses", lambda lines, *a, **k: batches.append(list(lines)) or real(lines, *a, **k))
    out = t.translate([" ".join(sentences[:2]), "", "    " + sentences[2]], split=True)
    assert batches == [sentences]  # one call for all lines' sentences
    assert out == [f"{alone[0]} {alone[1]}", "", f"    {alone[2]}"]
    for bad in ({"nbest": 2}, {"prefix": ["a", "", "b"]}, {"constraints": [["a"], [], []]}):
        with pytest.raises(ConfigError, match="a line split into sentences has no"):
            t.translate(["a b. c d.", "", "e"], split=True, **bad)
