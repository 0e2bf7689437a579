"""`tokenizer.pretokenize=moses`: Moses tokenization before the BPE and detokenization after it, saved with the
tokenizer, so that every door reads and writes raw text (mt/data/pretokenize.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mt.data.pretokenize import moses
from tests.conftest import MULTI30K, read_gz, tiny_multi30k_run

SHARED = MULTI30K.parent
TEST_SETS = sorted(SHARED.glob("*/test*.gz"))

# The review's examples, each with the text plain Moses detokenization gave back
EXAMPLES = [
    ("en", "/sbin/camcontrol", "/ sbin / camcontrol"),
    ("en", "%1 %2", "% 1% 2"),
    ("en", "https://example.com/a-b?x=1&y=2", "https: / / example.com / a-b? x = 1 & y = 2"),
    ("en", "C++", "C + +"),
    ("en", "AT&T", "AT & T"),
    ("en", "50 mg/ml", "50 mg / ml"),
    ("de", "geht's", "geht 's"),
    ("de", "Wie geht's? z.B. ein (kleiner) Test, {0} - ja!", None),
    ("fr", "L'homme qu'il a vu... « bien »", None),
    ("en", "Write to a.b@example.org, or edit ~/.config/mt/x.conf (see %s).", None),
]


@pytest.mark.parametrize("lang,text,plain", EXAMPLES)
def test_moses_with_joiners_gives_the_text_back(lang, text, plain):
    """Tokenized (and so split where the BPE will see words), then detokenized: the same text, where plain Moses
    detokenization (a model of before the joiners) changed it."""
    m = moses(lang)
    assert m.detokenize(m.tokenize(text)) == text and m.round_trips(text)
    legacy = moses(lang, None)
    if plain is not None:
        assert legacy.detokenize(legacy.tokenize(text)) == plain and not legacy.round_trips(text)


def test_joiners_sit_on_the_punctuation_and_urls_paths_and_placeholders_stay_whole():
    assert moses("de").tokenize("Wie geht's? (Gut.)") == "Wie geht ￭'￭ s ￭? (￭ Gut ￭. ￭)"
    assert moses("en").tokenize("See /usr/share/doc, https://x.org/a?b=1 and %1.") == (
        "See /usr/share/doc ￭, https://x.org/a?b=1 and %1 ￭."
    )
    assert moses("en").detokenize("Hund ￭ . Katze ￭,") == "Hund. Katze,"  # a joiner on its own joins too


@pytest.mark.skipif(not TEST_SETS, reason=f"no corpora at {SHARED}")
@pytest.mark.parametrize("path", TEST_SETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_moses_round_trip_on_every_test_set(path):
    """raw -> tokenized -> detokenized, line by line, up to runs of whitespace: every line of every test set in
    ../shared/data comes back (benchmarks/quality/moses_round_trip.py prints the table, docs/train.md has it; plain
    Moses detokenization restored 39-99.9%)."""
    lang = path.name.split(".")[-2]
    lines = [line for line in read_gz(path) if line.strip()]
    m = moses(lang)
    tokenized = [m.tokenize(line) for line in lines]
    back = [m.detokenize(t) for t in tokenized]
    missed = [(a, b) for a, b in zip(lines, back) if a.split() != b.split()]
    assert not missed, missed[:3]
    assert sum(" ￭" in t or "￭ " in t for t in tokenized) > len(lines) / 4  # tokenized, not untouched


@pytest.fixture(scope="module")
def moses_run(tmp_path_factory):
    """A tiny En->De run on the first 3,000 Multi30k pairs with tokenizer.pretokenize=moses."""
    return tiny_multi30k_run(tmp_path_factory, pretokenize="moses")


def test_a_moses_run_learns_from_tokenized_text_and_translates_raw_text(moses_run):
    """The BPE learned from Moses-tokenized text with joiners (its vocabulary has "▁￭,", not "man,"), the run dir
    and the checkpoint say so, and a translation comes back as text: a prefix or a constraint typed raw ("Wie
    geht's") is in the output as it was typed."""
    from mt.decode.translator import Translator

    assert json.loads((moses_run / "pretokenize.json").read_text()) == {"kind": "moses", "src_lang": "en",
                                                                         "tgt_lang": "de", "joiner": "￭"}  # fmt: skip
    t = Translator.load(moses_run, beam_size=2)
    vocab = t.vocabs.src
    assert vocab.moses.lang == "en" and t.vocabs.tgt.moses.lang == "de" and t.vocabs.joint
    assert "▁￭," in vocab.tokens(vocab.encode("A man, in a hat."))  # split by Moses, marked as touching
    assert vocab.tokenizer.encode("man,", add_special_tokens=False).tokens != ["▁man,"]
    for prefix in ("Ein Mann, der", "Wie geht's"):
        out = t.translate(["A man, in a blue hat, sits."], prefix=[prefix])[0]
        assert out.startswith(prefix), out
    out = t.translate(["How is it going?"], constraints=[["geht's", "(Hut)"]])[0]
    assert "geht's" in out and "(Hut)" in out, out
    for text in ("Ein Mann, der (im Hut) sitzt.", 'Wie geht\'s, Mann-Hund "Tom".'):  # (characters it has seen)
        assert t.vocabs.tgt.decode(t.vocabs.tgt.encode(text)) == text


def test_a_moses_model_of_before_the_joiners_refuses_what_it_cannot_give_back(moses_run, tmp_path):
    """A model whose pretokenize.json has no joiner is Moses-detokenized: a prefix or a constraint that would come
    back changed ("geht's" as "geht 's") is a one-line error, not a promise broken in silence."""
    import shutil

    from mt.config import ConfigError
    from mt.decode.translator import Translator

    old = tmp_path / "old"
    shutil.copytree(moses_run, old)
    spec = json.loads((old / "pretokenize.json").read_text())
    del spec["joiner"]
    (old / "pretokenize.json").write_text(json.dumps(spec))
    ckpts = list(old.glob("*.pt"))
    for path in ckpts:  # the checkpoints carry the record too
        import torch

        ckpt = torch.load(path, weights_only=False)
        del ckpt["tokenizer"]["pretokenize"]["joiner"]
        torch.save(ckpt, path)
    t = Translator.load(old, beam_size=2)
    assert t.vocabs.tgt.moses.joiner is None
    with pytest.raises(ConfigError, match=r"prefix:1: the prefix \"Wie geht's\" would come back as \"Wie geht 's\""):
        t.translate(["How is it going?"], prefix=["Wie geht's"])
    with pytest.raises(ConfigError, match=r"the constraint \"geht's\" would come back as"):
        t.translate(["How is it going?"], constraints=[["geht's"]])
    assert t.translate(["A man."], prefix=["Ein Mann"])[0].startswith("Ein Mann")  # what survives is served


def test_the_server_and_a_ctranslate2_export_read_and_write_raw_text(moses_run, tmp_path):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mt.config import DecodeConfig, ServeConfig
    from mt.decode.translator import Translator
    from mt.export.formats import write_ctranslate2
    from mt.model import saved
    from mt.serve import create_app

    lines = ["A man, in a blue hat, sits.", "Two dogs (brown) run on the grass!", ""]
    model = Translator.load(moses_run, beam_size=2)
    expected = model.translate(lines)
    ckpt = saved.load(moses_run)
    net, vocabs = saved.build_model(ckpt)
    out = write_ctranslate2(net, vocabs, tmp_path / "ct2", None, ckpt["config"])
    assert json.loads((out / "pretokenize.json").read_text())["kind"] == "moses"
    assert Translator.load(out, beam_size=2).translate(lines) == expected
    cfg = ServeConfig(checkpoint="moses", decode=DecodeConfig(beam_size=2))
    with TestClient(create_app(Translator.load(moses_run, beam_size=2), cfg)) as client:
        assert client.post("/translate", json={"src": lines}).json()["translations"] == expected
    assert not any(" ," in e or " ." in e for e in expected)  # detokenized: no space before the punctuation


def test_lowercase_composes_and_a_tokenizer_without_it_is_unchanged(tmp_path):
    from mt.config import TokenizerConfig
    from mt.data.tokenizer import Vocabs, load_run_vocabs, train_vocab

    pairs = [("A man, walking.", "Ein Mann, gehend."), ("Two dogs!", "Zwei Hunde!")] * 20
    moses_pairs = [(moses("en").tokenize(s), moses("de").tokenize(t)) for s, t in pairs]
    vocab = train_vocab(TokenizerConfig(vocab_size=80, min_frequency=1, normalization="NFC+Lowercase",
                                        pretokenize="moses"), moses_pairs, (0, 1))  # fmt: skip
    plain = Vocabs(vocab, vocab)
    vocabs = plain.pretokenizing("moses", "en", "de")
    assert vocabs.tgt.decode(vocabs.tgt.encode("Ein Mann, gehend.")) == "ein mann, gehend."
    assert vocabs.src.digest() != vocabs.tgt.digest() != plain.src.digest()  # the languages are part of it
    assert plain.src is plain.tgt and plain.pretokenize is None and "pretokenize" not in plain.to_json()
    again = Vocabs.from_json(vocabs.to_json())
    assert again.pretokenize == {"kind": "moses", "src_lang": "en", "tgt_lang": "de", "joiner": "￭"} and again.joint
    vocabs.save(tmp_path)
    assert load_run_vocabs(TokenizerConfig(), tmp_path).tgt.digest() == vocabs.tgt.digest()
    plain.save(tmp_path)  # saved again without it: the record goes too
    assert not (tmp_path / "pretokenize.json").exists()
    assert load_run_vocabs(TokenizerConfig(), tmp_path).src.moses is None


def test_a_punctuation_mark_after_moses_keeps_its_space_marker():
    """Moses spaces every mark off ("gehend ."): the BPE gives "▁." as subword-nmt gives the word ".", not a bare "▁"
    and then "." (which cost 9% more German tokens in issue 62's replica); the text still round-trips."""
    from mt.config import TokenizerConfig
    from mt.data.tokenizer import Vocabs, train_vocab

    pairs = [("A man, walking.", "Ein Mann, gehend."), ("Two dogs!", "Zwei Hunde!")] * 20
    moses_pairs = [(moses("en").tokenize(s), moses("de").tokenize(t)) for s, t in pairs]
    vocab = train_vocab(TokenizerConfig(vocab_size=80, min_frequency=1, pretokenize="moses"), moses_pairs, (0, 1))
    vocabs = Vocabs(vocab, vocab).pretokenizing("moses", "en", "de")
    tokens = vocabs.tgt.tokens(vocabs.tgt.encode("Ein Mann, gehend. Zwei Hunde!"))
    assert "▁" not in tokens and {"▁￭,", "▁￭.", "▁￭!"} <= set(tokens)
    assert vocabs.tgt.decode(vocabs.tgt.encode("Ein Mann, gehend. Zwei Hunde!")) == "Ein Mann, gehend. Zwei Hunde!"


def test_each_language_keeps_its_own_rules():
    """German's nonbreaking prefixes ("z.B.") and English's clitics ("it 's") against the other languages' split
    apostrophes: why a joint vocabulary's two sides pre-tokenize in their own languages."""
    assert moses("de").tokenize("Zwei Hunde, z.B. ein Pudel.") == "Zwei Hunde ￭, z.B. ein Pudel ￭."
    assert (
        moses("en").tokenize("It's a dog.") == "It ￭'s a dog ￭." and moses("de").tokenize("Geht's?") == "Geht ￭'￭ s ￭?"
    )
    assert moses("de").detokenize("Zwei Hunde ￭, z.B. ein Pudel ￭.") == "Zwei Hunde, z.B. ein Pudel."


def test_fine_tuning_a_moses_parent_accepts_the_parents_own_tokenizer_file(moses_run, tmp_path):
    """tokenizer.path= the parent's tokenizer.json is the parent's tokenizer (the file holds the BPE; the Moses
    setting comes from the parent)."""
    from mt.train import finetune
    from tests.test_training import make_config

    cfg = make_config(tmp_path, tmp_path / "ft", init_from=str(moses_run))
    cfg = replace(cfg, tokenizer=replace(cfg.tokenizer, path=str(moses_run / "tokenizer.json")))
    adopted = finetune.adopt(cfg, finetune.load_parent(cfg, tmp_path / "ft"), ["tokenizer.path=x"])
    assert adopted.tokenizer.pretokenize == "moses" and adopted.tokenizer.path is None


def test_an_export_without_its_pretokenize_record_is_refused(moses_run, tmp_path):
    """A release or CTranslate2 export of a Moses run whose pretokenize.json went missing would give its text other
    ids than the model learnt: a one-line error, not a silently different model."""
    from mt.decode.translator import Translator
    from mt.errors import CheckpointError
    from mt.export.formats import export_ctranslate2, export_release

    exports = [export_release(str(moses_run), tmp_path / "release")]
    if __import__("importlib").util.find_spec("ctranslate2") is not None:
        exports.append(export_ctranslate2(str(moses_run), tmp_path / "ct2"))
    for out in exports:
        assert Translator.load(out, beam_size=2).vocabs.src.moses is not None
        (out / "pretokenize.json").unlink()
        with pytest.raises(CheckpointError, match=r"tokenizer.pretokenize=moses but pretokenize.json is missing"):
            Translator.load(out, beam_size=2)


def test_the_tokenizer_cache_key_of_a_run_without_moses_is_the_key_of_before():
    """Runs without Moses or case markup keep the tokenizer cache key they had before the options existed (their
    config had neither key): an upgrade neither retrains their BPE nor makes a resume report a changed corpus."""
    import hashlib
    from dataclasses import asdict

    from mt.config import TokenizerConfig
    from mt.data.corpus import _meta_key

    cfg = TokenizerConfig()
    before = {k: v for k, v in asdict(cfg).items() if k not in ("pretokenize", "case_markup")}
    key = hashlib.sha256(json.dumps([before, "fp"], sort_keys=True).encode()).hexdigest()[:16]
    assert _meta_key(cfg, "fp") == key
    assert _meta_key(replace(cfg, pretokenize="moses"), "fp") != key
    assert _meta_key(replace(cfg, case_markup=True), "fp") != key  # (tokenizer.case_markup, tests/test_casing.py)


def test_a_normalization_that_folds_the_joiner_still_gives_text_back():
    """NFKC (and NFKD) fold the joiner "￭" into "■" before the BPE sees it; the output's "■" joins as "￭" would."""
    from mt.config import TokenizerConfig
    from mt.data.tokenizer import Vocabs, train_vocab

    pairs = [("It's a man, walking.", "Wie geht's, Mann? (Gut.)"), ("Two dogs!", "Zwei Hunde!")] * 20
    moses_pairs = [(moses("en").tokenize(s), moses("de").tokenize(t)) for s, t in pairs]
    cfg = TokenizerConfig(vocab_size=90, min_frequency=1, normalization="NFKC", pretokenize="moses")
    vocab = train_vocab(cfg, moses_pairs, (0, 1))
    vocabs = Vocabs(vocab, vocab).pretokenizing("moses", "en", "de")
    assert "■" in "".join(vocabs.tgt.tokens(vocabs.tgt.encode("Wie geht's, Mann?")))
    for text in ("Wie geht's, Mann? (Gut.)", "Zwei Hunde!"):
        assert vocabs.tgt.decode(vocabs.tgt.encode(text)) == text


@pytest.mark.parametrize("normalization", ["NFKC", "NFKD"])
def test_a_real_black_square_survives_a_normalization_that_folds_the_joiner_into_one(tmp_path, normalization):
    """Under NFKC and NFKD a joiner becomes "■" (U+25A0) in the tokens: a real "■" of the text goes through Moses as
    a private-use stand-in (the BPE learns it so), and decoding gives "■" back where the text had it, neighbours
    apart, not glued as a joiner would glue them."""
    import datasets

    from mt.config import TokenizerConfig
    from mt.data import read
    from mt.data.corpus import build_vocabs

    pairs = [("Ein ■ Quadrat, ein Punkt■ und ■Ende.", "A ■ square, a dot■ and ■end.")] * 30
    table = datasets.Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})
    cfg = TokenizerConfig(vocab_size=120, min_frequency=1, normalization=normalization, pretokenize="moses")
    vocabs = build_vocabs(cfg, read.TextPairs.of_table(table), tmp_path, langs=("de", "en"))
    for text in ("A ■ square, a dot■ and ■end.", "a ■ dot"):
        assert vocabs.tgt.decode(vocabs.tgt.encode(text)) == text
