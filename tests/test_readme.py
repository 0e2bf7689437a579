"""The README's commands: every command of its ```bash blocks is either run here as written (those that take
seconds, with their placeholders filled: a tiny run for RUN_DIR, small files for test.en and the like) or listed
with the reason it is not, so that the README cannot drift from the code unnoticed."""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import MULTI30K, ROOT, write_toy_corpus

QUICKSTART = "python train.py +experiment=quickstart"
INSTALL_CHECK = 'echo "A dog runs on the beach." | python translate.py checkpoint=runs/quickstart_en-de'
SMOKE = "python train.py +experiment=smoke"
FINETUNE = (
    "python train.py +experiment=finetune data=local data.dir=my_corpus data.src_lang=en data.tgt_lang=de "
    "data.valid_from_train=500 train.init_from=runs/quickstart_en-de run_dir=runs/mine"
)
# Appended to a command as written, to make it short (and quiet) here. A model of tens of updates writes every
# line to its length cap when it validates and scores the test sets: decode.max_len keeps each stage, shorter.
SHORTER = {
    QUICKSTART: " train.max_time=0 train.max_updates=30 train.valid_every=15 train.progress=false decode.max_len=16",
    SMOKE: " train.progress=false decode.max_len=16",
    FINETUNE: " train.max_time=0 train.max_updates=10 train.valid_every=10 train.progress=false decode.max_len=16",
}
# The README's examples read a folder the user makes (my_corpus) or download Multi30k; here they read ../shared.
SHARED = {"my_corpus": ROOT.parent / "shared" / "data" / "opus_emea_de_en"}

# Run as written, in the README's order, placeholders filled (`fill`); each must exit 0 (what they write is checked
# below). The quick start's model is the one the next commands translate with and fine-tune.
RUN = [
    QUICKSTART,
    INSTALL_CHECK,
    SMOKE,
    FINETUNE,
    "python translate.py checkpoint=RUN_DIR < test.en > test.hyp",
    "python translate.py checkpoint=RUN_DIR input=test.en output=test.hyp references=test.de",
    "python translate.py checkpoint=RUN_DIR glossary=terms.tsv decode.beam_size=5 < test.en",
    "python -m mt.compare A.hyp B.hyp --refs test.de",
    "python translate.py checkpoint=RUN_DIR output_format=jsonl < test.en",
    "python -m mt.export release RUN_DIR release/",
    "python -m mt.export ctranslate2 RUN_DIR ct2/ --quantization int8",
    "python -m mt.export transformers RUN_DIR hf/",
]
# The quick start's model and the commands that use it; the other commands are independent of them.
QUICKSTART_CHAIN = [QUICKSTART, INSTALL_CHECK, FINETUNE]
# Not run here, and why (the same code paths run elsewhere in the suite where they can).
NOT_RUN = {
    "git clone <this repository's URL> mt && cd mt": "the checkout this suite runs in",
    "pip install torch --index-url https://download.pytorch.org/whl/cpu": "what .ci/run does before the suite",
    "pip install -e .": "what .ci/run does before the suite (with the dev extra)",
    "python train.py +experiment=auto data=local data.dir=my_corpus data.src_lang=de data.tgt_lang=en "
    "data.valid_from_train=500 train.max_time=20": "20 minutes (tests/test_auto.py runs +experiment=auto on a "
    "corpus; docs/auto.md has such runs)",
    "python train.py +experiment=auto train.init_from=Helsinki-NLP/opus-mt-de-en data=local data.dir=my_corpus "
    "data.src_lang=de data.tgt_lang=en data.valid_from_train=500 train.max_time=30 run_dir=runs/opus_my_corpus": (
        "downloads OPUS-MT from the Hub (tests/test_hub_import.py fine-tunes and exports an OPUS-MT-shaped "
        "checkpoint built offline)"
    ),
    "python translate.py checkpoint=runs/opus_my_corpus < new.de > new.en": "needs the run above (tests/test_hub_import"
    ".py translates the same way)",
    "python -m mt.export transformers runs/opus_my_corpus opus-mt-de-en-mine/": "needs the run above "
    "(tests/test_hub_import.py exports the same way)",
    "python serve.py checkpoint=RUN_DIR port=8080": "serves until stopped (tests/test_serve_team.py starts serve.py)",
    "python train.py +experiment=distill distill.teacher=runs/big data=local data.dir=my_corpus data.src_lang=de "
    "data.tgt_lang=en train.max_time=120": "needs a trained teacher and two hours (tests/test_distill.py runs "
    "+experiment=distill end to end with tiny teachers)",
    "python -m pytest -q": "the suite itself",
}


def readme_commands() -> list[str]:
    """The commands of the README's bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        commands += [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines() if line.strip()]
    return list(dict.fromkeys(commands))


def test_every_readme_command_is_run_or_says_why_not():
    commands = readme_commands()
    unlisted = [c for c in commands if c not in RUN and c not in NOT_RUN]
    assert not unlisted, f"README commands neither run by tests/test_readme.py nor listed in NOT_RUN: {unlisted}"
    gone = [c for c in [*RUN, *NOT_RUN] if c not in commands]
    assert not gone, f"commands no longer in the README: {gone}"


@pytest.fixture(scope="module")
def beam_run(tmp_path_factory) -> Path:
    """A tiny run (toy corpus) whose saved decoding is a beam, as every recipe's is."""
    from mt.config import DecodeConfig
    from mt.data.corpus import prepare_data
    from mt.train.trainer import Trainer
    from tests.test_training import make_config

    corpus, run = write_toy_corpus(tmp_path_factory.mktemp("corpus")), tmp_path_factory.mktemp("run")
    cfg = make_config(corpus, run, max_updates=30, max_epochs=3, lr=5e-3)
    cfg = replace(cfg, decode=DecodeConfig(beam_size=4, max_tokens=500))
    Trainer(cfg, prepare_data(cfg, run, cfg.model.max_positions), run).fit(job_start=0)
    return run


def fill(command: str, run: Path, tmp: Path) -> str:
    """`command` with its placeholders filled: run dirs (the README's own in `tmp`), and files in `tmp` (written by
    the test), and made short (`SHORTER`)."""
    names = {"RUN_DIR": run, "RUN_A": run, "RUN_B": run, "runs/quickstart_en-de": tmp / "quickstart",
             "runs/mine": tmp / "emea", "release/": tmp / "release", "ct2/": tmp / "ct2",
             "hf/": tmp / "hf", **SHARED}  # fmt: skip
    for name in ("test.en", "test.hyp", "test.de", "terms.tsv", "A.hyp", "B.hyp"):
        names[name] = tmp / name
    pattern = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    filled = re.sub(rf"(?<![\w/.])({pattern})(?![\w-])", lambda m: str(names[m.group(1)]), command)
    own = {QUICKSTART: f" run_dir={tmp / 'quickstart'}", SMOKE: f" run_dir={tmp / 'smoke'}"}.get(command, "")
    return filled + own + SHORTER.get(command, "")


@pytest.mark.skipif(not (MULTI30K / "train.en.gz").is_file(), reason=f"Multi30k not found at {MULTI30K}")
def test_the_readme_commands_that_take_seconds_run_as_written(beam_run, tmp_path):
    lines = ["the cat sees a dog", "a big red house", "the small tree runs"]
    for name, text in {"test.en": lines, "test.de": [" ".join(x.split()[::-1]) for x in lines],
                       "terms.tsv": ["dog\tdog"], "A.hyp": lines, "B.hyp": lines[::-1]}.items():  # fmt: skip
        (tmp_path / name).write_text("\n".join(text) + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}

    def run_in_order(commands: list[str]) -> list[tuple[str, str, subprocess.CompletedProcess]]:
        done = []
        for command in commands:
            filled = fill(command, beam_run, tmp_path)
            p = subprocess.run(filled, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
                               stdin=subprocess.DEVNULL)  # fmt: skip
            done.append((command, filled, p))
            if p.returncode != 0:
                break
        return done

    # Two chains side by side, one core each, each in the README's order: the quick start and what uses its model
    # (the install check, fine-tuning), and the rest (the smoke run, then the commands on the tiny run).
    chains = [QUICKSTART_CHAIN, [c for c in RUN if c not in QUICKSTART_CHAIN]]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [row for done in pool.map(run_in_order, chains) for row in done]
    for command, filled, p in results:
        assert p.returncode == 0, f"{command}\n{filled}\n{p.stderr[-2000:]}"
        if command == INSTALL_CHECK:
            assert p.stdout.count("\n") == 1 and p.stdout.strip(), p.stdout  # one German line for the one line
        if "output_format=jsonl" in command:  # a JSON object a line, as the README shows
            assert [set(json.loads(line)) for line in p.stdout.splitlines()] == [{"text", "score", "flags"}] * 3
    assert [command for command, _, _ in results] == [c for chain in chains for c in chain]
    assert len((tmp_path / "test.hyp").read_text().splitlines()) == 3
    assert (tmp_path / "release" / "model.safetensors").is_file() and (tmp_path / "ct2" / "model.bin").is_file()
    assert (tmp_path / "emea" / "checkpoint_final.pt").is_file()  # fine-tuned from the quick start's model
