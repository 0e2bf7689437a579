"""A catalogue of bad inputs, one row each: data, config, checkpoints, translate.py's files and serve.py's address.

Every row runs the real entry point in a subprocess against a run dir that already holds a finished run, and
expects exit code 2, exactly one `error:` line on stderr that names the file, line or key (every other stderr line
is one of the run's own INFO/WARNING log records), no traceback, and every file of the earlier run unchanged.
Hydra rewrites its record of the latest command (`.hydra/`) and appends to its log (`train.log`): those two are
not compared.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue

import pytest
import torch

from tests.conftest import ROOT, write_toy_corpus
from tests.warm_start import WarmStart

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0", "HF_HUB_OFFLINE": "1"}


def run(args: list[str], stdin: str | bytes | None = None) -> subprocess.CompletedProcess:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run([sys.executable, *args], cwd=ROOT, input=data, capture_output=True, timeout=300, env=ENV)


def train_args(corpus: Path, run_dir: Path) -> list[str]:
    return [
        "train.py",
        "data=local",
        f"data.dir={corpus}",
        "data.src_lang=xx",
        "data.tgt_lang=yy",
        "model=transformer_tiny",
        "tokenizer.vocab_size=60",
        "tokenizer.min_frequency=1",
        "train.max_epochs=1",
        "train.max_tokens=300",
        "train.progress=false",
        "train.device=cpu",
        "train.tensorboard=false",
        "decode=greedy",
        f"run_dir={run_dir}",
    ]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """(corpus, run dir) of a finished one-epoch training run, made by train.py."""
    root = tmp_path_factory.mktemp("finished")
    corpus, run_dir = write_toy_corpus(root / "corpus"), root / "run"
    p = run(train_args(corpus, run_dir))
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return corpus, run_dir


# train.py's log records ("[2026-11-23 10:00:00,000][mt.data.read][INFO] - ...") and translate.py's ("INFO ...").
LOG_RECORD = re.compile(r"^(\[\d{4}-\d\d-\d\d [\d:,]+\]\[[\w.]+\]\[(INFO|WARNING)\] - |(INFO|WARNING) )")


def snapshot(run_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in run_dir.rglob("*")
        if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log"
    }


# ---------------------------------------------------------------------------- the rows
# Each row: (id, entry point, setup(corpus, run_dir, tmp) -> (extra args, stdin), what the error line must contain).
# `corpus` is a private copy of the toy corpus that a row may break.


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _mismatched(c, r, t):
    write(c / "train.yy", "\n".join(lines_of(c / "train.yy")[:-3]) + "\n")
    return [], None


def _not_utf8(c, r, t):
    lines = (c / "train.xx").read_bytes().split(b"\n")
    lines[2] = b"caf\xe9 au lait"
    write(c / "train.xx", b"\n".join(lines))
    return [], None


def _truncated_gzip(c, r, t):
    for lang in ("xx", "yy"):
        blob = gzip.compress((c / f"train.{lang}").read_bytes())
        write(c / f"train.{lang}.gz", blob[: len(blob) // 2])
        (c / f"train.{lang}").unlink()
    return [], None


def _empty(c, r, t):
    write(c / "train.xx", "\n\n")
    write(c / "train.yy", "\n\n")
    return [], None


def _missing_split(c, r, t):
    (c / "valid.yy").unlink()
    return [], None


def _dangling(c, r, t):
    (c / "train.yy").unlink()
    (c / "train.yy").symlink_to(t / "gone.yy")
    return [], None


def _tsv(c, r, t):
    for split in ("train", "valid", "test"):
        body = [f"{s}\t{x}" for s, x in zip(lines_of(c / f"{split}.xx"), lines_of(c / f"{split}.yy"))]
        if split == "train":
            body[4] = body[4].split("\t")[0]  # one column only
        write(c / f"{split}.tsv", "\n".join(body) + "\n")
    return ["data.format=tsv", "data.columns=[xx,yy]"], None


def _jsonl(bad: str):
    def setup(c, r, t):
        for split in ("train", "valid", "test"):
            rows = [
                json.dumps({"xx": s, "yy": x}) for s, x in zip(lines_of(c / f"{split}.xx"), lines_of(c / f"{split}.yy"))
            ]
            if split == "train":
                rows[6] = bad
            write(c / f"{split}.jsonl", "\n".join(rows) + "\n")
        return ["data.format=jsonl"], None

    return setup


def _utf16(c, r, t):
    write(c / "train.xx", (c / "train.xx").read_text().encode("utf-16"))
    return [], None


def _test_split_cut(c, r, t):
    write(c / "test.yy", "\n".join(lines_of(c / "test.yy")[:-2]) + "\n")
    return [], None


def _args(*args):
    return lambda c, r, t: (list(args), None)


def _other_format(c, r, t):
    torch.save({"weights": torch.ones(2)}, t / "other.pt")
    return [f"checkpoint={t / 'other.pt'}"], "a dog\n"


def _truncated_ckpt(c, r, t):
    src = (r / "checkpoint_final.pt").read_bytes()
    write(t / "cut.pt", src[: len(src) // 3])
    return [f"checkpoint={t / 'cut.pt'}"], "a dog\n"


def _not_a_pickle(c, r, t):
    # bytes that begin as a protocol-5 pickle (torch warns on reading the header), then random: fixed, not urandom,
    # so that the row is the same every run
    write(t / "random.pt", b"\x80\x05" + random.Random(0).randbytes(4094))
    return [f"checkpoint={t / 'random.pt'}"], "a dog\n"


def _other_tokenizer(c, r, t):
    # a tokenizer trained on other text: resuming the run with it would feed the model other token ids
    import datasets

    from mt.config import TokenizerConfig
    from mt.data.corpus import build_vocabs
    from mt.data.read import TextPairs

    words = [" ".join(w[::-1] for w in line.split()) for line in lines_of(c / "train.xx")]
    build_vocabs(
        TokenizerConfig(vocab_size=60, min_frequency=1),
        TextPairs.of_table(datasets.Dataset.from_dict({"src": words, "tgt": words})),
        t,
    )
    return [f"tokenizer.path={t / 'tokenizer.json'}"], None


def _prefixes(text: str):
    def setup(c, r, t):
        return [f"checkpoint={r}", f"prefix={write(t / 'prefixes.txt', text)}"], None

    return setup


def _constraints(text: str, *args: str):
    def setup(c, r, t):
        return [f"checkpoint={r}", f"constraints={write(t / 'cons.txt', text)}", *args], None

    return setup


def _glossary(text: str, *args: str, stdin: str | None = None):
    """A glossary file of `text`; decoded with beam 2 unless `args` say otherwise (the finished run is greedy)."""

    def setup(c, r, t):
        return [f"checkpoint={r}", f"glossary={write(t / 'g.tsv', text)}", *(args or ["decode.beam_size=2"])], stdin

    return setup


def _constraints_ct2(c, r, t):
    p = run(["-m", "mt.export", "ctranslate2", str(r), str(t / "ct2")])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return [f"checkpoint={t / 'ct2'}", f"constraints={write(t / 'cons.txt', 'house')}", "decode.beam_size=2"], None


def _mc_dropout_ct2(c, r, t):
    p = run(["-m", "mt.export", "ctranslate2", str(r), str(t / "ct2")])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return [f"checkpoint={t / 'ct2'}", "output_format=jsonl", "confidence=mc_dropout"], "the cat\n"


def _glossary_ct2(c, r, t):
    p = run(["-m", "mt.export", "ctranslate2", str(r), str(t / "ct2")])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    glossary = write(t / "g.tsv", "dog\tHund\n")
    return [f"checkpoint={t / 'ct2'}", f"glossary={glossary}", "decode.beam_size=2"], None


def _release_without_pretokenize(c, r, t):
    """A release of a run that says tokenizer.pretokenize=moses, without the pretokenize.json beside its tokenizer."""
    p = run(["-m", "mt.export", "release", str(r), str(t / "release")])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    config = json.loads((t / "release" / "config.json").read_text())
    config["config"]["tokenizer"]["pretokenize"] = "moses"
    write(t / "release" / "config.json", json.dumps(config))
    return [f"checkpoint={t / 'release'}"], "a dog\n"


def _legacy_moses_prefix(c, r, t):
    """A copy of the run as a Moses model of before the joiner marks, asked for a prefix Moses would give back
    changed ("geht's" as "geht 's")."""
    ckpt = torch.load(r / "checkpoint_best.pt", weights_only=False)
    ckpt["tokenizer"]["pretokenize"] = {"kind": "moses", "src_lang": "en", "tgt_lang": "de"}
    torch.save(ckpt, t / "legacy.pt")
    prefixes = write(t / "prefixes.txt", "x\ngeht's\n")
    return [f"checkpoint={t / 'legacy.pt'}", f"prefix={prefixes}"], "a dog\nthe cat\n"


def _to_transformers(model: dict | None = None, data: dict | None = None, tokenizer: dict | None = None):
    """`mt.export transformers` of a copy of the run's checkpoint changed as a model no transformers architecture
    computes: `model` settings (fresh weights of that shape), `data` config keys, checkpoint `tokenizer` entries."""

    def setup(c, r, t):
        from mt.model.transformer import Transformer

        ckpt = torch.load(r / "checkpoint_best.pt", weights_only=False)
        if model:
            ckpt["model_args"]["model"].update(model)
            ckpt["model"] = Transformer.from_config_dict(ckpt["model_args"]).state_dict()
        ckpt["config"]["data"].update(data or {})
        ckpt["tokenizer"].update(tokenizer or {})
        torch.save(ckpt, t / "changed.pt")
        return ["transformers", str(t / "changed.pt"), str(t / "hf")], None

    return setup


def _transformers_export(c, r, t):
    """A folder with a transformers checkpoint's weights but no config.json, given to translate.py."""
    (t / "hf").mkdir()
    write(t / "hf" / "mt_export.json", "{}")
    write(t / "hf" / "model.safetensors", b"")
    return [f"checkpoint={t / 'hf'}"], "a dog\n"


def _hub_copy(name: str, drop: str | None = None, config: dict | None = None, *args, tokenizer: dict | None = None,
              damage: str | None = None):  # fmt: skip
    """A copy of a tiny transformers checkpoint (tests/hub_models.py) without the file `drop` (or with the file
    `damage` damaged), or with `config`'s keys in its config.json (`tokenizer`'s in its tokenizer_config.json), given
    to translate.py with `args`."""

    def setup(c, r, t):
        from tests.hub_models import hub_model

        shutil.copytree(hub_model(name), t / "hf")
        if drop:
            (t / "hf" / drop).unlink()
        if damage:
            (t / "hf" / damage).write_bytes(b'{"half a file')
        for file, keys in (("config.json", config), ("tokenizer_config.json", tokenizer)):
            if keys:
                path = t / "hf" / file
                path.write_text(json.dumps({**json.loads(path.read_text()), **keys}))
        return [f"checkpoint={t / 'hf'}", *args], "Eine Tablette am Tag.\n"

    return setup


def _fresh(setup):
    """A row's setup with a run dir of its own: its corpus is not the finished run's (another format, directions,
    corpora), which in the finished run's dir would be refused first, as another task's dir."""

    def fresh(c, r, t):
        args, stdin = setup(c, r, t)
        return [*args, f"run_dir={t / 'fresh'}"], stdin

    return fresh


def _hub_parent(name: str):
    """A tiny transformers checkpoint (tests/hub_models.py: de->en) as the parent of a run on the xx->yy corpus."""

    def setup(c, r, t):
        from tests.hub_models import hub_model

        return [f"train.init_from={hub_model(name)}"], None

    return setup


def _separate_tokenizers():
    ckpt = {}

    def setup(c, r, t):
        ckpt.update(torch.load(r / "checkpoint_best.pt", weights_only=False)["tokenizer"])
        return _to_transformers(tokenizer={"tgt": ckpt["src"]})(c, r, t)

    return setup


HELD: list = []  # sockets kept open while the row runs


def _taken_port(c, r, t):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    HELD.append(s)
    return [f"checkpoint={r}", f"port={s.getsockname()[1]}"], None


def _keys(text: str):
    def setup(c, r, t):
        return [f"checkpoint={r}", f"api_keys={write(t / 'keys.txt', text)}"], None

    return setup


def _two_models(second: str, *extra):
    def setup(c, r, t):
        return [f"checkpoint={{de: {r}, fr: {r / second}}}", *extra], None

    return setup


def _references(c, r, t):
    write(t / "refs.yy", "one\ntwo\nthree\n")
    return [f"checkpoint={r}", f"references={t / 'refs.yy'}"], "a dog\nthe cat\n"


def _export_beside(c, r, t):
    (t / "work").mkdir()
    write(t / "work" / "notes.txt", "mine")
    return ["release", str(r), str(t / "work")], None


def _multilingual_references(c, r, t):
    """A multilingual model (xx->yy, xx->zz) whose corpus has no test.zz: references=test with tgt_lang=zz."""
    for split in ("train", "valid"):
        write(c / f"{split}.zz", "".join(" ".join(w + w for w in line.split()) + "\n"
                                         for line in lines_of(c / f"{split}.xx")))  # fmt: skip
    multi = t / "multi"
    args = [a for a in train_args(c, multi) if not a.startswith("data.tgt_lang")]
    p = run([*args, "data.tgt_lang=yy", "data.directions=[xx-yy,xx-zz]", "data.test_splits=[]"])
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return [f"checkpoint={multi}", "tgt_lang=zz", "references=test"], "a dog\n"


def _parent(*args):
    """A copy of the finished run as the parent of a fine-tuning run (train.init_from), with `args`."""

    def setup(c, r, t):
        shutil.copytree(r, t / "parent")
        return [f"train.init_from={t / 'parent'}", *(a.format(t=t, r=r, c=c) for a in args)], None

    return setup


def _parent_other_tokenizer(c, r, t):
    (path,), _ = _other_tokenizer(c, r, t)
    return _parent(path)(c, r, t)


def _compare(*args):
    def setup(c, r, t):
        write(t / "a.txt", "one\ntwo\n")
        write(t / "b.txt", "one\n")
        return [a.format(t=t, r=r, c=c) for a in args], None

    return setup


def _score(src: str | bytes, tgt: str | bytes, *args, names=("c.src", "c.tgt")):
    def setup(c, r, t):
        a, b = write(t / names[0], src), write(t / names[1], tgt)
        return [f"checkpoint={r}", f"src={a}", f"tgt={b}", *args], None

    return setup


def _score_into_input(c, r, t):
    a, b = write(t / "c.src", "a\n"), write(t / "c.tgt", "b\n")
    return [f"checkpoint={r}", f"src={a}", f"tgt={b}", "keep=0.5", f"output={t}"], None


def _opus_names(c, r, t):
    for lang in ("xx", "yy"):
        (c / f"train.{lang}").rename(c / f"EMEA.xx-yy.{lang}")
    return [], None


def _as_tsv(with_id: bool):
    """The corpus as TSV files (`with_id`: an id column first, which data.columns=[xx,yy] does not name)."""

    def setup(c, r, t):
        for split in ("train", "valid", "test"):
            pairs = zip(lines_of(c / f"{split}.xx"), lines_of(c / f"{split}.yy"))
            write(c / f"{split}.tsv", "".join(f"{i}\t" * with_id + f"{a}\t{b}\n" for i, (a, b) in enumerate(pairs)))
            for lang in ("xx", "yy"):
                (c / f"{split}.{lang}").unlink()
        return (["data.format=tsv", "data.columns=[xx,yy]"] if with_id else []), None

    return setup


def _tmx_of(src: str | None, tgt: str | None):
    """A TMX training file of other languages (None: not XML at all), with data.format=tmx."""

    def setup(c, r, t):
        pairs = zip(lines_of(c / "train.xx"), lines_of(c / "train.yy"))
        from tests.test_first_hour import tmx

        write(c / "train.tmx", tmx(list(pairs), (src, tgt)) if src else "train.xx\tnot xml <\n")
        return ["data.format=tmx", "data.valid_from_train=20", "data.test_splits=[]"], None

    return setup


def _distill(*args):
    """+experiment=distill of the finished run's corpus with `args` ({r}: the finished run, {t}: the row's dir), its
    teacher's translations cached in the row's dir."""

    def setup(c, r, t):
        budget = [] if any(a.startswith("train.max_time=") for a in args) else ["train.max_updates=5"]
        return ["+experiment=distill", f"distill.cache_dir={t / 'teachers'}", f"distill.teacher={r}", *budget,
                *(a.format(t=t, r=r, c=c) for a in args)], None  # fmt: skip

    return setup


def _distill_text(text: bytes):
    def setup(c, r, t):
        write(t / "empty.txt", text)
        return _distill(f"distill.source_text={t / 'empty.txt'}")(c, r, t)

    return setup


def _distill_hub(name: str):
    def setup(c, r, t):
        from tests.hub_models import hub_model

        return _distill(f"distill.teacher={hub_model(name)}")(c, r, t)

    return setup


def _distill_ensemble(c, r, t):
    """An ensemble of the finished run and a copy of it whose tokenizer numbers two of its pieces the other way."""
    ckpt = torch.load(r / "checkpoint_final.pt", weights_only=False)
    tokenizer = json.loads(ckpt["tokenizer"]["src"])
    vocab = tokenizer["model"]["vocab"]
    a, b = list(vocab)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    ckpt["tokenizer"] = {"src": json.dumps(tokenizer), "tgt": None}
    torch.save(ckpt, t / "other.pt")
    return _distill(f"distill.teacher=[{r},{t / 'other.pt'}]")(c, r, t)


CK = "checkpoint={run}"  # replaced by the finished run dir

# translate.py answers each line as soon as it is translated (a program that writes a line and waits gets it): a
# prefix file with more lines than the input is found at the end of the input, after the answers were written.
ANSWERED_BEFORE_THE_ERROR = {"prefix_line_count", "constraints_line_count"}

ROWS = [
    # data
    ("data_dir_missing", "train", _args("data.dir=/nonexistent/corpus"), "/nonexistent/corpus' is not a directory"),
    ("split_missing", "train", _missing_split, "valid.yy[.gz]: no such file"),
    ("split_missing_says_what_to_add", "train", _missing_split, "add data.valid_from_train=500"),
    (
        "hub_fallback_folder_missing",
        "train",
        _fresh(_args("data=multi30k", "data.dir=/nonexistent/multi30k")),
        "data.dir='/nonexistent/multi30k' is not a directory, and hub dataset",
    ),  # fmt: skip
    ("file_unreadable", "train", _dangling, "train.yy"),
    ("line_counts_differ", "train", _mismatched, "train"),
    ("not_utf8", "train", _not_utf8, "train.xx:3: bytes that are not UTF-8"),
    ("gzip_truncated", "train", _truncated_gzip, "train.xx.gz: not a readable gzip file"),
    ("corpus_empty", "train", _empty, "no non-empty sentence pairs"),
    ("tsv_wrong_columns", "train", _fresh(_tsv), "train.tsv:5: 1 tab-separated field(s)"),
    ("jsonl_not_json", "train", _fresh(_jsonl("{not json")), "train.jsonl:7: not valid JSON"),
    ("jsonl_lacks_language", "train", _fresh(_jsonl('{"xx": "a dog"}')), "train.jsonl:7: no 'xx' and 'yy' keys"),
    ("language_unknown", "train", _args("data.src_lang=fr"), "train.fr"),
    ("same_languages", "train", _args("data.tgt_lang=xx"), "data.src_lang and data.tgt_lang"),
    # config
    ("override_misspelt", "train", _args("train.max_epoch=3"), "train.max_epoch"),
    ("override_ill_typed", "train", _args("train.max_epochs=many"), "train.max_epochs=many"),
    ("override_unknown_key", "train", _args("+trian.lr=1"), "trian"),
    ("group_option_unknown", "train", _args("model=transformer_huge"), "no model named 'transformer_huge'; did"),
    ("experiment_without_plus", "train", _args("experiment=quickstart"), "add it with a +: +experiment=quickstart"),
    ("experiment_misspelt", "train", _args("+experiment=quikstart"), "did you mean quickstart? (the experiment"),
    ("key_misspelt_nearest", "train", _args("train.max_tme=5"), "has no key 'max_tme'; did you mean train.max_time?"),
    ("value_not_a_number", "train", _args("train.max_time=abc"), "train.max_time=abc: 'abc' is not a number"),
    ("translate_key_misspelt", "translate", _args(CK, "decode.beam_sise=3"), "did you mean decode.beam_size?"),
    ("choice_unknown", "train", _args("train.schedule=cosine"), "train.schedule='cosine'"),
    ("size_negative", "train", _args("train.max_tokens=-5"), "train.max_tokens=-5"),
    ("rdrop_alpha_negative", "train", _args("train.rdrop_alpha=-1"), "train.rdrop_alpha=-1.0 is below its minimum"),
    ("word_dropout_not_probability", "train", _args("train.tgt_word_dropout=1.5"), "train.tgt_word_dropout=1.5 is a"),
    ("heads_do_not_divide", "train", _args("model.d_model=30", "model.n_heads=4"), "model.d_model=30"),
    ("probability_out_of_range", "train", _args("model.dropout=1.5"), "model.dropout=1.5"),
    ("beam_size_zero", "train", _args("decode.beam_size=0"), "decode.beam_size=0"),
    ("nbest_above_beam", "translate", _args(CK, "decode.beam_size=2", "decode.nbest=3"), "decode.nbest=3"),
    ("max_tokens_below_longest", "train", _args("train.max_tokens=5"), "train.max_tokens=5"),
    (
        "resume_other_tokenizer_config",
        "train",
        _args("tokenizer.vocab_size=50"),
        "trained with tokenizer.vocab_size=60",
    ),
    # checkpoints
    ("resume_changed_batches", "train", _args("train.max_tokens=400"), "train.max_tokens=300, this command"),
    (
        "resume_reversed_direction",
        "train",
        _args("data.src_lang=yy", "data.tgt_lang=xx", "train.resume_anyway=true"),
        "was trained with data.src_lang='xx', this command data.src_lang='yy'; a run dir holds one corpus and one",
    ),  # fmt: skip
    (
        "resume_reversed_direction_before_the_probe",
        "train",
        _args("+experiment=auto", "train.max_time=5", "data.src_lang=yy", "data.tgt_lang=xx"),
        "a run dir holds one corpus and one direction",
    ),  # fmt: skip
    ("tilde_in_a_path", "train", _args("data.dir=~/corpus"), "data.dir=~/corpus: ~ is not expanded here; write $HOME"),
    (
        "relative_data_dir_missing",
        "train",
        _args("data.dir=no/such/corpus"),
        f"data.dir='no/such/corpus' is not a directory ({ROOT / 'no/such/corpus'})",
    ),  # fmt: skip
    (
        "checkpoint_an_empty_folder",
        "translate",
        lambda c, r, t: ([f"checkpoint={(t / 'empty').mkdir() or t / 'empty'}"], None),
        "the folder is empty: no model there",
    ),  # fmt: skip
    ("resume_other_model", "train", _args("model.d_ff=128"), "checkpoint_last.pt: was trained with a different model"),
    ("resume_other_tokenizer", "train", _other_tokenizer, "checkpoint_last.pt: was trained with"),
    ("checkpoint_missing", "translate", _args("checkpoint=/nonexistent/model.pt"), "/nonexistent/model.pt"),
    ("checkpoint_not_given", "translate", _args(), "checkpoint is required"),
    ("checkpoint_other_format", "translate", _other_format, "other.pt: not a checkpoint of this toolkit"),
    ("checkpoint_truncated", "translate", _truncated_ckpt, "cut.pt: not a readable checkpoint"),
    ("checkpoint_not_a_pickle", "translate", _not_a_pickle, "random.pt: not a readable checkpoint"),
    # translate.py's files
    ("input_missing", "translate", _args(CK, "input=/nonexistent/in.txt"), "input=/nonexistent/in.txt"),
    ("input_not_utf8", "translate", lambda c, r, t: ([f"checkpoint={r}"], b"a dog\n\xff\xfe\n"), "stdin:2"),
    ("output_unwritable", "translate", _args(CK, "output=/nonexistent/dir/out.txt"), "output=/nonexistent/dir"),
    ("references_line_count", "translate", _references, "refs.yy has 3 lines but the input has 2"),
    ("references_split_unknown", "translate", _args(CK, "references=no_such_split"), "references=no_such_split"),
    ("prefix_line_count", "translate", _prefixes("red house\n\n\n"), "prefixes.txt: line 2 has no input line"),
    ("prefix_too_long", "translate", _prefixes("the " * 40 + "\n"), "prefixes.txt:1: the prefix has 40 tokens"),
    # terminology: constraints and glossaries
    ("constraints_missing", "translate", _args(CK, "constraints=/nonexistent/c.txt"), "constraints=/nonexistent/c.txt"),
    ("constraints_line_count", "translate", _constraints("house\n\n\n", "decode.beam_size=2"), "line 2 has no input"),
    ("constraints_with_greedy", "translate", _constraints("house\n"), "constraints need decode.beam_size >= 2"),
    (
        "constraint_unknown_characters",
        "translate",
        _constraints("Ωmega\n", "decode.beam_size=2"),
        "cons.txt:1: the constraint 'Ωmega'",
    ),
    (
        "constraint_order_unknown",
        "translate",
        _args(CK, "decode.constraint_order=sorted"),
        "decode.constraint_order='sorted'",
    ),
    ("constraints_with_ctranslate2", "translate", _constraints_ct2, "CTranslate2 has no constrained beam search"),
    ("glossary_missing", "translate", _args(CK, "glossary=/nonexistent/g.tsv"), "glossary=/nonexistent/g.tsv: no such"),
    ("glossary_without_tab", "translate", _glossary("dog Hund\n"), "g.tsv:1: expected 'source term<TAB>target term'"),
    ("glossary_two_translations", "translate", _glossary("dog\tHund\ndog\tRüde\n"), "g.tsv:2: 'dog' is translated"),
    (
        "glossary_ignore_case_two_translations",
        "translate",
        _glossary("istanbul\tIstanbul\nİSTANBUL\tX\n", "decode.beam_size=2", "glossary_ignore_case=true"),
        "g.tsv:2: 'İSTANBUL' is translated 'X' here but 'Istanbul'",
    ),
    ("glossary_empty_source_term", "translate", _glossary("\tHaus\n"), "g.tsv:1: expected 'source term<TAB>target"),
    (  # refused before the first line (before: line 1 translated, then exit 2 at the line holding a term)
        "glossary_with_greedy_search",
        "translate",
        _glossary("dog\tHund\n", "decode.beam_size=1", "stream_lines=1", stdin="a cat\nthe dog\n"),
        "constraints need decode.beam_size >= 2",
    ),
    ("glossary_greedy_server", "serve", _glossary("dog\tHund\n", "port=0"), "constraints need decode.beam_size >= 2"),
    ("glossary_with_ctranslate2", "serve", _glossary_ct2, "CTranslate2 has no constrained beam search"),
    (
        "max_glossary_terms_zero",
        "serve",
        _args(CK, "max_glossary_terms=0"),
        "max_glossary_terms=0 is below its minimum",
    ),
    ("batch_rows_zero", "serve", _args(CK, "batch_rows=0"), "batch_rows=0 is below its minimum 1"),
    ("output_format_unknown", "translate", _args(CK, "output_format=json"), "output_format='json' is not one of"),
    (
        "output_format_jsonl_with_nbest",
        "translate",
        _args(CK, "output_format=jsonl", "decode.nbest=2", "decode.beam_size=2"),
        "output_format=jsonl writes one scored translation a line",
    ),
    ("output_format_jsonl_with_split", "translate", _args(CK, "output_format=jsonl", "split=true"), "unset split"),
    ("flag_below_without_jsonl", "translate", _args(CK, "flag_below=-1"), "flag_below=-1.0 marks lines of"),
    ("confidence_unknown", "translate", _args(CK, "output_format=jsonl", "confidence=qe"), "confidence='qe' is not"),
    (
        "mc_passes_one",
        "translate",
        _args(CK, "output_format=jsonl", "confidence=mc_dropout", "mc_passes=1"),
        "mc_passes=1: MC dropout needs 2 or more passes",
    ),
    ("mc_dropout_with_ctranslate2", "translate", _mc_dropout_ct2, "confidence=mc_dropout needs this project's model"),
    ("split_with_nbest", "translate", _args(CK, "split=true", "decode.nbest=2", "decode.beam_size=2"), "split=true: a"),
    ("split_with_plot", "translate", _args(CK, "split=true", "plot_attention=/tmp/a.png"), "unset split"),
    ("sampling_with_beam", "translate", _args(CK, "decode=sample", "decode.beam_size=4"), "decode.beam_size=1, not 4"),
    ("topp_out_of_range", "translate", _args(CK, "decode=sample", "decode.topp=0"), "decode.topp=0.0 is outside"),
    ("port_out_of_range", "serve", _args(CK, "port=99999"), "port=99999 is outside 0-65535"),
    ("port_taken", "serve", _taken_port, "already in use on 127.0.0.1"),
    ("host_unknown", "serve", _args(CK, "host=no-such-host.invalid"), "host=no-such-host.invalid: unknown host"),
    (
        "api_keys_missing",
        "serve",
        _args(CK, "api_keys=/nonexistent/keys.txt"),
        "api_keys=/nonexistent/keys.txt: no such",
    ),
    ("api_keys_spaces", "serve", _keys("# team\nalice: two words\n"), "keys.txt line 2: a key is one word"),
    ("api_keys_twice", "serve", _keys("a:k1k1k1k1k1k1k1k1\nb:k1k1k1k1k1k1k1k1\n"), "keys.txt line 2: this key is"),
    ("api_keys_short", "serve", _keys("alice:s3cr3t:xy\n"), "keys.txt line 1: a key of 9 characters, shorter than 16"),
    ("api_keys_empty", "serve", _keys("# nobody yet\n"), "keys.txt: no keys in it"),
    ("requests_per_minute_negative", "serve", _args(CK, "requests_per_minute=-1"), "requests_per_minute=-1: give"),
    ("tokens_per_minute_negative", "serve", _args(CK, "tokens_per_minute=-5"), "tokens_per_minute=-5: give"),
    ("model_name_bad", "serve", _args("checkpoint={de/x: /tmp}"), "checkpoint.de/x: a model name is letters"),
    ("model_missing", "serve", _two_models("nope.pt"), "nope.pt"),
    ("glossary_two_models", "serve", _two_models("checkpoint_last.pt", "glossary=/tmp/g.tsv"), "with several models"),
    ("models_same_dir_name", "serve", _args("checkpoint=[/tmp/a/run,/tmp/b/run]"), "the same directory name"),
    # exports, multilingual runs
    (
        "export_into_its_run_dir",
        "export",
        lambda c, r, t: (["release", str(r), str(r)], None),
        "holds the checkpoint being exported",
    ),
    ("export_beside_other_files", "export", _export_beside, "not empty and not an earlier release export"),
    (
        "transformers_learned_positions",
        "export",
        _to_transformers(model={"positions": "learned"}),
        "model.positions=learned: transformers' Marian and Pegasus add sinusoidal positions only",
    ),
    (
        "transformers_moses",
        "export",
        _to_transformers(
            tokenizer={"pretokenize": {"kind": "moses", "src_lang": "en", "tgt_lang": "de", "joiner": "￭"}}
        ),
        "tokenizer.pretokenize=moses: transformers' tokenizers cannot run Moses",
    ),
    (
        "transformers_case_markup",
        "export",
        _to_transformers(tokenizer={"pretokenize": {"kind": "none", "case_markup": True}}),
        "tokenizer.case_markup=true: transformers' tokenizers cannot mark case",
    ),
    (
        "transformers_multilingual",
        "export",
        _to_transformers(data={"directions": ["xx-yy", "xx-zz"]}),
        "a multilingual model (data.directions)",
    ),
    ("transformers_dir_without_config", "translate", _transformers_export, "weights but no config.json"),
    (
        "transformers_model_type_unknown",
        "translate",
        _hub_copy("marian_shared", None, {"model_type": "t5"}),
        "model_type 't5' is not supported",
    ),  # fmt: skip
    (
        "transformers_tokenizer_file_missing",
        "translate",
        _hub_copy("marian_shared", "target.spm"),
        "target.spm is missing",
    ),  # fmt: skip
    (
        "transformers_hub_id_offline",
        "translate",
        _args("checkpoint=Helsinki-NLP/opus-mt-xx-yy"),
        "Helsinki-NLP/opus-mt-xx-yy: not in the Hugging Face cache and the Hub cannot be reached",
    ),  # fmt: skip
    (
        "transformers_tgt_lang_without_token",
        "translate",
        _hub_copy("marian_multi", None, None, "tgt_lang=cs"),
        "tgt_lang=cs: this model has no token for that language",
    ),  # fmt: skip
    (
        "transformers_nllb_without_src_lang",
        "translate",
        _hub_copy("nllb", None, None, "tgt_lang=en", tokenizer={"src_lang": None, "tgt_lang": None}),
        "src_lang is needed by this multilingual model",
    ),  # fmt: skip
    (
        "transformers_damaged_vocab",
        "translate",
        _hub_copy("marian_shared", damage="vocab.json"),
        "vocab.json is not readable",
    ),
    (
        "transformers_damaged_spm",
        "translate",
        _hub_copy("marian_shared", damage="source.spm"),
        "source.spm is not readable",
    ),
    (
        "transformers_damaged_tokenizer",
        "translate",
        _hub_copy("nllb", damage="tokenizer.json"),
        "tokenizer.json is not readable",
    ),
    (
        "transformers_no_pad_id",
        "translate",
        _hub_copy("nllb", None, {"pad_token_id": None}),
        "config.json has no pad_token_id",
    ),
    (
        "transformers_no_d_model",
        "translate",
        _hub_copy("marian_shared", None, {"d_model": None}),
        "config.json has no d_model",
    ),
    (
        "transformers_positions_as_text",
        "translate",
        _hub_copy("marian_shared", None, {"max_position_embeddings": "512"}),
        "max_position_embeddings='512' in config.json is not a whole number",
    ),  # fmt: skip
    (
        "transformers_nllb_legacy_behaviour",
        "translate",
        _hub_copy("nllb", None, None, tokenizer={"legacy_behaviour": True}),
        "tokenizer_config.json sets legacy_behaviour: true",
    ),  # fmt: skip
    (
        "transformers_embedding_norm",
        "translate",
        _hub_copy("marian_shared", None, {"normalize_embedding": True}),
        "normalize_embedding=True in config.json is not supported",
    ),  # fmt: skip
    ("transformers_two_tokenizers", "export", _separate_tokenizers(), "a transformers tokenizer holds one vocabulary"),
    (
        "transformers_pre_norm_untied",
        "export",
        _to_transformers(model={"norm": "pre", "tie_embeddings": "none"}),
        "a pre-norm model with model.tie_embeddings=none: Pegasus",
    ),
    ("references_in_another_language", "translate", _multilingual_references, "test.zz[.gz]"),
    (
        "directions_corpus_with_a_tag",
        "train",
        _fresh(lambda c, r, t: (["data.directions=[xx-yy]", f"data.corpora=[{{dir:'{c}',tag:'<bt>'}}]"], None)),
        "data.corpora[0].tag=<bt>: in a data.directions run",
    ),
    (
        "directions_tokenizer_without_token",
        "train",
        _fresh(lambda c, r, t: (["data.directions=[xx-yy]", f"tokenizer.path={r / 'tokenizer.json'}"], None)),
        "has no <2yy> token",
    ),
    # a user's own corpus and paths
    ("local_without_languages", "train_without_languages", _args(), "data.src_lang is required: the language of"),
    ("corpus_in_utf16", "train", _utf16, "a UTF-16 file (it starts with UTF-16's byte-order mark)"),
    ("test_split_line_counts", "train", _test_split_cut, "test.xx has 20 lines but"),
    ("opus_moses_file_names", "train", _opus_names, "data.train_split=EMEA.xx-yy"),
    ("a_folder_of_tsv_files", "train", _as_tsv(False), "the folder holds train.tsv: add data.format=tsv"),
    ("tsv_with_an_unnamed_column", "train", _fresh(_as_tsv(True)), "3 tab-separated fields but data.columns names 2"),
    ("tmx_without_the_languages", "train", _fresh(_tmx_of("de", "en")), "no translation unit holds both xx and yy"),
    ("tmx_not_xml", "train", _fresh(_tmx_of(None, None)), "train.tmx: not well-formed XML"),
    ("local_path_like_a_hub_id", "translate", _args("checkpoint=runs/no-such-run"), "runs/no-such-run: no such dir"),
    # distillation (+experiment=distill)
    ("distill_without_teacher", "train", _args("+experiment=distill", "train.max_updates=5"), "needs a teacher"),
    (
        "distill_translate_only_alone",
        "train",
        _args("distill.translate_only=true"),
        "is stage 1 of +experiment=distill",
    ),
    ("distill_into_another_runs_dir", "train", _distill("train.max_updates=5"), "that is not a distillation"),
    (
        "distill_teacher_missing",
        "train",
        _distill("distill.teacher=/nonexistent/teacher"),
        "distill.teacher: /nonexistent/teacher: no such file or directory",
    ),  # fmt: skip
    (
        "distill_teacher_other_direction",
        "train",
        _distill("distill.teacher={r}", "data.src_lang=yy", "data.tgt_lang=xx", "run_dir={t}/reversed"),
        "translates xx->yy, not the corpus's",
    ),
    (
        "distill_nllb_teacher_unknown_language",
        "train",
        _distill_hub("nllb"),
        "distill.teacher: src_lang=xx: this model has no token for that language",
    ),  # fmt: skip
    ("distill_ensemble_other_vocabularies", "train", _distill_ensemble, "its target vocabulary differs from"),
    ("distill_source_text_empty", "train", _distill_text(b"\n\n"), "empty.txt: no text in it"),
    ("distill_source_text_not_utf8", "train", _distill_text(b"ein Satz\ncaf\xe9\n"), "empty.txt:2"),
    ("distill_source_text_missing", "train", _distill("distill.source_text={t}/none.txt"), "none.txt: no such file"),
    (
        "distill_budget_too_short",
        "train",
        _distill("distill.teacher={r}", "train.max_time=0.001"),
        "give train.max_time=1 or more",
    ),  # fmt: skip
    ("distill_mix_unknown", "train", _distill("distill.teacher={r}", "distill.mix=half"), "distill.mix='half'"),
    (
        "distill_share_out_of_range",
        "train",
        _distill("distill.teacher={r}", "distill.teacher_share=1.5"),
        "distill.teacher_share=1.5",
    ),  # fmt: skip
    ("distill_with_auto", "train", _distill("distill.teacher={r}", "auto.enabled=true"), "with auto.enabled"),
    (
        "distill_teacher_decode_unknown",
        "train",
        _distill("distill.teacher={r}", "+distill.teacher_decode.beam=1"),
        "distill.teacher_decode.beam is not a decode setting",
    ),  # fmt: skip
    (
        "distill_teacher_decode_bad_value",
        "train",
        _distill("distill.teacher={r}", "+distill.teacher_decode.beam_size=0"),
        "distill.teacher_decode: decode.beam_size=0",
    ),  # fmt: skip
    (
        "distill_teacher_decode_nbest",
        "train",
        _distill("distill.teacher={r}", "+distill.teacher_decode.nbest=2", "+distill.teacher_decode.beam_size=4"),
        "stage 1 keeps one translation a line",
    ),  # fmt: skip
    # fine-tuning (train.init_from)
    ("init_from_missing", "train", _args("train.init_from=/nonexistent/run"), "train.init_from=/nonexistent/run: no"),
    (
        "init_from_not_a_model",
        "train",
        lambda c, r, t: ([f"train.init_from={write(t / 'x.pt', b'junk')}"], None),
        "x.pt: not a readable checkpoint",
    ),
    ("init_from_its_own_run_dir", "train", lambda c, r, t: ([f"train.init_from={r}"], None), "this run's own dir"),
    (
        "init_from_with_resume_path",
        "train",
        _parent("train.resume={r}/checkpoint_last.pt"),
        "one run starts from one model",
    ),
    ("init_from_shape_override", "train", _parent("model.d_ff=96"), "model.d_ff=96: the parent"),
    ("init_from_other_tokenizer", "train", _parent_other_tokenizer, "not the tokenizer of the parent"),
    (
        "init_from_without_direction_token",
        "train",
        _fresh(_parent("data.directions=[xx-yy]")),
        "its tokenizer has no <2yy>",
    ),
    (
        "init_from_transformers_other_direction",
        "train",
        _hub_parent("marian_shared"),
        "data.src_lang=xx data.tgt_lang=yy: the parent (train.init_from=",
    ),  # fmt: skip
    ("init_from_nllb_unknown_language", "train", _hub_parent("nllb"), "src_lang=xx: this model has no token"),
    ("freeze_unknown_part", "train", _parent("train.freeze=[attention]"), "train.freeze: 'attention' is not a part"),
    ("valid_from_train_too_many", "train", _args("data.valid_from_train=5000"), "data.valid_from_train=5000"),
    ("model_init_unknown", "train", _args("model.init=he"), "model.init='he' is not one of xavier, fairseq"),
    ("pretokenize_unknown", "train", _args("tokenizer.pretokenize=spacy"), "tokenizer.pretokenize='spacy' is not one"),
    ("case_markup_not_bool", "train", _args("tokenizer.case_markup=maybe"), "tokenizer.case_markup"),
    ("character_coverage_zero", "train", _args("tokenizer.character_coverage=0"), "tokenizer.character_coverage=0.0"),
    ("character_coverage_over_one", "train", _args("tokenizer.character_coverage=1.5"), "use a value in (0, 1]"),
    (
        "case_markup_with_lowercase",
        "train",
        _args("tokenizer.case_markup=true", "tokenizer.normalization=NFC+Lowercase"),
        "tokenizer.case_markup=true with tokenizer.normalization=NFC+Lowercase",
    ),
    (
        "pretokenize_with_directions",
        "train",
        _args("tokenizer.pretokenize=moses", "data.directions=[xx-yy]"),
        "tokenizer.pretokenize=moses tokenizes one source and one target language",
    ),
    (
        "auto_too_few_pairs",
        "train",
        _args("+experiment=auto", "train.max_updates=5", "auto.probe=false"),
        "+experiment=auto: 200 training pairs, fewer than 1,000: too few",
    ),
    ("auto_without_budget", "train", _args("+experiment=auto"), "+experiment=auto chooses the recipe for a budget"),
    ("auto_probe_not_bool", "train", _args("+experiment=auto", "auto.probe=maybe"), "auto.probe"),
    ("auto_dry_run_not_bool", "train", _args("+experiment=auto", "auto.dry_run=perhaps"), "auto.dry_run"),
    ("batching_unknown", "train", _args("data.batching=sorted"), "data.batching='sorted' is not one of pools, fixed"),
    (
        "batching_fixed_with_bpe_dropout",
        "train",
        _args("data.batching=fixed", "train.bpe_dropout=0.1"),
        "data.batching=fixed keeps one set of batches for the run, which train.bpe_dropout",
    ),  # fmt: skip
    ("release_without_pretokenize", "translate", _release_without_pretokenize, "pretokenize.json is missing"),
    ("prefix_moses_would_change", "translate", _legacy_moses_prefix, 'prefixes.txt:2: the prefix "geht\'s" would'),
    # mt.compare
    (
        "compare_line_counts",
        "compare",
        _compare("{t}/a.txt", "{t}/b.txt", "--refs", "{t}/a.txt"),
        "b.txt has 1 lines but the references have 2",
    ),
    ("compare_split_unknown", "compare", _compare("{r}", "{r}", "--split", "nope"), "nope.hyp: no such file"),
    # python -m mt.score
    ("score_line_counts", "score", _score("a\nb\n", "a\n"), "c.src has 2 lines but tgt="),
    ("score_not_utf8", "score", _score("a\n", b"caf\xe9\n"), "c.tgt:1: bytes that are not UTF-8"),
    ("score_empty", "score", _score("", ""), "c.src: no text in it"),
    (
        "score_direction",
        "score",
        _score("a\n", "b\n", names=("c.de", "c.en")),
        "translates xx->yy but src/tgt are de->en",
    ),
    (
        "score_unknown_key",
        "score",
        _score("a\n", "b\n", "kep=0.9"),
        "'kep=0.9': not a setting of mt.score; did you mean keep=?",
    ),
    ("score_batch_lines_zero", "score", _score("a\n", "b\n", "batch_lines=0"), "batch_lines=0 is below its minimum 1"),
    ("score_reverse_missing", "score", _score("a\n", "b\n", "reverse=/nonexistent/run"), "/nonexistent/run: no such"),
    ("score_output_over_input", "score", _score_into_input, "would overwrite the input it is read from"),
    ("score_keep_alone", "score", _score("a\n", "b\n", "keep=0.9"), "keep= and output= go together"),
    ("score_keep_range", "score", _score("a\n", "b\n", "keep=2", "output=/tmp/x"), "keep=2.0: give the fraction"),
    # benchmarks/quality/val_curves.py
    (
        "val_curves_names_count",
        "val_curves",
        lambda c, r, t: (["--ours", str(r), "--names", "a", "b", "--out", str(t / "v.png")], None),
        "--names gives 2 names for 1 runs",
    ),
]


def command(entry: str, extra: list[str], corpus: Path, run_dir: Path) -> list[str]:
    if entry == "train":
        return train_args(corpus, run_dir) + extra
    if entry == "train_without_languages":
        return [a for a in train_args(corpus, run_dir) if not a.startswith(("data.src_lang=", "data.tgt_lang="))]
    if entry == "serve":
        return ["serve.py", "device=cpu", *extra]
    if entry == "export":
        return ["-m", "mt.export", *extra]
    if entry == "compare":
        return ["-m", "mt.compare", *extra]
    if entry == "score":
        return ["-m", "mt.score", *extra]
    if entry == "val_curves":
        return ["benchmarks/quality/val_curves.py", *extra]
    return ["translate.py", *extra]


@pytest.fixture(scope="module")
def outcomes(request, finished, tmp_path_factory) -> dict:
    """Each selected row's (run dir, its files before, stdin, the finished process), or the exception its setup raised.

    A row's process would mostly be a Python start-up that imports torch (~3 s of one core): the rows' processes are
    forked from two warm interpreters (tests/warm_start.py; the `finished` run starts cold) and run two at a time,
    each in its own copy of the corpus and the finished run. The setups run here, in the catalogue's order, so that
    a row's files are in place before its process starts.
    """
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_bad_input_is_one_line_exit_2_and_destroys_nothing"
    }
    corpus0, run0 = finished
    results: dict = {}
    starters: Queue[WarmStart] = Queue()
    for _ in range(2):
        starters.put(WarmStart(ENV, ROOT))

    def warm_run(args: list[str], stdin: str | None) -> subprocess.CompletedProcess:
        starter = starters.get()
        try:
            return starter.run(args, stdin.encode() if isinstance(stdin, str) else stdin)
        finally:
            starters.put(starter)

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            for name, entry, setup, _ in ROWS:
                if name not in selected:
                    continue
                tmp = tmp_path_factory.mktemp(name)
                corpus, run_dir = tmp / "corpus", tmp / "run"
                shutil.copytree(corpus0, corpus)
                shutil.copytree(run0, run_dir)
                before = snapshot(run_dir)
                try:
                    extra, stdin = setup(corpus, run_dir, tmp)
                except Exception as e:  # a setup that fails fails its own row, not the catalogue
                    results[name] = e
                    continue
                extra = [a.replace(CK, f"checkpoint={run_dir}") for a in extra]
                if entry == "translate" and stdin is None:
                    stdin = "a dog\n"
                results[name] = (
                    run_dir,
                    before,
                    stdin,
                    pool.submit(warm_run, command(entry, extra, corpus, run_dir), stdin),
                )
    finally:  # the servers end even when a setup outside a row's own fails
        while not starters.empty():
            starters.get().close()
    return {name: finish(r) for name, r in results.items()}


def finish(row: tuple | Exception) -> tuple | Exception:
    """A row's outcome with its process finished, or the exception that stopped it."""
    if isinstance(row, Exception):
        return row
    try:
        return (*row[:3], row[3].result())
    except Exception as e:
        return e


@pytest.mark.parametrize("name, expected", [(r[0], r[3]) for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_exit_2_and_destroys_nothing(outcomes, name, expected):
    if isinstance(outcomes[name], Exception):
        raise outcomes[name]
    run_dir, before, stdin, p = outcomes[name]
    err = p.stderr.decode("utf-8", errors="replace")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert p.returncode == 2, err[-2000:]
    assert len(errors) == 1 and expected in errors[0], err[-2000:]
    others = [line for line in err.splitlines() if line and not line.startswith("error:")]
    assert all(LOG_RECORD.match(line) for line in others), others  # the run's own progress log, nothing else
    assert "Traceback" not in err
    if name in ANSWERED_BEFORE_THE_ERROR:  # one line per input line, all of them answered
        assert len(p.stdout.decode().splitlines()) == len((stdin or "").splitlines())
    else:
        assert p.stdout == b""
    after = snapshot(run_dir)
    assert {k: v for k, v in after.items() if k in before} == before  # every earlier file as it was


def test_the_catalogue_covers_25_kinds():
    assert len(ROWS) >= 25 and len({r[0] for r in ROWS}) == len(ROWS)
