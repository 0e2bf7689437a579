"""A transformers checkpoint's own settings kept through import, fine-tuning and the export back: NLLB's languages
(tokenizer_config.json's src_lang / tgt_lang, generation_config.json's forced_bos_token_id), generation keys read as
transformers reads them, the files and config values the export writes back, and the model card's account of where
the weights came from and under which licence."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from mt.decode.translator import Translator  # noqa: E402
from mt.model import saved  # noqa: E402
from mt.model.saved import FORMAT_VERSION  # noqa: E402
from mt.train.records import PARENT_FILE  # noqa: E402
from tests.hub_models import hub_model, lines  # noqa: E402

GERMAN = lines("opus_emea_de_en", "test", "de", 6)


def nllb_copy(dest: Path, tokenizer: dict | None = None, generation: dict | None = None) -> Path:
    """The tiny NLLB checkpoint (trained De->En; its tokenizer_config.json names deu_Latn -> eng_Latn) with
    `tokenizer`'s keys in tokenizer_config.json and `generation`'s in generation_config.json."""
    shutil.copytree(hub_model("nllb"), dest)
    for name, keys in (("tokenizer_config.json", tokenizer), ("generation_config.json", generation)):
        if keys:
            path = dest / name
            path.write_text(json.dumps({**json.loads(path.read_text()), **keys}))
    return dest


def test_an_nllb_folder_translates_in_the_pair_its_tokenizer_config_names():
    """Before: "src_lang is needed" where transformers runs the folder as it is."""
    plain = Translator.load(hub_model("nllb"), device="cpu")
    assert (plain.source_lang, plain.tgt_lang) == ("deu_Latn", "eng_Latn")
    given = Translator.load(hub_model("nllb"), device="cpu", src_lang="de", tgt_lang="en")
    assert plain.translate(GERMAN) == given.translate(GERMAN)


def test_the_forced_first_token_is_the_default_target_language(tmp_path, caplog):
    """generation_config.json's forced_bos_token_id is what transformers' generate() starts every output with: it
    is the default target language (before: named as "not applied" while a target token was forced anyway)."""
    french = json.loads((hub_model("nllb") / "tokenizer.json").read_text())
    fra = next(t["id"] for t in french["added_tokens"] if t["content"] == "fra_Latn")
    with caplog.at_level(logging.WARNING):
        translator = Translator.load(nllb_copy(tmp_path / "hf", generation={"forced_bos_token_id": fra}), device="cpu")
    assert translator.tgt_lang == "fra_Latn" and "not applied" not in caplog.text


def test_generation_keys_are_read_as_transformers_reads_them(tmp_path, caplog):
    """max_new_tokens bounds the output (before: ignored); without generation_config.json the generation keys of
    config.json apply (before: only num_beams, max_length and bad_words_ids were read); early_stopping="never" and
    no_repeat_ngram_size are named in the warning."""
    hf = nllb_copy(tmp_path / "hf", generation={"max_new_tokens": 5, "early_stopping": "never", "num_beams": 4})
    with caplog.at_level(logging.WARNING):
        ckpt = saved.load(hf)
    assert ckpt["config"]["decode"]["max_len"] == 5 and "early_stopping='never'" in caplog.text
    (hf / "generation_config.json").unlink()
    config = json.loads((hf / "config.json").read_text())
    keys = {"num_beams": 3, "length_penalty": 0.6, "early_stopping": True, "no_repeat_ngram_size": 3}
    (hf / "config.json").write_text(json.dumps({**config, **keys}))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        decode = saved.load(hf)["config"]["decode"]
    assert (decode["beam_size"], decode["length_penalty"], decode["early_stopping"]) == (3, 0.6, True)
    assert "no_repeat_ngram_size" in caplog.text


def fine_tuned_run(parent: Path, run: Path, data: dict) -> Path:
    """A run dir as train.py leaves a run fine-tuned from `parent` in the pair `data`: its checkpoint (this project's
    format, the run's languages), parent.json with the parent's transformers files' values, two test reports."""
    ckpt = saved.load(parent)
    hub_files = ckpt["config"].pop("hub")
    hub_files["license"] = "cc-by-nc-4.0"
    hub_files["config"]["encoder_layerdrop"] = 0.05
    ckpt["config"]["data"] = data
    run.mkdir()
    torch.save({**ckpt, "format": FORMAT_VERSION}, run / "checkpoint_final.pt")
    (run / PARENT_FILE).write_text(json.dumps({"path": str(parent), "weights_digest": "0" * 16, "hub": hub_files}))
    signatures = {f"{k}_signature": f"sig-{k}" for k in ("bleu", "bleu_lowercase", "chrf")}
    for name, bleu in (("test", 30.0), ("test.before", 20.0)):
        report = {"name": name, "bleu": bleu, "bleu_lowercase": bleu + 1, "chrf": 50.0, **signatures}
        (run / f"{name}.report.json").write_text(json.dumps(report))
    return run


def test_a_fine_tuned_nllb_run_exports_with_its_own_languages(tmp_path):
    """Before: the export kept the parent's src_lang / tgt_lang and wrote no forced_bos_token_id, so plain
    generate() (what the export's card says to run) started every line in another language. Now generate() gives
    the run's translations; the slow tokenizer's sentencepiece.bpe.model and the parent's layerdrop come along."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from mt.export.hugging_face import export_transformers

    parent = nllb_copy(tmp_path / "parent", tokenizer={"src_lang": "fra_Latn", "tgt_lang": "spa_Latn"})
    run = fine_tuned_run(parent, tmp_path / "run", {"src_lang": "de", "tgt_lang": "en"})
    ours = Translator.load(run, device="cpu", beam_size=1).translate(GERMAN)
    out = export_transformers(str(run), tmp_path / "hf")
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert (tokenizer_config["src_lang"], tokenizer_config["tgt_lang"]) == ("deu_Latn", "eng_Latn")
    tok, model = AutoTokenizer.from_pretrained(out), AutoModelForSeq2SeqLM.from_pretrained(out)
    assert model.generation_config.forced_bos_token_id == tok.convert_tokens_to_ids("eng_Latn")
    batch = tok(GERMAN, return_tensors="pt", padding=True)
    theirs = tok.batch_decode(model.generate(**batch, num_beams=1), skip_special_tokens=True)
    assert theirs == ours
    assert (out / "sentencepiece.bpe.model").read_bytes() == (parent / "sentencepiece.bpe.model").read_bytes()
    assert json.loads((out / "config.json").read_text())["encoder_layerdrop"] == 0.05
    again = saved.load(out)  # and an import of the export keeps the pair
    assert again["config"]["data"] == {"src_lang": "deu_Latn", "tgt_lang": "eng_Latn"}


def test_the_model_card_of_a_fine_tuned_import_names_its_parent_and_licence(tmp_path):
    """Before: "trained from raw parallel text", "weights permuted", "BPE types", the parent's test.before score
    listed first as the model's result, no parent and no licence."""
    import yaml

    from mt.export.hugging_face import export_transformers

    parent = nllb_copy(tmp_path / "parent")
    run = fine_tuned_run(parent, tmp_path / "run", {"src_lang": "de", "tgt_lang": "en"})
    card = (export_transformers(str(run), tmp_path / "hf") / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["license"] == "cc-by-nc-4.0"
    results = meta["model-index"][0]["results"]
    assert [r["dataset"]["split"] for r in results] == ["test"]
    for wrong in ("raw parallel text", "permuted", "BPE types"):
        assert wrong not in body
    assert f"`{parent}` read from its transformers checkpoint, fine-tuned on new data" in body
    assert "| test.before (the parent, before fine-tuning) | 20.00" in body
    assert body.index("| test | 30.00") < body.index("| test.before")
    assert f"cc-by-nc-4.0, the licence of `{parent}`" in body


def test_an_import_then_export_keeps_the_checkpoints_own_forced_first_token(tmp_path):
    """Before: generation_config.json's forced_bos_token_id was dropped on the way back."""
    from mt.export.hugging_face import export_transformers

    tokenizer = json.loads((hub_model("nllb") / "tokenizer.json").read_text())
    fra = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "fra_Latn")
    hf = nllb_copy(tmp_path / "hf", generation={"forced_bos_token_id": fra})
    out = export_transformers(str(hf), tmp_path / "back")
    assert json.loads((out / "generation_config.json").read_text())["forced_bos_token_id"] == fra
