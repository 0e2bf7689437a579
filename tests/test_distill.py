"""`+experiment=distill` (mt/train/distill.py, mt/decode/teacher.py, mt/train/distill_report.py): the teacher's
translations as the student's corpus, resumable and cached; the plan within the budget; the teacher beside the
student at the end. Tiny models: a toy run of this project's and the tiny OPUS-MT- and NLLB-shaped checkpoints of
tests/hub_models.py."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mt.config import DistillConfig
from mt.decode.teacher import Progress, TeacherText
from mt.decode.translator import Translator
from mt.errors import DataError
from mt.train import distill
from tests.conftest import ROOT, write_toy_corpus
from tests.hub_models import DATA, hub_model
from tests.test_training import make_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def train(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=ENV)  # fmt: skip
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def student_args(corpus: Path, teacher, run_dir: Path, cache: Path, src="xx", tgt="yy", *extra) -> list[str]:
    return ["+experiment=distill", f"distill.teacher={teacher}", "data=local", f"data.dir={corpus}",
            f"data.src_lang={src}", f"data.tgt_lang={tgt}", f"data.cache_dir={cache / 'data'}",
            f"distill.cache_dir={cache / 'teacher'}", "distill.chunk_lines=64", "model=transformer_tiny",
            "tokenizer.vocab_size=80", "tokenizer.min_frequency=1", "train.max_updates=12", "train.valid_every=6",
            "train.valid_bleu=false", "train.progress=false", "train.device=cpu", "train.tensorboard=false",
            "train.average_last=0", "train.cooldown=0", "decode=greedy", f"run_dir={run_dir}", *extra]  # fmt: skip


def chunked(translator: Translator, lines: list[str], chunk: int) -> list[str]:
    """The teacher's translations of `lines` as stage 1 makes them: `chunk` lines a call, its own settings."""
    out = []
    for at in range(0, len(lines), chunk):
        out += translator.texts(lines[at : at + chunk], translator.decode)[0]
    return [" ".join(t.split("\n")).strip() for t in out]


@pytest.fixture(scope="module")
def distilled(toy_run, tmp_path_factory):
    """(corpus, cache root, run dir, stderr) of a student of the toy run, trained by train.py end to end."""
    root = tmp_path_factory.mktemp("distill")
    corpus = write_toy_corpus(root / "corpus")  # the toy run's corpus (seeded)
    p = train(student_args(corpus, toy_run, root / "student", root / "cache"))
    return corpus, root / "cache", root / "student", p.stderr


def test_the_student_learns_from_the_teachers_translations_and_the_report_puts_them_side_by_side(toy_run, distilled):
    corpus, cache, run_dir, log = distilled
    (folder,) = (cache / "teacher").iterdir()
    teacher = Translator.load(toy_run)
    sources = (corpus / "train.xx").read_text().splitlines()
    assert (folder / "train.xx").read_text().splitlines() == [s.strip() for s in sources]
    assert (folder / "train.yy").read_text().splitlines() == chunked(teacher, sources, 64)
    assert json.loads((folder / "progress.json").read_text())["complete"]
    record = json.loads((run_dir / "distill.json").read_text())
    assert record["texts"] == [{"text": "the training sources", "cache": str(folder), "lines": 200, "total": 200}]
    # stage 2: the original pairs and the teacher's, one BPE over both
    assert "the student trains on local + teacher0" in log
    assert "tokenizer: trained BPE on" in log
    assert re.search(
        r"distill plan: the student \(model=transformer_tiny, 0.0M parameters, untrained\) decodes "
        r"[\d.]+x the teacher's sentences/s here \(64 training sources, beam 4, \d+ tokens each\)",
        log,
    )
    assert record["student_speedup"]["ratio"] > 0
    # stage 3: the teacher's translations of the test split are translate.py's, scored beside the student's
    test_sources = (corpus / "test.xx").read_text().splitlines()
    assert (run_dir / "test.teacher.hyp").read_text().splitlines() == teacher.translate(test_sources)
    report = json.loads((run_dir / "test.report.json").read_text())
    alone = json.loads((run_dir / "test.teacher.report.json").read_text())
    assert report["teacher"]["bleu"] == alone["bleu"] and report["student"]["bleu"] == report["bleu"]
    for who in ("teacher", "student"):
        assert report[who]["sentences_per_s"] > 0 and report[who]["size_mb"] > 0
        assert report[who]["ct2_int8_sentences_per_s"] > 0 and report[who]["ct2_int8_size_mb"] > 0
    d = report["distill"]
    assert 0 < d["p_bleu_lowercase"] <= 1 and d["speedup"] > 0 and "beam 4" in d["timed_on"]
    assert d["delta_bleu"] == pytest.approx(report["bleu"] - alone["bleu"], abs=0.02)
    assert "Distillation: teacher and student" in (run_dir / "test.report.md").read_text()
    assert "test: teacher lowercased BLEU" in log and "size on disk: teacher" in log


def test_a_second_student_of_the_same_teacher_starts_at_stage_2(toy_run, distilled, tmp_path):
    corpus, cache, _, _ = distilled
    (folder,) = (cache / "teacher").iterdir()
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.*[!k]")}  # not .lock
    p = train(student_args(corpus, toy_run, tmp_path / "second", cache, "xx", "yy", "train.max_updates=2",
                           "distill.test_teacher=false", "model.encoder_layers=1"))  # fmt: skip
    assert "teacher: 200 / 200 lines" not in p.stderr and "200 of 200 lines translated" in p.stderr
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("*.*[!k]")} == before and len(before) == 4
    assert not (tmp_path / "second" / "test.teacher.hyp").exists()


def test_translate_only_fills_the_cache_and_trains_no_student(toy_run, distilled, tmp_path):
    """distill.translate_only=true: stage 1 alone (to translate on one machine and train on another); its
    translations are the bytes a whole run caches, and no student is trained."""
    corpus, cache, _, _ = distilled
    (whole,) = (cache / "teacher").iterdir()
    alone = ["distill.translate_only=true", "train.max_updates=0", "train.max_time=0", "train.cooldown=0.2"]
    p = train(student_args(corpus, toy_run, tmp_path / "run", tmp_path, "xx", "yy", *alone))  # no budget: all of it
    assert "distill.translate_only: the teacher's translations are in" in p.stderr
    (folder,) = (tmp_path / "teacher").iterdir()
    for name in ("train.xx", "train.yy"):
        assert (folder / name).read_bytes() == (whole / name).read_bytes()
    assert not list((tmp_path / "run").glob("checkpoint*")) and "untrained) decodes" not in p.stderr
    assert "the student trains on" not in p.stderr


def test_teacher_decode_sets_stage_1s_search_and_keys_its_cache(toy_run, distilled, tmp_path):
    """+distill.teacher_decode.beam_size=3: the teacher searches with beam 3 (as translate.py with beam_size=3 does),
    not with its own settings (greedy), into a cache keyed apart, and the record says so."""
    corpus, cache, _, _ = distilled
    (own,) = (cache / "teacher").iterdir()
    beam = ["+distill.teacher_decode.beam_size=3", "distill.translate_only=true", "train.max_updates=0",
              "train.max_time=0"]  # fmt: skip
    train(student_args(corpus, toy_run, tmp_path / "run", tmp_path, "xx", "yy", *beam))
    (folder,) = (tmp_path / "teacher").iterdir()
    assert folder.name != own.name
    assert json.loads((tmp_path / "run" / "distill.json").read_text())["decode"]["beam_size"] == 3
    assert json.loads((own / "key.json").read_text())["decode"]["beam_size"] == 1
    sources = (folder / "train.xx").read_text().splitlines()
    assert (folder / "train.xx").read_bytes() == (own / "train.xx").read_bytes()
    assert (folder / "train.yy").read_text().splitlines() == chunked(Translator.load(str(toy_run), beam_size=3),
                                                                     sources, 64)  # fmt: skip


def test_stage_2_stopped_and_resumed_ends_where_the_uninterrupted_run_does(toy_run, distilled, tmp_path):
    """A student stopped at update 6 and started again with the same teacher: stage 1 is not redone (its record is
    kept), and training ends bitwise where the student of `distilled` (12 updates in one go) ended."""
    from mt.model import saved

    corpus, cache, straight, _ = distilled
    args = student_args(corpus, toy_run, tmp_path / "run", cache, "xx", "yy", "distill.test_teacher=false")
    train([*args, "train.max_updates=6"])
    record = (tmp_path / "run" / "distill.json").read_text()
    p = train([*args, "train.max_updates=12"])
    assert "resumed from" in p.stderr and "distill plan" not in p.stderr
    assert (tmp_path / "run" / "distill.json").read_text() == record
    a, b = saved.load(straight / "checkpoint_last.pt"), saved.load(tmp_path / "run" / "checkpoint_last.pt")
    assert a["update"] == b["update"] == 12
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


KILLED = """
import sys, time
from pathlib import Path
from mt.decode.teacher import TeacherText
from mt.decode.translator import Translator
teacher, out, lines = Translator.load(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]).read_text().splitlines()
slow = lambda chunk: (time.sleep(float(sys.argv[4])), teacher.texts(chunk, teacher.decode)[0])[1]
TeacherText(out, "d", {}, "xx", "yy").fill(slow, lambda: iter(lines), len(lines), len(lines), 16)
"""


def test_stage_1_killed_with_sigkill_resumes_to_the_same_bytes(toy_run, tmp_path):
    """kill -9 in the middle of the teacher's translating: the run started again writes what an uninterrupted run
    writes, byte for byte, with no line lost or repeated."""
    text = tmp_path / "text.xx"
    lines = [" ".join(line.split()[::-1]) + " " + line for line in
             (write_toy_corpus(tmp_path / "c") / "train.xx").read_text().splitlines()]  # fmt: skip
    text.write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-c", KILLED, str(toy_run), str(tmp_path / "killed"), str(text)]
    child = subprocess.Popen([*cmd, "0.3"], cwd=ROOT, env=ENV, stderr=subprocess.DEVNULL)
    progress = tmp_path / "killed" / "d" / "progress.json"
    deadline = time.time() + 120
    while time.time() < deadline and not (progress.is_file() and json.loads(progress.read_text())["lines"] >= 48):
        time.sleep(0.05)
    time.sleep(0.15)  # into the middle of a chunk
    child.send_signal(signal.SIGKILL)
    child.wait()
    done = json.loads(progress.read_text())["lines"]
    assert 48 <= done < len(lines)
    subprocess.run([*cmd, "0"], cwd=ROOT, env=ENV, check=True, capture_output=True)
    subprocess.run([sys.executable, "-c", KILLED, str(toy_run), str(tmp_path / "straight"), str(text), "0"], cwd=ROOT,
                   env=ENV, check=True, capture_output=True)  # fmt: skip
    for name in ("train.xx", "train.yy"):
        assert (tmp_path / "killed" / "d" / name).read_bytes() == (tmp_path / "straight" / "d" / name).read_bytes()
    assert len((tmp_path / "killed" / "d" / "train.yy").read_text().splitlines()) == len(lines)


def test_a_chunk_written_after_the_last_record_is_cut_off(tmp_path):
    """A stop between writing a chunk and recording it (the files longer than progress.json says): the resumed run
    cuts the files back and writes that chunk again, once."""
    lines = [f"line {i}" for i in range(10)]
    upper = lambda chunk: [s.upper() for s in chunk]  # noqa: E731
    cache = TeacherText(tmp_path, "d", {}, "xx", "yy")
    assert cache.fill(upper, lambda: iter(lines), 4, 10, chunk_lines=4) == Progress(4, 28, 28, pytest.approx(0, abs=1))
    with open(cache.src_path, "a") as f, open(cache.tgt_path, "a") as g:
        f.write("line 4\nline")
        g.write("LINE 4\n")
    done = cache.fill(upper, lambda: iter(lines), 10, 10, chunk_lines=4)
    assert done.complete and done.lines == 10
    assert cache.src_path.read_text().splitlines() == lines
    assert cache.tgt_path.read_text().splitlines() == [s.upper() for s in lines]


def test_the_plan_cuts_extra_text_to_the_teachers_share_and_keeps_what_was_done(tmp_path, caplog):
    cfg = make_config(tmp_path, tmp_path / "run", max_time=10.0)
    cfg = replace(cfg, distill=DistillConfig(enabled=True, teacher="x", teacher_share=0.5))
    caches = [TeacherText(tmp_path, name, {}, "xx", "yy") for name in ("train", "extra")]
    texts = [("the training sources", "", None, 1000), ("distill.source_text=more.txt", "", None, 100_000)]
    # 5 minutes of share at 100 lines/s: 1,000 training sources (10 s), then 29,000 lines of the text
    wanted = distill.plan(cfg, texts, caches, 100.0, time.time(), resuming=False)
    assert wanted[0] == 1000 and 28_900 <= wanted[1] <= 29_000
    assert "of its 100,000 lines fit the teacher's share" in caplog.text
    with pytest.raises(Exception, match=r"give train.max_time=(\d+) or more"):
        distill.plan(cfg, [("the training sources", "", None, 40_000)], caches[:1], 100.0, time.time(), False)
    with pytest.raises(DataError, match="incomplete but this run has started training"):
        distill.plan(cfg, texts, caches, 100.0, time.time(), resuming=True)
    # stage 1 alone (distill.translate_only): no student, so the teacher has the whole budget
    alone = replace(cfg, distill=replace(cfg.distill, translate_only=True))
    caplog.clear()
    wanted = distill.plan(alone, texts, caches, 100.0, time.time(), resuming=False)
    assert wanted[0] == 1000 and 58_900 <= wanted[1] <= 59_000
    assert "its share is 10.0 min" in caplog.text and "the student trains" not in caplog.text
    with pytest.raises(Exception, match=r"over its share \(train.max_time=10\); give train.max_time=12 or more"):
        distill.plan(alone, [("the training sources", "", None, 70_000)], caches[:1], 100.0, time.time(), False)


def test_teacher_and_student_are_timed_in_turn_and_a_busy_round_does_not_count(monkeypatch):
    """Stage 3's speed: warmed up, then timed in turn (teacher, student, teacher, student), each its faster round."""
    from mt.train import distill_report

    calls, clock = [], [0.0]
    seconds = {("teacher", 1): 4.0, ("student", 1): 1.0, ("teacher", 2): 2.0, ("student", 2): 1.0}

    class Fake:
        def __init__(self, name):
            self.name = name

        def settings(self, **kw):
            return kw

        def texts(self, lines, decode):
            assert decode == {"beam_size": 4, "nbest": 1}
            calls.append((self.name, len(lines)))
            if len(lines) > 8:  # a timed round (the warm-up is 8 lines): the first teacher round a busy one
                clock[0] += seconds[(self.name, sum(1 for n, k in calls if n == self.name and k > 8))]

    monkeypatch.setattr(distill_report.time, "perf_counter", lambda: clock[0])
    rates = distill_report.sentences_per_s({"teacher": Fake("teacher"), "student": Fake("student")}, ["x"] * 100)
    assert calls == [("teacher", 8), ("student", 8)] + [("teacher", 100), ("student", 100)] * 2
    assert rates == {"teacher": 50.0, "student": 100.0}


def opus_corpus(out: Path, n: int = 120) -> Path:
    """The first lines of the OPUS EMEA de-en sample as train/valid/test, the tiny hub models' domain."""
    out.mkdir(parents=True)
    for lang in ("de", "en"):
        with gzip.open(DATA / "opus_emea_de_en" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = [line.rstrip("\n") for _, line in zip(range(n + 40), f)]
        for split, part in (("train", lines[:n]), ("valid", lines[n : n + 20]), ("test", lines[n + 20 :])):
            (out / f"{split}.{lang}").write_text("\n".join(part) + "\n")
    return out


@pytest.mark.parametrize("name", ["marian_shared", "nllb"])
def test_a_transformers_teacher_runs_the_whole_command_and_translates_as_generate(name, tmp_path):
    """The tiny OPUS-MT- and NLLB-shaped checkpoints as teachers of a De->En student: stage 1's translations are
    transformers' `generate()` output with the checkpoint's settings (NLLB: its codes from the corpus's de/en)."""
    from tests.test_hub_import import hf_texts

    path = hub_model(name)
    corpus = opus_corpus(tmp_path / "corpus")
    extra = ["distill.test_teacher=false"] if name == "nllb" else []
    train(student_args(corpus, path, tmp_path / "run", tmp_path / "cache", "de", "en", "train.max_updates=3", *extra))
    (folder,) = (tmp_path / "cache" / "teacher").iterdir()
    sources = (corpus / "train.de").read_text().splitlines()
    beams = Translator.load(path, src_lang="de", tgt_lang="en").decode.beam_size
    assert (folder / "train.en").read_text().splitlines() == [t.strip() for t in hf_texts(path, name, sources, beams)]
    if not extra:
        assert json.loads((tmp_path / "run" / "test.report.json").read_text())["teacher"]["ct2_int8_size_mb"] > 0


def test_the_students_shape_is_the_largest_at_the_wanted_speed():
    """choose_student: the first shape (largest first) at distill.min_speedup or more; none: the fastest, warned."""
    from mt.train.distill_probe import SpeedProbe, choose_student

    probes = {name: SpeedProbe(ratio, 10, 64, 1) for name, ratio in (("big", 3.0), ("mid", 6.0), ("small", 9.0))}
    assert choose_student(probes, 5.0)[0] == "mid"
    name, why = choose_student(probes, 10.0)
    assert name == "small" and why.startswith("WARNING: no shape reaches 10x")


def test_the_plan_times_each_shape_against_the_teacher_and_the_command_line_wins(toy_run, caplog):
    from mt.train.distill_probe import STUDENT_SHAPES

    teacher = Translator.load(toy_run, device="cpu")
    lines = lambda: iter(["the cat sees a dog", "a big red house and a tree"] * 40)  # noqa: E731
    cfg = make_config(Path("."), Path("."))
    with caplog.at_level("INFO", logger="mt.train.distill"):
        probe = distill.check_speed(cfg, teacher, lines, given=set())
    assert cfg.model.name in STUDENT_SHAPES and probe.ratio > 0
    assert cfg.model.d_model == STUDENT_SHAPES[cfg.model.name]["d_model"]
    assert all(f"model={name}" in caplog.text for name in STUDENT_SHAPES)
    assert "the student's shape: " + cfg.model.name in caplog.text
    mine = make_config(Path("."), Path("."))
    before = mine.model
    distill.check_speed(mine, teacher, lines, given={"model.d_model"})
    assert mine.model == before
