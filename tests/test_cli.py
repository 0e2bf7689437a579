"""End to end through the entry points: train.py (1 process and 2-process torchrun/gloo), then translate.py."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests import warm_start
from tests.conftest import MULTI30K, ROOT, needs_multi30k, read_gz


def run(args, input=None, check=True, timeout=600):
    """`python ARGS` as a new process forked from a warm interpreter (tests/warm_start.py), its output as text."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "HYDRA_FULL_ERROR": "0"}
    p = warm_start.shared(env, ROOT).run(args, input, timeout, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p


@pytest.fixture(scope="module")
def smoke_run(multi30k_subset, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("smoke")
    p = run(
        [
            "train.py",
            "+experiment=smoke",
            f"data.dir={multi30k_subset}",
            f"run_dir={run_dir}",
            "train.progress=false",
            "train.valid_every=20",
            "train.max_epochs=3",  # (the recipe's one epoch of the whole corpus is ~40 updates of this subset)
        ]
    )
    (run_dir / "stderr.txt").write_text(p.stderr)
    return run_dir


@needs_multi30k()
def test_train_writes_everything(smoke_run):
    names = {p.name for p in smoke_run.iterdir()}
    for expected in (
        "checkpoint_best.pt",
        "checkpoint_last.pt",
        "checkpoint_final.pt",
        "config.resolved.yaml",
        "metrics.jsonl",
        "training_curves.png",
        "test_2016_flickr.report.json",
        "test_2016_flickr.report.md",
        "test_2016_flickr.hyp",
        "tokenizer.json",
    ):
        assert expected in names
    assert (smoke_run / ".hydra" / "config.yaml").is_file()
    valid = [json.loads(x) for x in (smoke_run / "metrics.jsonl").read_text().splitlines() if '"valid"' in x]
    assert len(valid) >= 3 and valid[-1]["valid_loss"] < valid[0]["valid_loss"]
    report = json.loads((smoke_run / "test_2016_flickr.report.json").read_text())
    assert report["sentences"] == 40 and "nrefs:1" in report["bleu_signature"]


@needs_multi30k()
def test_a_run_ends_saying_where_its_model_is_and_the_command_to_translate_with_it(smoke_run):
    """The last lines of a run: the model's path, its test scores, and a command that, run as printed from where
    train.py ran, translates (before: the run dir's name was only in docs/train.md)."""
    last = [line.split(" - ", 1)[-1] for line in (smoke_run / "stderr.txt").read_text().strip().splitlines()[-3:]]
    assert last[0] == f"the model: {smoke_run / 'checkpoint_final.pt'} (translate.py, the server and exports take " \
                      f"the run dir {smoke_run})"  # fmt: skip
    assert re.fullmatch(r"test test_2016_flickr: BLEU [\d.]+, lowercased BLEU [\d.]+, chrF [\d.]+ \(.*\)", last[1])
    command = last[2].removeprefix("translate with it: ")
    assert command.startswith("echo ") and f"python translate.py checkpoint={smoke_run}" in command
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    p = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.strip(), p.stderr[-2000:]


@needs_multi30k()
def test_progress_false_means_no_progress_bars(smoke_run):
    stderr = (smoke_run / "stderr.txt").read_text()
    assert "training stopped" in stderr and "examples/s" not in stderr and "it/s" not in stderr


@needs_multi30k()
def test_translate_stdin_lines_and_nbest(smoke_run):
    out = run(["translate.py", f"checkpoint={smoke_run}"], input="a dog runs .\n\nTwo men\n").stdout
    assert len(out.split("\n")) == 4 and out.endswith("\n") and out.split("\n")[1] == ""
    out = run(
        ["translate.py", f"checkpoint={smoke_run}", "decode.beam_size=4", "decode.nbest=3"], input="a\n\nb\n"
    ).stdout
    lines = out.splitlines()
    assert len(lines) == 9 and [line.split(" ||| ")[0] for line in lines] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3
    assert all(len(line.split(" ||| ")) == 3 for line in lines)
    out = run(["translate.py", f"checkpoint={smoke_run}", "decode.quantize=int8"], input="a dog runs .\n\nTwo men\n")
    assert len(out.stdout.split("\n")) == 4 and out.stdout.split("\n")[1] == ""


@needs_multi30k()
def test_translate_documents_and_terminology(smoke_run, tmp_path):
    """split=true: a paragraph per line, sentence by sentence, indentation and blank lines kept; glossary= and
    constraints= put their terms in the output as words."""
    base = ["translate.py", f"checkpoint={smoke_run}", "decode.beam_size=4"]
    alone = run(base, input="A dog runs.\nTwo men talk.\nA girl.\n").stdout.splitlines()
    out = run([*base, "split=true"], input="  A dog runs. Two men talk.\n\nA girl.\n").stdout
    assert out.split("\n") == [f"  {alone[0]} {alone[1]}", "", alone[2], ""]
    (tmp_path / "g.tsv").write_text("girl\tHund\n")
    (tmp_path / "c.txt").write_text("\nMann\tStrand\n")
    p = run([*base, f"glossary={tmp_path / 'g.tsv'}"], input="A dog runs.\nA girl.\n")
    assert p.stdout.splitlines()[0] == alone[0]  # no term in the line: as without the glossary
    assert "Hund" in re.findall(r"\w+", p.stdout.splitlines()[1]) and "glossary: terms in 1 lines" in p.stderr
    p = run([*base, f"constraints={tmp_path / 'c.txt'}"], input="A dog runs.\nA girl.\n")
    words = re.findall(r"\w+", p.stdout.splitlines()[1])
    assert "Mann" in words and "Strand" in words and "constraints: 2 of 2 met" in p.stderr


@needs_multi30k()
def test_exports_translate_as_the_checkpoint_does(smoke_run, tmp_path):
    """`python -m mt.export` then translate.py with the export: the release (safetensors) gives the checkpoint's
    output, the float32 CTranslate2 export the same greedy output; an int8 export translates every line (this
    barely trained model's outputs are too fragile to compare across int8 rounding)."""
    pytest.importorskip("ctranslate2")
    src = "\n".join(read_gz(MULTI30K / "val.en.gz", 100)) + "\n"
    reference = run(["translate.py", f"checkpoint={smoke_run}", "decode=greedy"], input=src).stdout
    run(["-m", "mt.export", "release", str(smoke_run), str(tmp_path / "release")])
    run(["-m", "mt.export", "ctranslate2", str(smoke_run), str(tmp_path / "ct2")])
    run(["-m", "mt.export", "ctranslate2", str(smoke_run), str(tmp_path / "ct2-int8"), "--quantization", "int8"])
    for export in ("release", "ct2"):
        out = run(["translate.py", f"checkpoint={tmp_path / export}", "decode=greedy"], input=src).stdout
        assert out == reference, export
    out = run(["translate.py", f"checkpoint={tmp_path / 'ct2-int8'}", "decode=greedy"], input=src).stdout
    assert len(out.splitlines()) == 100  # its quality is measured on a real model (benchmarks/speed/export_speed.py)


@needs_multi30k()
def test_translate_decodes_a_list_of_checkpoints_as_an_ensemble(smoke_run):
    """A model ensembled with itself translates as the model; a list mixing a run dir and a .pt file is read."""
    src = "\n".join(read_gz(MULTI30K / "val.en.gz", 30)) + "\n"
    alone = run(["translate.py", f"checkpoint={smoke_run}"], input=src)
    pt = smoke_run / "checkpoint_final.pt"
    both = run(["translate.py", f"checkpoint=[{smoke_run},{pt}]"], input=src)
    assert both.stdout == alone.stdout and "ensemble of 2 models" in both.stderr


@needs_multi30k()
def test_translate_writes_no_files_and_logs_to_stderr(smoke_run, tmp_path):
    p = subprocess.run(
        [sys.executable, str(ROOT / "translate.py"), f"checkpoint={smoke_run}"],
        cwd=tmp_path,
        input="a dog runs .\n",
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert len(p.stdout.splitlines()) == 1 and "sentences/s" in p.stderr
    assert list(tmp_path.iterdir()) == []  # no Hydra log file or output dir in the working directory


@needs_multi30k()
def test_translate_reads_gzipped_input_file(smoke_run, tmp_path):
    import gzip

    src = tmp_path / "in.en.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("a dog .\n\ntwo men .\n")
    out = tmp_path / "out.de"
    run(["translate.py", f"checkpoint={smoke_run}", f"input={src}", f"output={out}", "decode=greedy"])
    lines = out.read_text().split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""


@needs_multi30k()
def test_report_matches_sacrebleu_cli(smoke_run, multi30k_subset, tmp_path):
    src, ref = multi30k_subset / "test_2016_flickr.en", multi30k_subset / "test_2016_flickr.de"
    hyp = tmp_path / "hyp.de"
    run(
        [
            "translate.py",
            f"checkpoint={smoke_run}",
            f"input={src}",
            f"output={hyp}",
            f"references={ref}",
            "decode=greedy",
        ]
    )
    report = json.loads((tmp_path / "report.json").read_text())
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-m", "bleu", "chrf", "-b", "-w", "2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert [report["bleu"], report["chrf"]] == json.loads(cli)  # both rounded to 2 decimals
    assert (tmp_path / "report.md").read_text().startswith("# Translation report")


@needs_multi30k()
def test_attention_plot_has_source_by_output_shape(smoke_run, tmp_path):
    import torch
    from PIL import Image

    png = tmp_path / "attn.png"
    run(
        ["translate.py", f"checkpoint={smoke_run}", f"plot_attention={png}", "decode=greedy"],
        input="a man on a bike .\n",
    )
    matrix = torch.load(png.with_suffix(".attn.pt"))
    assert Image.open(png).size[0] > 100
    from mt.model import saved

    _, vocabs = saved.build_model(saved.load(smoke_run))
    assert matrix.shape[1] == len(vocabs.src.encode("a man on a bike .")) + 1  # source tokens + </s>
    torch.testing.assert_close(matrix.sum(1), torch.ones(matrix.shape[0]))  # each output row is a distribution


@needs_multi30k()
@pytest.mark.parametrize(
    "args,input,message",
    [
        (["checkpoint=/nonexistent"], "", "no such file or directory"),
        ([], b"ok\n\xff\xfe\n", "stdin:2: bytes that are not UTF-8"),
        (["references=REFS"], "a\nb\n", "has 1 lines but the input has 2"),
        (["decode.quantize=int4"], "a\n", "decode.quantize"),
    ],
)
def test_translate_bad_input_is_one_line(smoke_run, tmp_path, args, input, message):
    (tmp_path / "refs.txt").write_text("only one line\n")
    args = [a.replace("REFS", str(tmp_path / "refs.txt")) for a in args]
    if not any(a.startswith("checkpoint=") for a in args):
        args = [f"checkpoint={smoke_run}", *args]
    p = run(["translate.py", *args], input, check=False)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and err[-1].startswith("error: ") and message in err[-1]
    assert "Traceback" not in p.stderr


def test_corrupt_checkpoint_is_one_line(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    p = run(["translate.py", f"checkpoint={bad}"], input="a\n", check=False)
    assert p.returncode == 2 and "not a readable checkpoint" in p.stderr and "Traceback" not in p.stderr


def test_misspelt_override_fails_before_running():
    p = run(["train.py", "train.max_epoch=3"], check=False)
    assert p.returncode != 0 and "max_epoch" in p.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_two_processes_match_one(toy_corpus, tmp_path):
    """2 ranks x 1 batch per update == 1 process x 2 accumulated batches: the same global batches, so the
    validation loss after M updates agrees up to float summation order."""
    common = [
        "data=local",
        f"data.dir={toy_corpus}",
        "data.src_lang=xx",
        "data.tgt_lang=yy",
        "model=transformer_tiny",
        "model.dropout=0",
        "tokenizer.vocab_size=60",
        "tokenizer.min_frequency=1",
        "train.max_tokens=150",
        "train.max_updates=6",
        "train.valid_every=6",
        "train.valid_bleu=false",
        "train.progress=false",
        "train.device=cpu",
        "train.precision=fp32",
        "train.warmup=5",
        "data.test_splits=[]",
    ]
    one = tmp_path / "one"
    run(["train.py", *common, f"run_dir={one}", "train.accumulate=2"])
    two = tmp_path / "two"
    env_threads = {"OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            "train.py",
            *common,
            f"run_dir={two}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env_threads},
    )
    assert p.returncode == 0, p.stderr[-3000:]

    def valid_loss(d):
        return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if '"valid"' in x][-1]

    a, b = valid_loss(one), valid_loss(two)
    assert a["update"] == b["update"] == 6
    assert a["valid_loss"] == pytest.approx(b["valid_loss"], rel=1e-4)


@needs_multi30k()
def test_sigterm_saves_and_the_same_command_resumes(multi30k_subset, tmp_path):
    args = [
        sys.executable,
        "train.py",
        "+experiment=smoke",
        f"data.dir={multi30k_subset}",
        f"run_dir={tmp_path}",
        "train.progress=false",
        "train.max_epochs=50",
        "train.log_every=1",
    ]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "checkpoint saved" in err and "run the same command to resume" in err
    assert (tmp_path / "checkpoint_last.pt").is_file()
    p = run([*args[1:6], "train.max_epochs=1", "train.progress=false"], check=True)
    resumed_at = int(re.search(r"resumed from \S+ at update (\d+)", p.stderr).group(1))
    stopped_after = int(re.search(r"training stopped \(max_epochs\) after (\d+) updates", p.stderr).group(1))
    per_epoch = int(re.search(r"(\d+) batches per epoch", p.stderr).group(1))
    assert 3 <= resumed_at < stopped_after == per_epoch  # the resumed run trained the rest of epoch 1


def test_translate_decodes_with_the_runs_settings_unless_overridden():
    """A recipe's tuned decoding (saved in the checkpoint's config) is the default; decode.* keys override single
    settings and a decode group on the command line replaces them."""
    from mt.config import DecodeConfig
    from mt.decode.loading import run_decode_settings

    ckpt = {"config": {"decode": {**vars(DecodeConfig()), "beam_size": 5, "length_penalty": 1.5}}}
    cli = DecodeConfig(beam_size=4, length_penalty=1.0, nbest=3)
    assert run_decode_settings(cli, ckpt, ["checkpoint=x"]) == DecodeConfig(beam_size=5, length_penalty=1.5)
    got = run_decode_settings(cli, ckpt, ["checkpoint=x", "decode.beam_size=4", "decode.nbest=3"])
    assert got == DecodeConfig(beam_size=4, length_penalty=1.5, nbest=3)
    assert run_decode_settings(cli, ckpt, ["decode=greedy", "decode.nbest=3"]) is cli
    assert run_decode_settings(cli, {"config": None}, []) is cli


def test_prepare_then_train_reuses_the_prepared_corpus(toy_corpus, tmp_path):
    """`python -m mt.prepare` does rank 0's preparation as its own job; train.py then starts from the cache."""
    common = [
        "data=local", f"data.dir={toy_corpus}", "data.src_lang=xx", "data.tgt_lang=yy", "data.test_splits=[]",
        f"data.cache_dir={tmp_path / 'cache'}", "tokenizer.vocab_size=60", "tokenizer.min_frequency=1",
        "model=transformer_tiny",
    ]  # fmt: skip
    p = run(["-m", "mt.prepare", *common, f"run_dir={tmp_path / 'prepared'}"])
    assert "tokenized 200 pairs" in p.stderr and "prepared in" in p.stderr
    p = run(["train.py", *common, f"run_dir={tmp_path / 'run'}", "train.max_updates=2", "train.valid_bleu=false",
             "train.progress=false", "train.device=cpu", "train.average_last=0"])  # fmt: skip
    assert "reusing the BPE trained on this corpus" in p.stderr and "reusing the tokenized corpus" in p.stderr
    assert "tokenized 200 pairs" not in p.stderr


def test_a_lowercased_run_reads_any_casing_alike_and_its_report_says_so(toy_corpus, tmp_path):
    """tokenizer.normalization=NFC+Lowercase end to end: the run's tokenizer lowercases what translate.py reads, and
    the test report, scored against cased references, is marked as a lowercased model's."""
    refs = toy_corpus / "test.yy"
    refs.write_text("".join(line.capitalize() + "\n" for line in refs.read_text().splitlines()))
    run_dir = tmp_path / "run"
    run(["train.py", "data=local", f"data.dir={toy_corpus}", "data.src_lang=xx", "data.tgt_lang=yy",
         f"data.cache_dir={tmp_path / 'cache'}", "tokenizer.vocab_size=60", "tokenizer.min_frequency=1",
         "tokenizer.normalization=NFC+Lowercase", "model=transformer_tiny", f"run_dir={run_dir}",
         "train.max_updates=20", "train.valid_bleu=false", "train.progress=false", "train.device=cpu",
         "train.average_last=0"])  # fmt: skip
    report = json.loads((run_dir / "test.report.json").read_text())
    assert report.get("lowercased_model") and "The model lowercases" in (run_dir / "test.report.md").read_text()
    out = run(["translate.py", f"checkpoint={run_dir}"], input="The Big Dog SEES a Cat\nthe big dog sees a cat\n")
    first, second = out.stdout.splitlines()
    assert first == second == first.lower()


def torchrun(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_torchrun_resume_is_exact_on_every_rank(toy_corpus, tmp_path):
    """Two ranks with dropout on, stopped after 4 updates and resumed to 10, end bitwise where an uninterrupted
    two-rank run does: each rank gets its own RNG states back (rank 0's on every rank drew other dropout masks)."""
    from mt.model import saved

    common = [
        "train.py", "data=local", f"data.dir={toy_corpus}", "data.src_lang=xx", "data.tgt_lang=yy",
        "model=transformer_tiny", "model.dropout=0.3", "tokenizer.vocab_size=60", "tokenizer.min_frequency=1",
        "train.max_tokens=150", "train.valid_bleu=false", "train.progress=false", "train.device=cpu",
        "train.precision=fp32", "train.warmup=5", "data.test_splits=[]", "train.average_last=0",
    ]  # fmt: skip
    torchrun([*common, f"run_dir={tmp_path / 'straight'}", "train.max_updates=10"])
    torchrun([*common, f"run_dir={tmp_path / 'resumed'}", "train.max_updates=4"])
    p = torchrun([*common, f"run_dir={tmp_path / 'resumed'}", "train.max_updates=10"])
    assert "resumed from" in p.stderr
    a = saved.load(tmp_path / "straight" / "checkpoint_last.pt")
    b = saved.load(tmp_path / "resumed" / "checkpoint_last.pt")
    assert a["update"] == b["update"] == 10 and len(b["rng_per_rank"]) == 2
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# An entry point run in this interpreter, as `python ARGS` would run it; prints its exit code and which of the heavy
# libraries it had loaded when it exited.
ENTRY = """
import runpy, sys
args = sys.argv[1:]
try:
    if args[0] == "-m":
        sys.argv = ["-m", *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")
except SystemExit as e:
    print(e.code, *[m for m in ("torch", "datasets") if m in sys.modules])
"""


@pytest.mark.parametrize(
    "args, expected",
    [
        (["train.py", "model.dropout=1.5", "run_dir={run}"], "error: model.dropout=1.5 is a probability"),
        (["-m", "mt.prepare", "data.max_len=0", "run_dir={run}"], "error: data.max_len=0 is below its minimum 1"),
        (["translate.py", "checkpoint=x", "stream_lines=0"], "error: stream_lines=0 is below its minimum 1"),
        (["serve.py", "checkpoint=x", "port=70000"], "error: port=70000 is outside 0-65535"),
    ],
    ids=["train", "prepare", "translate", "serve"],
)
def test_a_value_the_code_cannot_use_answers_before_torch_loads(tmp_path, args, expected):
    args = [a.replace("{run}", str(tmp_path / "run")) for a in args]
    p = subprocess.run([sys.executable, "-c", ENTRY, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["2"], (p.stdout, p.stderr[-1000:])  # exit 2, neither torch nor datasets loaded
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith(expected), p.stderr[-1000:]
    assert not (tmp_path / "run").exists()


def test_a_failed_start_leaves_no_stray_run_dir(tmp_path):
    """Before: `train.init_from=runs/en_de` (a run nothing had made) failed but left runs/emea with Hydra's files. Now
    a run dir holding only what Hydra wrote for the failed command is removed; one with anything else stays."""
    fresh, used = tmp_path / "fresh", tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    for run_dir in (fresh, used):
        p = run(["train.py", "+experiment=smoke", f"train.init_from={tmp_path / 'nothing'}", f"run_dir={run_dir}"],
                check=False)  # fmt: skip
        assert p.returncode == 2 and "train.init_from=" in p.stderr, p.stderr[-1000:]
    assert not fresh.exists()
    assert (used / "notes.txt").read_text() == "mine" and (used / ".hydra").is_dir()
