"""`python -m mt.export transformers`: the exported model, loaded by transformers offline, computes this project's
logits and decodes greedily token for token as translate.py does (post-norm as Marian, pre-norm as Pegasus)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mt.config import DecodeConfig
from mt.data.tokenizer import EOS, PAD
from mt.decode.batched import translate_ids
from tests.conftest import ROOT, train_tiny
from tests.test_export import sources

transformers = pytest.importorskip("transformers")

SHAPES = [
    dict(norm="post", tie_embeddings="all"),
    dict(norm="post", tie_embeddings="none"),
    dict(norm="post", tie_embeddings="decoder"),
    dict(norm="pre", tie_embeddings="all"),
]


@pytest.mark.parametrize("model", SHAPES, ids=["post-norm tied", "post-norm untied", "decoder tied", "pre-norm"])
def test_the_transformers_twin_has_the_same_logits_and_greedy_tokens(toy_vocab, model):
    from mt.export.hugging_face import generate_ids, hf_model, probe_difference

    pairs, vocabs = toy_vocab
    m = train_tiny(vocabs, pairs, **model)
    cfg = DecodeConfig(beam_size=1, max_len_a=1.2, max_len_b=3)
    hf = hf_model(m, cfg)
    assert type(hf).__name__ == ("PegasusForConditionalGeneration" if model["norm"] == "pre" else "MarianMTModel")
    assert probe_difference(m, hf) < 1e-4
    src = sources(vocabs, 150)
    ours = [h[0].tokens for h in translate_ids(m, src, cfg, torch.device("cpu"), None)]
    theirs = generate_ids(hf, src, cfg)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert not differ, f"{len(differ)} of {len(src)} differ, e.g. {ours[differ[0]]} vs {theirs[differ[0]]}"
    assert any(len(t) >= 5 for t in theirs)


def test_the_interleaved_sinusoids_are_transformers_halves_after_the_permutation():
    from mt.export.hugging_face import permutation
    from mt.model.transformer import sinusoidal_positions

    ours = sinusoidal_positions(64, 16)
    halves = transformers.MarianMTModel(transformers.MarianConfig(d_model=16, max_position_embeddings=64))
    theirs = halves.model.encoder.embed_positions.weight
    assert torch.allclose(ours[:, permutation(16)], theirs, atol=1e-6)
    assert not torch.allclose(ours, theirs, atol=1e-2)  # the layouts differ without it


def export(run, out, *args):
    return subprocess.run([sys.executable, "-m", "mt.export", "transformers", str(run), str(out), *args],
                          cwd=ROOT, capture_output=True, text=True)  # fmt: skip


@pytest.fixture(scope="module", params=["post", "pre"])
def exported(request, toy_run, tmp_path_factory):
    """(run dir, its transformers export): the session's toy run (post-norm) and a pre-norm one like it."""
    from tests.conftest import write_toy_corpus
    from tests.test_training import make_trainer

    run = toy_run
    if request.param == "pre":
        corpus = write_toy_corpus(tmp_path_factory.mktemp("corpus"))
        run = tmp_path_factory.mktemp("pre_norm_run")
        make_trainer(corpus, run, model={"norm": "pre"}, max_updates=60, max_epochs=10, lr=5e-3).fit(job_start=0)
    out = tmp_path_factory.mktemp("hf") / "model"
    p = export(run, out, "--license", "cc-by-4.0")
    assert p.returncode == 0, p.stderr[-2000:]
    return run, out


def test_an_exported_run_loads_offline_and_translates_its_test_set_as_translate_py(exported, monkeypatch):
    from mt.decode.translator import Translator
    from mt.export.hugging_face import generate_ids
    from mt.model import saved

    run, out = exported
    files = {f.name for f in out.iterdir()}
    assert all(f.stat().st_mode & 0o044 == 0o044 for f in out.iterdir())  # readable by others (umask 022)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "README.md"} <= files
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    pre = saved.load(run)["model_args"]["model"]["norm"] == "pre"
    assert type(model).__name__ == ("PegasusForConditionalGeneration" if pre else "MarianMTModel")
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["suppress_tokens"] == [PAD, 2] and generation["forced_eos_token_id"] == EOS

    translator = Translator.load(str(run), device="cpu", beam_size=1)
    corpus = translator.checkpoint["config"]["data"]["dir"]
    lines = (Path(corpus) / "test.xx").read_text().splitlines()
    ours = translator.translate(lines)
    batch = tokenizer(lines)["input_ids"]
    assert all(ids[-1] == EOS for ids in batch)  # the tokenizer appends </s>, as the model was trained
    theirs = generate_ids(model, [ids[:-1] for ids in batch], translator.decode)
    assert tokenizer.batch_decode(theirs, skip_special_tokens=True) == ours
    assert len(lines) >= 20 and any(len(t) >= 5 for t in theirs)

    # text is text there too: "<s>", "</s>", "<pad>" typed in a line are its characters, not the special ids
    text = "der <s> Hund </s> läuft <pad> <unk>"
    assert tokenizer(text)["input_ids"] == translator.vocabs.src.encode(text) + [EOS]
    assert tokenizer(text)["input_ids"].count(EOS) == 1

    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "license: cc-by-4.0" in card
    assert type(model).__name__ in card and "AutoModelForSeq2SeqLM" in card


def test_a_missing_transformers_is_named_with_its_extra(toy_run, tmp_path, monkeypatch, capsys):
    from mt.export import formats

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(SystemExit) as e:
        formats.main(["transformers", str(toy_run), str(tmp_path / "hf")])
    assert e.value.code == 2
    assert "pip install -e '.[transformers]'" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
