"""Loading transformers checkpoints exactly (mt/model/hub.py): tiny OPUS-MT- and NLLB-shaped models built and
trained by transformers itself (tests/hub_models.py), compared with transformers as the oracle: token ids on the
shared corpora, logits on a padded batch, greedy and beam-4 outputs against `generate()` with the checkpoint's
generation config, through the Python API, translate.py and the server. No download: everything is built here."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from mt.data.batching import collate  # noqa: E402
from mt.decode.translator import Translator  # noqa: E402
from mt.model import saved  # noqa: E402
from tests.hub_models import DATA, hub_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HUB_CONFIGS = ROOT.parent / "shared" / "reference" / "hub-configs"
# (checkpoint, source language, target language, source corpus language)
MODELS = {"marian_shared": ("de", "en"), "marian_separate": ("de", "en"), "marian_multi": ("en", "fr"),
          "nllb": ("de", "en")}  # fmt: skip
SPECIAL_TEXT = ["", "<s> Die </s> Dosis <pad> ist >>de<< hoch <unk>", "Ünïcödé ☃ 漢字 \u200b Tab\there",
                "deu_Latn eng_Latn >>fra<< </s>"]  # fmt: skip


@pytest.fixture(scope="session")
def hub_dir():
    """Where the tiny checkpoints are built (once per version of tests/hub_models.py: ~60 s)."""
    from tests.hub_models import CACHE

    return CACHE


def model_dir(hub_dir, name: str) -> Path:
    return hub_model(name, hub_dir)


def corpus_lines(n: int = 1000) -> list[tuple[str, str]]:
    """(language, line) of the first `n` training lines of every shared corpus, in each of its languages."""
    out = []
    for corpus in sorted(p for p in DATA.iterdir() if p.is_dir()):
        for path in sorted(corpus.glob("train.*.gz")):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                out += [(path.name.split(".")[1], line.rstrip("\n")) for _, line in zip(range(n), f)]
    return out


def hf_tokenizer(path: Path, src: str, tgt: str):
    from transformers import AutoTokenizer

    if (path / "tokenizer.json").is_file():  # NLLB
        return AutoTokenizer.from_pretrained(path, src_lang=lang_code(src), tgt_lang=lang_code(tgt))
    return AutoTokenizer.from_pretrained(path)


def lang_code(lang: str) -> str:
    from mt.data.hub_vocab import NLLB_LANGUAGES

    return NLLB_LANGUAGES[lang]


def hf_model(path: Path):
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(path).eval()


@pytest.mark.parametrize("name", MODELS)
def test_token_ids_are_transformers_on_every_shared_corpus(hub_dir, name):
    path = model_dir(hub_dir, name)
    src, tgt = MODELS[name]
    vocabs = saved.build_model(saved.load(path))[1]
    framing = vocabs.framing(src, tgt)
    tok = hf_tokenizer(path, src, tgt)
    texts = [line for _, line in corpus_lines()] + SPECIAL_TEXT
    ours = vocabs.src.encode_batch(texts)
    # transformers treats "<s>", "</s>", "<pad>" inside text as text only when asked (split_special_tokens); a text
    # that begins with ">>" is its language code in Marian's tokenizer (not in these lines)
    theirs = tok(texts, split_special_tokens=True)["input_ids"]
    expected_lead = list(framing.src_lead) if name == "nllb" else []
    mismatches = [t for t, a, b in zip(texts, ours, theirs) if expected_lead + a + [framing.specials.eos] != b]
    assert not mismatches, mismatches[:3]
    assert len(texts) > 18_000
    # the target side: transformers' text_target mode (Marian: the target SentencePiece model)
    sample = texts[:2000] + SPECIAL_TEXT
    theirs = tok(text_target=sample, split_special_tokens=True)["input_ids"]
    ours = vocabs.tgt.encode_batch(sample)
    lead = list(framing.tgt_lead)
    assert all(lead + a + [framing.specials.eos] == b for a, b in zip(ours, theirs))
    # decoding: transformers' batch_decode with skip_special_tokens
    assert vocabs.tgt.decode_batch(ours) == tok.batch_decode([lead + a for a in ours], skip_special_tokens=True)


@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers_on_a_padded_batch(hub_dir, name):
    path = model_dir(hub_dir, name)
    src_lang, tgt_lang = MODELS[name]
    model, vocabs = saved.build_model(saved.load(path))
    model.eval()
    framing = vocabs.framing(src_lang, tgt_lang)
    pairs = list(zip(*(read_test(name, n=7))))
    batch = collate([vocabs.src.encode(s) for s, _ in pairs], [vocabs.tgt.encode(t) for _, t in pairs],
                    list(range(len(pairs))), framing)  # fmt: skip
    assert batch.src_pad_mask.any() and batch.tgt_out.eq(framing.specials.pad).any()  # padded on both sides
    hf = hf_model(path)
    with torch.no_grad():
        ours = model(batch.src, batch.src_pad_mask, batch.tgt_in)
        theirs = hf(input_ids=batch.src, attention_mask=(~batch.src_pad_mask).long(),
                    decoder_input_ids=batch.tgt_in).logits  # fmt: skip
    real = batch.tgt_out.ne(framing.specials.pad)  # padded target positions are not predictions
    finite = torch.isfinite(ours[real])
    if model.cfg.mask_pad_logit:  # <pad>'s logit is -inf here (masked before the softmax), a number there
        assert finite.sum() == finite.numel() - real.sum()
    assert (ours[real][finite] - theirs[real][finite]).abs().max() < 1e-5
    assert not model.cfg.output_bias or model.output_bias.abs().max() > 0.1  # a real final_logits_bias


def read_test(name: str, n: int) -> tuple[list[str], list[str]]:
    """The first `n` test pairs in the model's direction, from a test set of at least 1,000 lines: IWSLT TED's
    (German -> English, 1,305 lines), Multi30k's (English -> French, 1,000)."""
    src, tgt = MODELS[name]
    corpus, split = ("multi30k", "test_2016_flickr") if name == "marian_multi" else ("iwslt_ted_de_en", "test")
    out = []
    for lang in (src, tgt):
        with gzip.open(DATA / corpus / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
            out.append([line.rstrip("\n") for _, line in zip(range(n), f)])
    return out[0], out[1]


def generate(hf, tok, translator, lines: list[str], beams: int, src: str, tgt: str) -> list[list[int]]:
    """transformers' output ids for each line (without the decoder's first token, the target-language token and
    </s>), under this project's per-line length limit: lines grouped by it, `max_length` = limit + 1."""
    from mt.decode.search import output_cap

    framing = translator.framing()
    decode = translator.settings(beam_size=beams)
    cap = output_cap(translator.model, decode)
    sources = translator.encode_sources(lines)
    limit = [max(1, min(cap, int((len(s) + 1 + len(framing.src_lead)) * decode.max_len_a + decode.max_len_b)))
             for s in sources]  # fmt: skip
    out: list[list[int]] = [[] for _ in lines]
    sp, lead = framing.specials, list(framing.tgt_lead)
    for n in sorted(set(limit)):
        rows = [i for i, s in enumerate(sources) if limit[i] == n and s]
        for at in range(0, len(rows), 64):
            part = rows[at : at + 64]
            ids = [list(framing.src_lead) + sources[i] + [sp.eos] for i in part]
            width = max(map(len, ids))
            batch = torch.tensor([x + [sp.pad] * (width - len(x)) for x in ids])
            extra = {"forced_bos_token_id": lead[0], "forced_eos_token_id": sp.eos} if lead else {}
            with torch.no_grad():
                gen = hf.generate(input_ids=batch, attention_mask=batch.ne(sp.pad).long(), max_length=n + 1,
                                  num_beams=beams, do_sample=False, **extra)  # fmt: skip
            for j, i in enumerate(part):
                row = gen[j, 1 + len(lead) :].tolist()
                out[i] = row[: row.index(sp.eos)] if sp.eos in row else [t for t in row if t != sp.pad]
    return out


def ended_before_limit(translator, lines: list[str], hyps) -> int:
    """How many hypotheses ended with </s> before their line's length limit forced it."""
    lead = len(translator.framing().src_lead) + len(translator.framing().tgt_lead)
    d = translator.decode
    return sum(1 for s, h in zip(translator.encode_sources(lines), hyps)
               if s and len(h[0].tokens) + lead < int((len(s) + 1 + lead) * d.max_len_a + d.max_len_b) - 1)  # fmt: skip


@pytest.mark.parametrize("name", MODELS)
def test_greedy_and_beam_outputs_are_generates(hub_dir, name):
    """On 1,000 test lines: this project's search through the Python API gives transformers' `generate()` output
    ids, greedy and with the checkpoint's beam (4, length penalty 1, transformers' stopping rule)."""
    path = model_dir(hub_dir, name)
    src, tgt = MODELS[name]
    translator = Translator.load(path, src_lang=src, tgt_lang=tgt)
    assert (translator.decode.beam_size, translator.decode.early_stopping) == (
        (4, False) if "marian" in name else (1, False)
    )
    hf, tok = hf_model(path), hf_tokenizer(path, src, tgt)
    lines = read_test(name, 1000)[0]
    assert len(lines) == 1000
    for beams in (1, 4):
        _, hyps = translator.hypotheses(lines, translator.settings(beam_size=beams))
        ours = [h[0].tokens for h in hyps]
        theirs = generate(hf, tok, translator, lines, beams, src, tgt)
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
        assert not differ, (beams, len(differ), [(ours[i], theirs[i]) for i in differ[:2]])
        # Hundreds of outputs end with </s> (these tiny models loop on the others until the length limit stops
        # them, at the same token in both): the comparison is not only of cut loops
        assert ended_before_limit(translator, lines, hyps) > 100
    texts = translator.translate(lines[:50], beam_size=4)
    assert texts == tok.batch_decode([[*translator.framing().tgt_lead, *t] for t in generate(
        hf, tok, translator, lines[:50], 4, src, tgt)], skip_special_tokens=True)  # fmt: skip


def hf_texts(path: Path, name: str, lines: list[str], beams: int) -> list[str]:
    """transformers' translations of `lines` (its generate() under this project's length limit, batch_decode)."""
    src, tgt = MODELS[name]
    translator = Translator.load(path, src_lang=src, tgt_lang=tgt)
    ids = generate(hf_model(path), None, translator, lines, beams, src, tgt)
    lead = list(translator.framing().tgt_lead)
    return hf_tokenizer(path, src, tgt).batch_decode([lead + i for i in ids], skip_special_tokens=True)


def test_translate_py_translates_a_transformers_dir_as_transformers_does(hub_dir, tmp_path):
    path = model_dir(hub_dir, "marian_shared")
    lines = read_test("marian_shared", 40)[0]
    (tmp_path / "in.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    p = subprocess.run([sys.executable, "translate.py", f"checkpoint={path}", f"input={tmp_path / 'in.de'}",
                        f"output={tmp_path / 'out.en'}"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "beam 4, length penalty average 1" in p.stderr  # the checkpoint's generation config
    assert p.stderr.splitlines()[0] == f"INFO translating de->en with {path}"  # its tokenizer_config.json's pair
    assert (tmp_path / "out.en").read_text(encoding="utf-8").splitlines() == hf_texts(path, "marian_shared", lines, 4)


def test_the_server_translates_an_nllb_model_into_the_requested_language(hub_dir):
    from fastapi.testclient import TestClient

    from mt.config import ServeConfig
    from mt.serve import create_app

    path = model_dir(hub_dir, "nllb")
    lines = read_test("nllb", 12)[0]
    translator = Translator.load(path, src_lang="de", tgt_lang="en")
    cfg = ServeConfig(checkpoint=str(path), decode=translator.decode, max_output_tokens=512)
    with TestClient(create_app(translator, cfg, {"model": str(path)})) as client:
        r = client.post("/translate", json={"src": lines, "beam_size": 4})
        assert r.status_code == 200, r.text
        assert r.json()["translations"] == hf_texts(path, "nllb", lines, 4)
        other = client.post("/translate", json={"src": lines[:3], "tgt_lang": "fr"}).json()["translations"]
        assert other != r.json()["translations"][:3]  # forced to start with fra_Latn: another output
        r = client.post("/translate", json={"src": lines[:1], "tgt_lang": "xx"})
        assert r.status_code == 422 and "tgt_lang=xx: this model has no token" in r.json()["error"]


@pytest.mark.parametrize("name", ["marian_separate", "nllb"])
def test_an_imported_model_exports_back_as_it_came(hub_dir, tmp_path, name):
    """Import, then `mt.export transformers`: the same class, weights, tokenizer files and generation settings."""
    from mt.export.hugging_face import export_transformers

    path = model_dir(hub_dir, name)
    out = export_transformers(str(path), tmp_path / "back")
    original, back = hf_model(path), hf_model(out)
    assert type(back) is type(original)
    theirs, ours = original.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    for f in ("vocab.json", "source.spm", "target_vocab.json", "tokenizer.json"):
        if (path / f).is_file():
            assert (out / f).read_bytes() == (path / f).read_bytes()
    src, tgt = MODELS[name]
    lines = read_test(name, 30)[0]
    assert hf_texts(out, name, lines, 4) == hf_texts(path, name, lines, 4)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen.get("num_beams", 1) == (original.generation_config.num_beams or 1)


def train(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})  # fmt: skip


def test_a_fine_tuned_opus_mt_model_resumes_exactly_and_exports_back_to_transformers(hub_dir, tmp_path):
    """train.init_from a transformers dir: the parent's architecture, tokenizer and generation settings; a run
    stopped and resumed ends with the weights of one that was not; the export back loads in transformers as a
    MarianMTModel whose greedy and beam outputs are the run's."""
    from mt.export.hugging_face import export_transformers

    parent = model_dir(hub_dir, "marian_shared")
    common = ["data=local", f"data.dir={DATA / 'opus_emea_de_en'}", "data.src_lang=de", "data.tgt_lang=en",
              "data.valid_from_train=100", "data.test_splits=[]", f"train.init_from={parent}", "train.max_tokens=1500",
              "train.valid_every=6", "train.valid_bleu_subset=20", "train.progress=false", "train.tensorboard=false",
              "train.device=cpu", "train.lr=1e-3", "train.warmup=4"]  # fmt: skip
    straight = train([*common, "train.max_updates=12", f"run_dir={tmp_path / 'straight'}"])
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "decoding as the parent's generation config: beam 4, length penalty average 1" in straight.stderr
    first = train([*common, "train.max_updates=6", f"run_dir={tmp_path / 'resumed'}"])
    assert first.returncode == 0, first.stderr[-3000:]
    then = train([*common, "train.max_updates=12", f"run_dir={tmp_path / 'resumed'}"])
    assert then.returncode == 0 and "resumed from" in then.stderr, then.stderr[-3000:]
    a, b = (
        torch.load(tmp_path / r / "checkpoint_last.pt", weights_only=False)["model"] for r in ("straight", "resumed")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["output.weight"], saved.load(parent)["model"]["output.weight"])  # it did train

    out = export_transformers(str(tmp_path / "straight"), tmp_path / "hf")
    assert type(hf_model(out)).__name__ == "MarianMTModel"
    lines = read_test("marian_shared", 30)[0]
    run = Translator.load(tmp_path / "straight")
    for beams in (1, 4):
        assert run.translate(lines, beam_size=beams) == hf_texts(out, "marian_shared", lines, beams)


@pytest.mark.parametrize("name", ["marian_shared", "nllb"])
def test_an_imported_model_exports_to_ctranslate2_and_as_a_release_that_translate_alike(hub_dir, tmp_path, name):
    """CTranslate2 (its own converter, from the transformers export) and a release (safetensors, the tokenizer
    files as transformers reads them): both translate as the imported model does, greedy."""
    pytest.importorskip("ctranslate2")
    from mt.export.formats import export_ctranslate2, export_release

    path = model_dir(hub_dir, name)
    src, tgt = MODELS[name]
    lines = read_test(name, 40)[0]
    ours = Translator.load(path, src_lang=src, tgt_lang=tgt).translate(lines, beam_size=1)
    for export in (export_ctranslate2, export_release):
        out = export(str(path), tmp_path / export.__name__)
        assert Translator.load(out, src_lang=src, tgt_lang=tgt).translate(lines, beam_size=1) == ours, export


@pytest.mark.parametrize("name", ["marian_shared", "nllb"])
def test_scores_are_transformers_log_probabilities_and_loops_are_flagged(hub_dir, name):
    """The score of an imported model's translation is transformers' mean log-probability of its tokens and </s>
    (the forced language token left out), greedy and beam; the tiny models' loops cut by the length limit are
    flagged as such, and only they."""
    from mt.data.batching import collate
    from mt.decode.confidence import records

    path = model_dir(hub_dir, name)
    src, tgt = MODELS[name]
    t = Translator.load(path, src_lang=src, tgt_lang=tgt)
    hf, lines = hf_model(path), read_test(name, 60)[0]
    framing, looped = t.framing(), 0
    for beams in (1, 4):
        decode = t.settings(beam_size=beams)
        src_ids, hyps = t.hypotheses(lines, decode)
        best = [h[0] for h in hyps]
        found = records(t, lines, src_ids, best, t.vocabs.tgt.decode_batch([h.tokens for h in best]), decode)
        b = collate(src_ids, [h.tokens for h in best], list(range(len(lines))), framing)
        with torch.no_grad():
            logits = hf(input_ids=b.src, attention_mask=(~b.src_pad_mask).long(), decoder_input_ids=b.tgt_in).logits
        if name.startswith("marian"):  # as generate() scores: <pad> banned (Marian's bad_words_ids)
            logits[..., framing.specials.pad] = -math.inf
        logp = logits.float().log_softmax(-1).gather(-1, b.tgt_out[..., None]).squeeze(-1)
        real = b.tgt_out != framing.specials.pad
        real[:, : len(framing.tgt_lead)] = False
        theirs = (logp.masked_fill(~real, 0.0).sum(1) / real.sum(1)).tolist()
        assert [r["score"] for r in found] == pytest.approx(theirs, abs=1e-4)
        if name == "marian_shared":  # no language tokens: a line's limit is its source length's
            capped = len(lines) - ended_before_limit(t, lines, hyps)
            assert sum("length_limit" in r["flags"] for r in found) == capped
            looped += capped
    assert looped > 0 or name != "marian_shared"
