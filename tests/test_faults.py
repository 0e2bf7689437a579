"""Faults users meet: kill -9 at any moment, hostile input text. The long campaigns are `slow` tests (and scripts in
benchmarks/ that print their figures); a short property test of the same translation path runs by default."""

from __future__ import annotations

import math

import datasets
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.reliability.fuzz_translate import fuzz
from benchmarks.reliability.kill_resume import campaign
from mt.config import DecodeConfig, TokenizerConfig
from mt.data.corpus import build_vocabs
from mt.data.read import TextPairs
from mt.decode.lines import output_lines, split_lines
from mt.decode.translator import Translator
from mt.model.transformer import Transformer
from tests.conftest import tiny_model_config, write_toy_corpus
from tests.test_bad_inputs import run, train_args


@pytest.mark.slow
def test_kill_9_at_random_moments_loses_nothing(tmp_path):
    r = campaign(tmp_path, kills=9, seed=0, verbose=False)
    assert r["kills"] >= 5 and r["resumes"] >= 3, r["phases"]
    assert r["bitwise_equal"] and r["hyps_equal"] and not r["orphans"]


@pytest.mark.slow
def test_translate_survives_10000_fuzzed_lines(tmp_path):
    corpus, run_dir = write_toy_corpus(tmp_path / "corpus"), tmp_path / "run"
    assert run(train_args(corpus, run_dir)).returncode == 0
    r = fuzz(str(run_dir), 10_000, seed=0)
    assert r["rc"] == 0, r["stderr_tail"]
    assert r["lines_out"] == r["lines_in"] == 10_000


@pytest.fixture(scope="module")
def toy_translator(tmp_path_factory):
    """An untrained tiny model (its outputs are random tokens, which also fuzzes detokenization) and a toy BPE."""
    corpus = write_toy_corpus(tmp_path_factory.mktemp("corpus"))
    texts = (corpus / "train.xx").read_text().splitlines() + ["ü é ß 猫 😀"]
    ds = datasets.Dataset.from_dict({"src": texts, "tgt": texts})
    vocabs = build_vocabs(
        TokenizerConfig(vocab_size=80, min_frequency=1), TextPairs.of_table(ds), tmp_path_factory.mktemp("tok")
    )
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(max_positions=64), len(vocabs.src), len(vocabs.tgt)).eval()
    return model, vocabs


LINE = st.text(st.characters(exclude_characters="\n", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=25, deadline=None)
@given(lines=st.lists(LINE | st.just("x" * 3000) | st.sampled_from(["", " ", "\r", "a\u2028b", "c\x85d"]), max_size=6))
def test_any_text_gives_one_output_line_per_input_line(toy_translator, lines):
    model, vocabs = toy_translator
    raw = "".join(line + "\n" for line in lines).encode("utf-8")
    read = split_lines(raw, "stdin")
    assert len(read) == len(lines)
    cfg = DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=6)
    translator = Translator(model, vocabs, cfg, torch.device("cpu"), None, {})
    _, hyps = translator.hypotheses(read)
    texts = vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
    out = "".join(line + "\n" for line in output_lines(hyps, texts, vocabs, 1))
    assert out.count("\n") == len(lines)
    assert all(texts[i] == "" for i, line in enumerate(read) if not line)  # empty in, empty out
    scored = translator.translate(read, scores=True)  # a score and flags for every line, whatever its text
    assert len(scored) == len(lines) and all(math.isfinite(r["score"]) and r["score"] <= 0 for r in scored)
    assert all(scored[i] == {"text": "", "score": 0.0, "flags": []} for i, line in enumerate(read) if not line)


def test_bytes_that_are_not_utf8_are_named_or_replaced(caplog):
    from mt.errors import DataError

    with pytest.raises(DataError, match=r"stdin:2: bytes that are not UTF-8 .* input_errors=replace"):
        split_lines(b"fine\nbad \xff\xfe here\n", "stdin")
    assert split_lines(b"fine\nbad \xff here\n", "stdin", errors="replace") == ["fine", "bad \ufffd here"]
    assert "1 lines had bytes that are not UTF-8" in caplog.text


def test_input_chunks_cut_lines_like_the_whole_input_and_name_the_right_line(tmp_path):
    from mt.decode.lines import input_chunks
    from mt.errors import DataError

    raw = "a\n\nb\u2028c\r\nd\n e \nf".encode()
    (tmp_path / "in.txt").write_bytes(raw)
    chunks = list(input_chunks(str(tmp_path / "in.txt"), "strict", 2))
    assert [len(c) for c in chunks] == [2, 2, 2] and sum(chunks, []) == split_lines(raw, "x")
    (tmp_path / "bad.txt").write_bytes(b"one\ntwo\nthree\nfo\xffur\n")
    with pytest.raises(DataError, match=r"bad.txt:4: bytes that are not UTF-8"):
        list(input_chunks(str(tmp_path / "bad.txt"), "strict", 2))
    with pytest.raises(DataError, match="no such file"):
        input_chunks(str(tmp_path / "missing.txt"), "strict", 2)  # at once, not when the first chunk is read


def test_streamed_translation_equals_the_whole_input_at_once(tmp_path):
    """translate.py reads, translates and writes `stream_lines` lines at a time: the same lines come out, n-best
    numbering runs on across chunks."""
    corpus, run_dir = write_toy_corpus(tmp_path / "corpus"), tmp_path / "run"
    assert run(train_args(corpus, run_dir)).returncode == 0
    text = "".join(line + "\n" for line in (corpus / "test.xx").read_text().splitlines()[:7]) + "\n"
    common = ["translate.py", f"checkpoint={run_dir}", "decode.beam_size=2", "decode.nbest=2"]
    streamed = run([*common, "stream_lines=3"], text)
    at_once = run([*common, "stream_lines=100"], text)
    assert streamed.returncode == at_once.returncode == 0, streamed.stderr[-2000:]
    assert streamed.stdout == at_once.stdout
    numbers = [int(line.split(b" ||| ")[0]) for line in streamed.stdout.splitlines()]
    assert numbers == [i for i in range(8) for _ in range(2)]
