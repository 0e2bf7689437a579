"""The Python API (`from mt import Translator`) and translate.py as people use them: prefixes from a file, sampling,
and answers as soon as a line is typed (through a pipe and a pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest
import torch

from mt.config import ConfigError, DecodeConfig
from mt.decode.batched import translate_ids
from tests import warm_start
from tests.conftest import ROOT

LINES = ["the cat sees a dog", "", "big red house and a tree", "a small dog runs"]


def test_translate_as_the_search_does(toy_run):
    from mt import Translator

    t = Translator.load(toy_run, device="cpu", beam_size=3, length_penalty=0.0)
    assert t.decode.beam_size == 3 and t.decode.max_tokens == 500  # the run's saved settings, then the overrides
    ids = t.vocabs.src.encode_batch(LINES)
    expected = translate_ids(t.model, ids, t.decode, torch.device("cpu"), None)
    assert t.translate(LINES) == t.vocabs.tgt.decode_batch([h[0].tokens for h in expected])
    nbest = t.translate(LINES, nbest=3)
    assert [len(x) for x in nbest] == [3, 3, 3, 3] and nbest[1] == [("", 0.0)] * 3
    assert all(isinstance(text, str) and a[1] >= b[1] for x in nbest if x[0][0] for (text, _), a, b in
               zip(x, x, x[1:]))  # fmt: skip
    samples = t.translate(LINES, sampling=True, seed=3, temperature=2.0, nbest=2)
    assert samples == t.translate(LINES, sampling=True, seed=3, temperature=2.0, nbest=2)
    forced = t.translate(LINES, prefix=["red house", "", "", "the"])
    assert forced[0].startswith("red house") and forced[3].startswith("the")


def test_score_is_the_models_log_probability_of_the_pair(toy_run):
    """Forced decoding of the greedy translation gives the log-probability the search reported for it."""
    from mt import Translator

    t = Translator.load(toy_run, device="cpu", beam_size=1, length_penalty=0.0)
    src = [line for line in LINES if line]
    hyps = translate_ids(t.model, t.vocabs.src.encode_batch(src), t.decode, torch.device("cpu"), None)
    tgt = t.vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
    assert t.vocabs.tgt.encode_batch(tgt) == [h[0].tokens for h in hyps]  # the text gives back the same ids
    assert t.score(src, tgt) == pytest.approx([h[0].logprob for h in hyps], abs=1e-4)


def test_bad_calls_are_one_line_errors(toy_run):
    from mt import Translator

    with pytest.raises(ConfigError, match="decode setting 'beam' is unknown"):
        Translator.load(toy_run, device="cpu", beam=4)
    t = Translator.load(toy_run, device="cpu")
    with pytest.raises(ConfigError, match="give a list of strings"):
        t.translate("the cat")
    with pytest.raises(ConfigError, match="decode.topp=2.0 is outside"):
        t.translate(LINES, sampling=True, topp=2.0)
    with pytest.raises(ConfigError, match="2 prefixes for 4 lines"):
        t.translate(LINES, prefix=["a", "b"])
    with pytest.raises(ConfigError, match="score: 4 source lines but 1 target lines"):
        t.score(LINES, ["x"])


def test_translate_file_streams_what_translate_gives(toy_run, tmp_path):
    from mt import Translator

    t = Translator.load(toy_run, device="cpu")
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in LINES * 3))
    assert t.translate_file(tmp_path / "in.txt", tmp_path / "out.txt", chunk_lines=5) == 12
    assert (tmp_path / "out.txt").read_text().splitlines() == t.translate(LINES * 3)


def test_the_entry_points_first_import_does_not_load_torch():
    code = "import sys, mt.cli; assert 'torch' not in sys.modules; from mt import Translator; print(Translator)"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "mt.decode.translator.Translator" in p.stdout, p.stderr[-1000:]


def test_translating_and_comparing_do_not_import_datasets():
    """`datasets` is a second and a half of a slow core's start-up that only reading corpora needs."""
    code = "import sys, translate, serve, mt.evaluate.compare; assert 'datasets' not in sys.modules, 'imported'"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-1000:]


# ------------------------------------------------------------------ translate.py


def translate(run, *args, input: str = "", timeout: int = 300) -> subprocess.CompletedProcess:
    """translate.py as a new process forked from a warm interpreter (tests/warm_start.py), its output as text."""
    starter = warm_start.shared({**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}, ROOT)
    return starter.run(["translate.py", f"checkpoint={run}", "device=cpu", *args], input, timeout, text=True)


def test_prefix_file(toy_run, tmp_path):
    prefixes = tmp_path / "prefix.txt"
    prefixes.write_text("red house\n\n\nthe\n")
    p = translate(toy_run, f"prefix={prefixes}", input="".join(line + "\n" for line in LINES))
    out = p.stdout.splitlines()
    assert p.returncode == 0 and len(out) == 4 and out[0].startswith("red house") and out[3].startswith("the")
    prefixes.write_text("red house\n\n")
    p = translate(toy_run, f"prefix={prefixes}", input="".join(line + "\n" for line in LINES))
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1] == (
        f"error: prefix={prefixes}: has 2 lines but the input has more (line 3); give one prefix per input line"
    )
    prefixes.write_text("the " * 40 + "\n")
    p = translate(toy_run, f"prefix={prefixes}", input="the cat\n")
    assert p.returncode == 2 and f"error: prefix={prefixes}:1: the prefix has 40 tokens" in p.stderr


def test_sampling_from_the_command_line(toy_run):
    src = "".join(line + "\n" for line in LINES)
    a = translate(toy_run, "decode=sample", "decode.seed=7", "decode.nbest=2", input=src)
    b = translate(toy_run, "decode=sample", "decode.seed=7", "decode.nbest=2", "decode.max_tokens=5", input=src)
    assert a.returncode == 0 and a.stdout == b.stdout and len(a.stdout.splitlines()) == 8
    bad = translate(toy_run, "decode=sample", "decode.beam_size=4", input=src)
    assert bad.returncode == 2 and "decode.sampling=true draws each token" in bad.stderr


def read_line(fd: int, timeout: float) -> tuple[str, float]:
    """The next line written to `fd`, and the seconds it took; fails the test after `timeout` seconds."""
    start, got = time.perf_counter(), b""
    while not got.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout - (time.perf_counter() - start)))
        if not ready:
            pytest.fail(f"no translation within {timeout} s (got {got!r})")
        got += os.read(fd, 1)
    return got.decode().rstrip("\r\n"), time.perf_counter() - start


def test_a_line_is_answered_as_soon_as_it_is_written_to_a_pipe(toy_run):
    """A program writes a line and waits for its translation, five times (before: nothing until end of input)."""
    p = subprocess.Popen([sys.executable, "translate.py", f"checkpoint={toy_run}", "device=cpu"], cwd=ROOT,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        waits = []
        for i, line in enumerate(["the cat", "a dog runs", "big house", "the red tree", "a cat sees a dog"]):
            p.stdin.write((line + "\n").encode())
            p.stdin.flush()
            _, seconds = read_line(p.stdout.fileno(), 120 if i == 0 else 10)  # the first waits for the model to load
            waits.append(seconds)
        p.stdin.close()
        assert p.wait(timeout=60) == 0
        print("seconds from a line written to its translation read:", [round(w, 3) for w in waits])
    finally:
        p.kill()


def test_a_line_typed_at_a_terminal_is_answered_at_once(toy_run):
    parent, child = pty.openpty()
    p = subprocess.Popen([sys.executable, "translate.py", f"checkpoint={toy_run}", "device=cpu"], cwd=ROOT,
                         stdin=child, stdout=child, stderr=subprocess.DEVNULL)  # fmt: skip
    os.close(child)
    try:
        waits = []
        for i, line in enumerate(["the cat", "a dog runs", "big house", "the red tree", "a cat sees a dog"]):
            os.write(parent, (line + "\n").encode())
            echo, _ = read_line(parent, 120 if i == 0 else 10)  # the terminal echoes what is typed
            assert echo == line
            translation, seconds = read_line(parent, 120 if i == 0 else 10)
            assert translation != line
            waits.append(seconds)
        os.write(parent, b"\x04")  # Ctrl-D
        assert p.wait(timeout=60) == 0
        print("seconds from a line typed to its translation shown:", [round(w, 3) for w in waits])
    finally:
        p.kill()
        os.close(parent)


def test_the_decode_sample_group_composes():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from mt.config import register_configs

    register_configs()

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("translate", overrides=["checkpoint=x", "decode=sample"])
    decode = DecodeConfig(**OmegaConf.to_container(cfg.decode))
    assert decode.sampling and decode.beam_size == 1 and decode.topk == 0 and decode.temperature == 1.0


def test_ensembles_and_ctranslate2_exports_sample_and_take_prefixes(toy_run, tmp_path):
    """The same engine over an ensemble (mean log-probabilities) and a CTranslate2 export (its own sampler and
    target_prefix): prefixes start the translations, with sampling too; the ensemble's samples repeat with the
    seed; CTranslate2's scores are the model's log-probabilities."""
    pytest.importorskip("ctranslate2")
    from mt import Translator
    from mt.export.formats import export_ctranslate2

    ensemble = Translator.load([toy_run, toy_run], device="cpu", beam_size=2)
    single = Translator.load(toy_run, device="cpu", beam_size=2)
    assert ensemble.translate(LINES) == single.translate(LINES)  # two copies of one model: that model
    ct2 = Translator.load(export_ctranslate2(str(toy_run), tmp_path / "ct2"), device="cpu", beam_size=2,
                          length_penalty=0.0)  # fmt: skip
    for t in (ensemble, ct2):
        forced = t.translate(LINES, prefix=["red house", "", "", "the"])
        assert forced[0].startswith("red house") and forced[3].startswith("the")
        drawn = t.translate(LINES, sampling=True, seed=5, temperature=1.5, nbest=2, prefix=["the", "", "", ""])
        assert [len(x) for x in drawn] == [2, 2, 2, 2] and all(text.startswith("the") for text, _ in drawn[0])
        if t is ensemble:  # CTranslate2's set_random_seed does not reach its worker threads (its issue 1757)
            assert drawn == t.translate(LINES, sampling=True, seed=5, temperature=1.5, nbest=2,
                                        prefix=["the", "", "", ""])  # fmt: skip
    src, tgt = ["the cat sees a dog"], single.translate(["the cat sees a dog"])
    assert ct2.score(src, tgt) == pytest.approx(single.score(src, tgt), abs=1e-3)


# ------------------------------------------------------------------ review findings (issue 43)


def test_sampling_at_load_or_per_file_draws_with_beam_1(toy_run, tmp_path):
    """Before: Translator.load(run, sampling=True) and translate_file(..., sampling=True) failed with 'needs
    decode.beam_size=1' (the run's beam was kept) where translate(sampling=True) set beam 1."""
    from mt import Translator
    from mt.model import saved

    ckpt = saved.load(toy_run)
    ckpt["config"]["decode"]["beam_size"] = 4  # a run that decodes with beam 4, as the recipes do (5)
    torch.save({k: v for k, v in ckpt.items() if k != "path"}, tmp_path / "beam4.pt")
    sampler = Translator.load(tmp_path / "beam4.pt", device="cpu", sampling=True, seed=3)
    assert sampler.decode.beam_size == 1 and sampler.decode.sampling
    t = Translator.load(tmp_path / "beam4.pt", device="cpu")
    assert t.decode.beam_size == 4 and sampler.translate(LINES) == t.translate(LINES, sampling=True, seed=3)
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in LINES))
    assert t.translate_file(tmp_path / "in.txt", tmp_path / "out.txt", sampling=True, seed=3) == len(LINES)
    assert (tmp_path / "out.txt").read_text().splitlines() == sampler.translate(LINES)


def test_score_and_translate_file_take_the_target_language(multilingual_run, tmp_path):
    from mt import Translator

    run = multilingual_run[0]
    t = Translator.load(run, device="cpu", beam_size=1)
    src = ["the cat sees a dog", "a big red house"]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in src))
    t.translate_file(tmp_path / "in.txt", tmp_path / "zz.txt", tgt_lang="zz")
    zz = t.translate(src, tgt_lang="zz")
    assert (tmp_path / "zz.txt").read_text().splitlines() == zz
    as_yy, as_zz = t.score(src, zz, tgt_lang="yy"), t.score(src, zz, tgt_lang="zz")
    assert as_zz != as_yy and sum(as_zz) > sum(as_yy)  # the zz translations are likelier as zz
    with pytest.raises(ConfigError, match="tgt_lang is needed"):
        t.translate_file(tmp_path / "in.txt", tmp_path / "none.txt")
    assert not (tmp_path / "none.txt").exists()


def test_references_of_a_split_are_read_in_the_target_language(multilingual_run, tmp_path):
    """Before: translate.py references=SPLIT read the run's main target language whatever tgt_lang said, so a
    multilingual model's zz output was scored against yy references without an error."""
    import json

    import sacrebleu

    run, trainer, _ = multilingual_run
    corpus = __import__("pathlib").Path(trainer.cfg.data.dir)
    src = (corpus / "test.xx").read_text()
    p = translate(run, "tgt_lang=zz", "references=test", f"output={tmp_path / 'out.zz'}", input=src)
    assert p.returncode == 0, p.stderr[-2000:]
    hyps, refs = (tmp_path / "out.zz").read_text().splitlines(), (corpus / "test.zz").read_text().splitlines()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=0.01)


def test_a_streamed_prefix_run_answers_each_line_before_the_next_arrives(toy_run, tmp_path, caplog):
    """Before: with prefix=FILE each chunk's output was held until the next line arrived, so a co-process writing a
    line and waiting for it deadlocked; truncation warnings numbered lines within their chunk."""
    import io

    from mt import Translator
    from mt.decode.lines import AlignedFile

    t = Translator.load(toy_run, device="cpu")
    (tmp_path / "prefix.txt").write_text("red house\n\nthe\n")
    long = " ".join(["cat"] * (t.limit + 5))
    out = io.StringIO()
    answered = []

    def chunks():
        yield ["the cat sees a dog"]
        answered.append(out.getvalue().count("\n"))  # what the reader had when the next line came
        yield [long]
        answered.append(out.getvalue().count("\n"))
        yield ["a small tree"]

    with caplog.at_level("WARNING"):
        t.translate_stream(chunks(), out, prefixes=AlignedFile(str(tmp_path / "prefix.txt")))
    assert answered == [1, 2] and out.getvalue().splitlines()[0].startswith("red house")
    assert f"line 2: {t.limit + 5} tokens, truncated" in caplog.text


def test_a_line_over_the_positions_is_translated_whole_in_pieces(toy_run, caplog):
    """Before: only its first `limit` tokens were translated (a warning said so). Now all of it, in pieces cut at
    clause boundaries, one output line; with an n-best list (which belongs to the whole line) it is truncated."""
    import io

    from mt import Translator

    t = Translator.load(toy_run, device="cpu")
    first, second = " ".join(["the cat sees a dog"] * (t.limit // 5)), "a big red house"
    long = f"{first}, {second}"
    assert len(t.vocabs.src.encode(long)) > t.limit >= len(t.vocabs.src.encode(first + ","))
    with caplog.at_level("WARNING"):
        (whole,) = t.translate([long])
    assert whole == " ".join(t.translate([first + ",", second]))
    assert "line 1: a sentence of" in caplog.text and "translated in 2 pieces" in caplog.text
    out = io.StringIO()
    t.translate_stream(iter([["a dog", long]]), out)
    assert out.getvalue().splitlines() == t.translate(["a dog", long])  # the same batch as the stream's chunk
    caplog.clear()
    with caplog.at_level("WARNING"):
        t.translate([long], nbest=2, beam_size=2)
    assert f"line 1: {len(t.vocabs.src.encode(long))} tokens, truncated" in caplog.text
