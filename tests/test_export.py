"""CTranslate2 export decodes as this project's search does; release files load without pickle; a hostile .pt is
refused before it runs."""

import json
import random

import pytest
import torch

from mt.config import DecodeConfig
from mt.data.tokenizer import BOS, EOS, PAD
from mt.decode.batched import translate_ids
from tests.conftest import train_tiny

ct2 = pytest.importorskip("ctranslate2")


def sources(vocabs, n: int = 300) -> list[list[int]]:
    """Made-up sentences of the toy words, 1-12 words: some the model has not seen."""
    rng = random.Random(1)
    words = "the a cat dog sees runs big small red house tree and".split()
    return vocabs.src.encode_batch([" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(n)])


@pytest.mark.parametrize(
    "model",
    [dict(norm="post", tie_embeddings="all"), dict(norm="pre", tie_embeddings="none"), dict(tie_embeddings="decoder")],
    ids=["post-norm tied", "pre-norm untied", "decoder tied"],
)
def test_ctranslate2_export_decodes_token_for_token(toy_vocab, tmp_path, model):
    from mt.decode.ct2 import CTranslate2Model
    from mt.export.formats import write_ctranslate2

    pairs, vocabs = toy_vocab
    m = train_tiny(vocabs, pairs, **model)
    out = write_ctranslate2(m, vocabs, tmp_path / "ct2", None, {"decode": {}})
    engine = CTranslate2Model(out, torch.device("cpu"), threads=1)
    src = sources(vocabs)
    for beam in (1, 4):
        cfg = DecodeConfig(beam_size=beam, length_penalty=0.0, max_len_a=1.2, max_len_b=3)
        ours = [h[0].tokens for h in translate_ids(m, src, cfg, torch.device("cpu"), None)]
        theirs = [h[0].tokens for h in engine.translate_ids(src, cfg)]
        # A beam hypothesis cut by the length limit is scored with the </s> we force there, CTranslate2's without:
        # such sentences may rank differently (greedy's tokens are the same either way).
        limits = [int((len(s) + 1) * cfg.max_len_a + cfg.max_len_b) - 1 for s in src]
        cut = {i for i, (a, b, n) in enumerate(zip(ours, theirs, limits)) if beam > 1 and n in (len(a), len(b))}
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b and i not in cut]
        assert not differ, (
            f"beam {beam}: {len(differ)} of {len(src)} differ, e.g. {ours[differ[0]]} vs {theirs[differ[0]]}"
        )
        assert len(cut) < 0.05 * len(src)
    assert any(len(t) >= 5 for t in theirs) and PAD not in sum(theirs, []) and BOS not in sum(theirs, [])
    assert EOS not in sum(theirs, [])


def test_ctranslate2_decodes_every_line_in_one_call_and_each_under_its_own_limit(toy_vocab, tmp_path):
    """CTranslate2 is called as its users call it, once over every line with the largest length limit; the lines
    that reach their own limit there are decoded again under it: the outputs are those of one call per limit."""
    from mt.decode.ct2 import CTranslate2Model
    from mt.export.formats import write_ctranslate2

    pairs, vocabs = toy_vocab
    m = train_tiny(vocabs, pairs)
    engine = CTranslate2Model(write_ctranslate2(m, vocabs, tmp_path / "ct2", None, {"decode": {}}), torch.device("cpu"))
    src = sources(vocabs)
    calls = []
    translate_batch = engine.translator.translate_batch
    engine.translator = type("Counting", (), {"translate_batch": lambda self, lines, **kw: calls.append(
        (len(lines), kw["max_decoding_length"])) or translate_batch(lines, **kw)})()  # fmt: skip
    for beam, a, b in ((1, 1.2, 3), (4, 1.2, 3), (4, 3.0, 10)):
        cfg = DecodeConfig(beam_size=beam, nbest=min(beam, 2), max_len_a=a, max_len_b=b)
        calls.clear()
        mine = engine.translate_ids(src, cfg)
        limits = [max(1, int((len(s) + 1) * a + b)) for s in src]
        assert calls[0] == (len(src), max(limits) - 1)  # every line in the first call
        groups = {n: [i for i, m in enumerate(limits) if m == n] for n in set(limits)}
        one_per_limit = {}
        for rows in groups.values():  # as it was: one call per limit
            for i, h in zip(rows, engine.translate_ids([src[i] for i in rows], cfg)):
                one_per_limit[i] = h
        assert [[h.tokens for h in hs] for hs in mine] == [
            [h.tokens for h in one_per_limit[i]] for i in range(len(src))
        ]
    assert len(calls) > 1  # some lines were held to their own, smaller limit (a = 1.2)


def test_exporting_leaves_the_model_as_it_was(toy_vocab, tmp_path):
    """The spec's arrays are copies: CTranslate2's int8 quantization rewrites them in place."""
    from mt.export.formats import write_ctranslate2

    pairs, vocabs = toy_vocab
    m = train_tiny(vocabs, pairs)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    for q in (None, "int8"):
        write_ctranslate2(m, vocabs, tmp_path / str(q), q, {"decode": {}})
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_release_loads_without_pickle_and_equals_the_checkpoint(toy_corpus, tmp_path, monkeypatch):
    import pickle
    import time

    from safetensors import safe_open

    from mt.export.formats import export_release
    from mt.model import saved
    from tests.test_training import make_trainer

    trainer = make_trainer(toy_corpus, tmp_path / "run", max_updates=3)
    trainer.fit(time.time())
    out = export_release(str(tmp_path / "run" / "checkpoint_last.pt"), tmp_path / "release")
    names = ["README.md", "config.json", "model.safetensors", "tokenizer.json"]
    assert sorted(p.name for p in out.iterdir()) == [".mt-export.json", *names]
    with safe_open(str(out / "model.safetensors"), "pt") as f:  # the tied matrix is stored once
        assert sum(k.endswith("tokens.weight") or k == "output.weight" for k in f.keys()) == 1
    reference, _ = saved.build_model(saved.load(tmp_path / "run" / "checkpoint_last.pt"))

    def no_pickle(*args, **kwargs):
        raise AssertionError("a release was unpickled")

    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(torch, "load", no_pickle)
    model, vocabs = saved.build_model(saved.load(out))
    assert model.state_dict().keys() == reference.state_dict().keys()
    assert all(torch.equal(v, reference.state_dict()[k]) for k, v in model.state_dict().items())
    assert model.output.weight is model.tgt_embed.tokens.weight  # still tied after loading
    assert len(vocabs.src) == reference.src_vocab


class _WritesAFile:
    """Unpickling this calls Path.write_text: what a hostile .pt would do (or worse)."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        from pathlib import Path

        return Path.write_text, (Path(self.target), "ran code from a checkpoint")


def test_a_pt_that_would_run_code_is_refused_before_it_runs(tmp_path):
    from mt import errors
    from mt.model import saved

    target = tmp_path / "written-by-the-pickle.txt"
    torch.save({"format": saved.FORMAT_VERSION, "model": {}, "payload": _WritesAFile(target)}, tmp_path / "x.pt")
    with pytest.raises(errors.CheckpointError, match=r"x\.pt: refused: loading it would call getattr, which no"):
        saved.load(tmp_path / "x.pt")
    assert not target.exists()


def test_a_missing_ctranslate2_is_named_with_its_extra(monkeypatch, tmp_path, capsys):
    import sys

    from mt.export import formats as export

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails as if not installed
    monkeypatch.setattr(export.saved, "load", lambda path: {"path": path})
    monkeypatch.setattr(export.saved, "build_model", lambda ckpt: (object(), object()))
    with pytest.raises(SystemExit) as e:
        export.main(["ctranslate2", "RUN", str(tmp_path / "out")])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "error: CTranslate2 is not installed; pip install -e '.[ctranslate2]' (or pip install ctranslate2)\n"
    )


def test_a_release_carries_a_model_card(tmp_path):
    """README.md in the Hugging Face format: YAML front matter (languages, tags, the test report's metrics), the
    architecture, the training command, the scores with their sacreBLEU signatures, and how to load it."""
    import yaml

    from mt import Translator
    from mt.export.formats import export_release
    from mt.train.finish import finish
    from tests.conftest import write_toy_corpus
    from tests.test_training import make_trainer

    trainer = make_trainer(write_toy_corpus(tmp_path / "corpus"), tmp_path / "run", max_updates=20)
    trainer.fit(job_start=0)
    report = finish(trainer)["reports"][0]
    out = export_release(str(tmp_path / "run"), tmp_path / "release")
    card = (out / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["language"] == ["xx", "yy"] and meta["tags"] == ["translation"]
    metrics = meta["model-index"][0]["results"][0]["metrics"]
    assert [m["value"] for m in metrics] == [report["bleu"], report["bleu_lowercase"], report["chrf"]]
    assert f"{sum(p.numel() for p in trainer.model.parameters()):,} parameters" in body
    assert report["bleu_signature"] in body and report["chrf_signature"] in body
    assert "Translator.load" in body and "translate.py checkpoint=" in body
    assert Translator.load(out, device="cpu").translate(["the cat"])  # the directory the card describes loads


def _files(root) -> dict:
    import hashlib

    files = (p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.mark.parametrize("kind", ["release", "ctranslate2"])
def test_an_export_never_deletes_what_it_did_not_write(toy_run, tmp_path, monkeypatch, capsys, kind):
    """Before: `python -m mt.export release RUN RUN` deleted every checkpoint, metric and report of the run. Now the
    run dir, the dir above it and any directory with other files are refused in one line (exit 2), untouched; an
    earlier export of the same kind is replaced file by file, and a file the user put beside it stays."""
    import shutil

    from mt.export import formats as export

    run = tmp_path / "run"
    shutil.copytree(toy_run, run)
    (tmp_path / "notes.txt").write_text("mine")
    before = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    for source, out in ((run, run), (run / "checkpoint_last.pt", run), (run, tmp_path), (run, "."), (run, "..")):
        with pytest.raises(SystemExit) as e:
            export.main([kind, str(source), str(out)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
        assert "holds the checkpoint being exported" in err or "not empty and not an earlier" in err, err
        assert _files(tmp_path) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("keep")
    with pytest.raises(SystemExit):
        export.main([kind, str(run), str(other)])
    assert "not empty and not an earlier" in capsys.readouterr().err
    assert [p.name for p in other.iterdir()] == ["keep.txt"]

    out = tmp_path / "exported"
    export.main([kind, str(run), str(out)])
    first = sorted(p.name for p in out.iterdir())
    (out / "mine.txt").write_text("a user's file beside the export")
    (out / "tokenizer.src.json").write_text("{}")  # as if the earlier export had had a separate vocabulary
    marker = json.loads((out / ".mt-export.json").read_text())
    (out / ".mt-export.json").write_text(json.dumps({**marker, "files": [*marker["files"], "tokenizer.src.json"]}))
    export.main([kind, str(run), str(out)])
    assert sorted(p.name for p in out.iterdir()) == sorted([*first, "mine.txt"])  # the stale file gone, theirs kept
    assert (out / "mine.txt").read_text() == "a user's file beside the export"
    other_kind = "ctranslate2" if kind == "release" else "release"
    with pytest.raises(SystemExit):
        export.main([other_kind, str(run), str(out)])
    assert f"holds a {kind} export" in capsys.readouterr().err
    assert _files(run) == {k.removeprefix("run/"): v for k, v in before.items() if k.startswith("run/")}


def test_a_card_publishes_only_the_exported_weights_scores(multilingual_run, tmp_path):
    """Before: the card listed every *.report.json of the run dir, so exporting checkpoint_last.pt or an epoch
    checkpoint claimed the final model's test BLEU, and every direction of a multilingual run was labelled with
    the run's main pair."""
    import yaml

    from mt.export.formats import export_release
    from mt.model import saved
    from mt.train import checkpoint

    run = multilingual_run[0]
    card = (export_release(str(run), tmp_path / "final") / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n", 2)[1])
    assert meta["language"] == ["xx", "yy", "zz"]
    tasks = [(r["task"]["name"], r["dataset"]["split"]) for r in meta["model-index"][0]["results"]]
    assert tasks == [("Translation xx-yy", "test.xx-yy"), ("Translation xx-zz", "test.xx-zz")]
    assert "translating xx->yy, xx->zz" in card
    final = saved.load(run / "checkpoint_final.pt")["model"]
    epochs = [p for p in checkpoint.epoch_checkpoints(run)
              if any(not torch.equal(v, final[k]) for k, v in saved.load(p)["model"].items())]  # fmt: skip
    assert epochs, "every epoch checkpoint holds the final weights"
    card = (export_release(str(epochs[0]), tmp_path / "epoch") / "README.md").read_text()
    assert "model-index" not in card and "No test report scores these weights" in card
