"""What a user meets in the first hour on their own corpus: a missing test split, a run that did not finish, a
file in another encoding, the licence. (The one-line errors are rows of tests/test_bad_inputs.py.)"""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
import tomllib

import pytest
import torch

from mt.data.files import read_lines
from mt.errors import DataError
from mt.model.saved import FORMAT_VERSION, load
from tests.conftest import ROOT, write_toy_corpus


def test_a_corpus_without_test_files_trains_and_says_so_before_training(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus")
    for lang in ("xx", "yy"):
        (corpus / f"test.{lang}").unlink()
    args = ["train.py", "data=local", f"data.dir={corpus}", "data.src_lang=xx", "data.tgt_lang=yy",
            "model=transformer_tiny", "tokenizer.vocab_size=60", "tokenizer.min_frequency=1", "train.max_epochs=1",
            "train.max_tokens=300", "train.progress=false", "train.device=cpu", "train.tensorboard=false",
            "decode=greedy", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stderr.splitlines()
    warned = next(i for i, line in enumerate(lines) if "test split 'test' is left out" in line)
    assert warned < next(i for i, line in enumerate(lines) if "data: local" in line)  # before the corpus is read
    assert (tmp_path / "run" / "checkpoint_final.pt").is_file()
    assert not list((tmp_path / "run").glob("test*.report.json"))
    # the closing line's example is a sentence of the source language (the first training source), not English
    first = (corpus / "train.xx").read_text().splitlines()[0]
    assert lines[-1].endswith(f"translate with it: echo {shlex.quote(first)} | python translate.py "
                              f"checkpoint={tmp_path / 'run'}")  # fmt: skip


def test_a_run_fine_tuned_from_nllb_translates_into_its_own_target_language():
    """A multilingual model (NLLB) that a run fine-tuned De->En translates into English with no tgt_lang given,
    as its source is the run's data.src_lang; the model itself, without a run's languages, still asks for one."""
    from mt.config import ConfigError
    from mt.decode.translator import Translator, decode_settings
    from tests.hub_models import hub_model

    ckpt = load(hub_model("nllb"))
    ckpt["config"]["data"] = {}  # (its tokenizer_config.json names a pair: left out here)
    with pytest.raises(ConfigError, match="tgt_lang is needed"):
        Translator.open([ckpt], decode_settings({}, {}), torch.device("cpu"), "fp32", src_lang="de").target_id()
    ckpt["config"] = {**(ckpt.get("config") or {}), "data": {"src_lang": "de", "tgt_lang": "en"}}
    settings = decode_settings({}, {})
    translator = Translator.open([ckpt], settings, torch.device("cpu"), "fp32")
    assert translator.tgt_lang == "en"
    # the same model and decoding settings, its languages given: the same output (not the checkpoint's own
    # generation settings, whose search differs and may pick another output of a random tiny model)
    given = Translator.open([load(hub_model("nllb"))], settings, torch.device("cpu"), "fp32", src_lang="de",
                            tgt_lang="en")  # fmt: skip
    assert translator.translate(["Eine Tablette am Tag."]) == given.translate(["Eine Tablette am Tag."])


def test_a_run_dir_with_only_its_last_checkpoint_is_used_with_a_warning(tmp_path, caplog):
    torch.save({"format": FORMAT_VERSION, "model": {}, "update": 7}, tmp_path / "checkpoint_last.pt")
    with caplog.at_level(logging.WARNING):
        ckpt = load(tmp_path)
    assert ckpt["path"].endswith("checkpoint_last.pt")
    assert "the run did not finish" in caplog.text and "update 7" in caplog.text
    caplog.clear()
    load(tmp_path / "checkpoint_last.pt")  # named by the user: no warning
    assert "did not finish" not in caplog.text


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_utf16_is_named_with_the_iconv_that_fixes_it(tmp_path, encoding):
    path = tmp_path / "train.de"
    text = "Die Tablette ist rund.\nZweite Zeile.\n"
    path.write_bytes(("\ufeff" if encoding == "utf-16-be" else "").encode(encoding) + text.encode(encoding))
    with pytest.raises(DataError, match="iconv -f utf-16 -t utf-8"):
        list(read_lines(path))


def test_utf16_without_its_mark_is_not_called_latin1(tmp_path):
    path = tmp_path / "train.de"
    path.write_bytes("Größe\n".encode("utf-16-le"))
    with pytest.raises(DataError, match="iconv -f utf-16"):
        list(read_lines(path))


def test_the_project_names_its_licence():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]


def test_auto_dry_run_plans_and_trains_nothing(tmp_path):
    """`auto.dry_run=true`: the checks, the plan logged and auto.json written, exit 0, no checkpoint; the same
    command without it then trains with that plan."""
    from tests.test_distill import opus_corpus

    corpus = opus_corpus(tmp_path / "corpus", 1200)
    run_dir = tmp_path / "run"
    args = ["train.py", "+experiment=auto", "auto.probe=false", "data=local", f"data.dir={corpus}",
            "data.src_lang=de", "data.tgt_lang=en", "train.max_updates=3", "train.progress=false", "train.device=cpu",
            f"data.cache_dir={tmp_path / 'cache'}", f"run_dir={run_dir}"]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, *args, "auto.dry_run=true"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "auto.dry_run: the plan is above" in p.stderr and "plan:" in p.stderr
    assert (run_dir / "auto.json").is_file() and not list(run_dir.glob("checkpoint*.pt"))
    assert "training stopped" not in p.stderr


def tmx(pairs: list[tuple[str, str]], langs=("en-GB", "DE-de")) -> str:
    units = "".join(f'<tu><tuv xml:lang="{langs[0]}"><seg>{a}</seg></tuv><tuv xml:lang="{langs[1]}"><seg>{b}</seg>'
                    "</tuv></tu>\n" for a, b in pairs)  # fmt: skip
    head = '<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="1.4"><header srclang="en"/><body>\n'
    return f"{head}{units}</body></tmx>\n"


def test_a_translation_memory_is_a_corpus(tmp_path):
    """data.format=tmx: pairs by xml:lang's primary subtag (en-GB is en), formatting codes left out, units without
    both languages skipped; a whole run trains and tests on TMX files."""
    from mt.config import DataConfig
    from mt.data.read import TextPairs

    units = [("The <bpt i=\"1\">&lt;b&gt;</bpt>dose<ept i=\"1\">&lt;/b&gt;</ept> is <hi>high</hi>.",
              "Die Dosis ist hoch.")]  # fmt: skip
    text = tmx(units).replace("</body>", '<tu><tuv xml:lang="en"><seg>alone</seg></tuv></tu></body>')
    (tmp_path / "train.tmx").write_text(text)
    dc = DataConfig(name="tm", format="tmx", dir=str(tmp_path), src_lang="en", tgt_lang="de")
    assert list(TextPairs.of_split(dc, "train")) == [("The dose is high.", "Die Dosis ist hoch.")]

    corpus = write_toy_corpus(tmp_path / "corpus")
    for split in ("train", "valid", "test"):
        pairs = zip(*((corpus / f"{split}.{lang}").read_text().splitlines() for lang in ("xx", "yy")))
        (corpus / f"{split}.tmx").write_text(tmx(list(pairs), ("xx", "yy")))
        for lang in ("xx", "yy"):
            (corpus / f"{split}.{lang}").unlink()
    args = ["train.py", "data=local", "data.format=tmx", f"data.dir={corpus}", "data.src_lang=xx", "data.tgt_lang=yy",
            "model=transformer_tiny", "tokenizer.vocab_size=60", "tokenizer.min_frequency=1", "train.max_updates=3",
            "train.progress=false", "train.device=cpu", "decode=greedy", f"run_dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "local/train: 200 pairs read" in p.stderr and (tmp_path / "run" / "test.report.json").is_file()


def test_an_unreachable_hub_is_said_in_one_line_and_not_retried(tmp_path):
    """Before: the quick start's Hub fallback printed 22 lines of retry warnings and stopped after ~30 s. Now the
    Hub's host is tried once (here a closed port), said in one line, and the caches read at once."""
    import os
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy")}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    start = time.time()
    p = subprocess.run([sys.executable, "train.py", "+experiment=smoke", f"data.dir={tmp_path / 'none'}",
                        f"run_dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True, env=env,
                       timeout=300)  # fmt: skip
    assert p.returncode == 2 and time.time() - start < 20
    assert p.stderr.count("the Hugging Face Hub cannot be reached (127.0.0.1:") == 1
    assert "Retrying" not in p.stderr
    assert p.stderr.splitlines()[-1].endswith("put the corpus's files in data.dir, or connect to the network")


def test_a_log_file_gets_no_bar_frames_and_the_end_of_the_run_shows_its_progress(tmp_path):
    """Before: stderr redirected to a file held tqdm's \\r-joined frames; after "training stopped" the val and test
    decoding ran silently. Now no frames where stderr is not a terminal, and each step of the end is logged."""
    corpus = write_toy_corpus(tmp_path / "corpus")
    args = ["train.py", "data=local", f"data.dir={corpus}", "data.src_lang=xx", "data.tgt_lang=yy",
            "data.valid_split=valid", "data.test_splits=[test]", "model=transformer_tiny", "tokenizer.vocab_size=60",
            "tokenizer.min_frequency=1", "train.max_epochs=12", "train.max_tokens=100", "train.progress=true",
            "train.average_last=2", "train.keep_last=2", "train.device=cpu", "train.tensorboard=false",
            "decode=greedy", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    with open(tmp_path / "log.txt", "w") as log:
        p = subprocess.run([sys.executable, *args], cwd=ROOT, stderr=log, stdout=subprocess.DEVNULL, timeout=300,
                           env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
    text = (tmp_path / "log.txt").read_bytes().decode()  # (bytes: read_text would turn each \r into \n)
    assert p.returncode == 0, text[-2000:]
    assert "\r" not in text and "it/s]" not in text
    end = text[text.index("training stopped") :]
    assert "candidate weights" in end and "[1/" in end and "translating test (20 sentences" in end
    assert "the end of the run took" in end


def test_the_bar_shows_what_is_left_of_the_budget():
    from types import SimpleNamespace

    from mt.train.schedules import Budget
    from mt.train.trainer import Trainer

    budget = Budget(max_updates=100, max_time_min=2)
    assert Trainer.budget_left(SimpleNamespace(budget=budget, update=40)).endswith(" min / 60 updates")
    assert Trainer.budget_left(SimpleNamespace(budget=Budget(0, 0), update=5)) == "no budget"
