"""The peer-comparison harness (benchmarks/peers/): the wall-clock budget and the scoring every peer goes through."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET = ROOT / "benchmarks" / "peers" / "budget.py"
SCORE = ROOT / "benchmarks" / "peers" / "score.py"

# A stand-in for a peer's trainer: counts "updates" until Ctrl-C, then saves, as JoeyNMT does.
TRAINER = """
import sys, time
out = sys.argv[1]
steps = 0
try:
    while True:
        time.sleep(0.01)
        steps += 1
except KeyboardInterrupt:
    open(out, "w").write(f"saved after {steps} steps")
"""


def test_the_budget_interrupts_training_like_ctrl_c_even_when_started_in_the_background(tmp_path):
    saved = tmp_path / "saved"
    # A background job of a non-interactive shell inherits SIGINT ignored; the child must still get Ctrl-C.
    ignoring = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    start = time.time()
    done = subprocess.run(
        [sys.executable, str(BUDGET), "--deadline", str(start + 4), "--grace", "20", "--",
         sys.executable, "-c", TRAINER, str(saved)],
        preexec_fn=ignoring, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "deadline reached" in done.stdout
    assert saved.read_text().startswith("saved after ")
    assert 3.9 < time.time() - start < 30


def test_a_trainer_that_ends_before_the_deadline_keeps_its_exit_code(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BUDGET), "--deadline", str(time.time() + 60), "--",
         sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3
    assert "ended by itself (exit 3)" in done.stdout


def write_split(data: Path, split: str, src: list[str], ref: list[str]) -> None:
    data.mkdir(parents=True, exist_ok=True)
    for lang, lines in (("en", src), ("de", ref)):
        with gzip.open(data / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))


def test_a_peer_is_scored_against_the_untouched_references_as_this_project_scores(tmp_path):
    from mt.evaluate.report import score

    src = ["A dog runs.", "Two men talk.", "A child plays in the sand."]
    ref = ["Ein Hund rennt.", "Zwei Männer reden.", "Ein Kind spielt im Sand."]
    hyp = ["Ein Hund läuft.", "zwei Männer reden.", "Ein Kind spielt im Sand."]
    write_split(tmp_path / "m30k", "test_2016_flickr", src, ref)
    (tmp_path / "hyp").write_text("\n".join(hyp) + "\n")
    done = subprocess.run(
        [sys.executable, str(SCORE), "--hyp", str(tmp_path / "hyp"), "--out", str(tmp_path / "out"),
         "--toolkit", "peer", "--version", "1.0", "--meta", "params=123", "sent_s=9.5"],
        env={"MULTI30K": str(tmp_path / "m30k"), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "test_2016_flickr.report.json").read_text())
    expected = score(hyp, ref)
    assert (report["bleu"], report["bleu_lowercase"], report["chrf"]) == (
        expected["bleu"],
        expected["bleu_lowercase"],
        expected["chrf"],
    )
    assert report["bleu_lowercase"] > report["bleu"]  # "zwei" is right only when lowercased
    assert (report["toolkit"], report["params"], report["sent_s"]) == ("peer", "123", "9.5")
    assert f"| peer | 1.0 | 123 |  |  | {expected['bleu_lowercase']} |" in done.stdout


def test_an_incomplete_peer_output_is_a_one_line_error(tmp_path):
    write_split(tmp_path / "m30k", "test_2016_flickr", ["a", "b"], ["x", "y"])
    (tmp_path / "hyp").write_text("x\n")
    done = subprocess.run(
        [sys.executable, str(SCORE), "--hyp", str(tmp_path / "hyp"), "--out", str(tmp_path / "out"),
         "--toolkit", "peer", "--version", "1.0"],
        env={"MULTI30K": str(tmp_path / "m30k"), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    expected = f"error: {tmp_path / 'hyp'} has 1 lines, the references 2: the peer's output is incomplete"
    assert done.stdout.strip() == expected
    assert not (tmp_path / "out").exists()


def test_a_missing_peer_output_is_a_one_line_error(tmp_path):
    write_split(tmp_path / "m30k", "test_2016_flickr", ["a"], ["x"])
    done = subprocess.run(
        [sys.executable, str(SCORE), "--hyp", str(tmp_path / "nothing"), "--out", str(tmp_path / "out"),
         "--toolkit", "peer", "--version", "1.0"],
        env={"MULTI30K": str(tmp_path / "m30k"), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and not done.stderr
    assert done.stdout.startswith(f"error: {tmp_path / 'nothing'} not found")


def test_the_moses_step_tokenizes_the_lines_it_is_given(tmp_path):
    # A stand-in sacremoses (the peers' venvs have the real one): splits off the final period, keeps the case.
    (tmp_path / "sacremoses.py").write_text(
        "class MosesTokenizer:\n"
        "    def __init__(self, lang):\n"
        "        self.lang = lang\n"
        "    def tokenize(self, text, return_str):\n"
        "        return text[:-1] + ' .' if text.endswith('.') else text\n"
    )
    (tmp_path / "train.en.gz").write_bytes(gzip.compress(b"x\n"))
    lines = "A Dog runs.\nTwo Men.\n"
    done = subprocess.run(
        ["bash", "-c", f'source {ROOT}/benchmarks/peers/common.sh && moses_lowercase "{sys.executable}" en'],
        input=lines, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path),
                                                          "MULTI30K": str(tmp_path)}, check=True)  # fmt: skip
    assert done.stdout == "a dog runs .\ntwo men .\n"
