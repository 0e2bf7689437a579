"""`tokenizer.case_markup=true`: lowercase words with case marks before the BPE, case restored after it, saved with
the tokenizer so that every door (Translator, server, CTranslate2, fine-tuning) reads and writes cased text
(mt/data/casing.py)."""

from __future__ import annotations

import json

import pytest

from mt.data.casing import TITLE, UPPER, mark, restore
from tests.conftest import MULTI30K, read_gz, tiny_multi30k_run

TEST_SETS = sorted(MULTI30K.parent.glob("*/test*.gz"))

EXAMPLES = [  # text, marked
    ("Der BMW fährt", f"{TITLE} der {UPPER} bmw fährt"),
    ("U.S. and USA", f"{TITLE} u.{TITLE} s. and {UPPER} usa"),  # a mark describes a run of letters and digits
    ('(Hello) "World" Über', f'{TITLE} (hello) {TITLE} "world" {TITLE} über'),
    ("A b", f"{TITLE} a b"),  # one capital letter is a capitalized word
    ("Blut-Hirn HCV-RNA-negativ", f"{TITLE} blut-{TITLE} hirn {UPPER} hcv-{UPPER} rna-negativ"),  # runs in a word
    ("O'Neil 2B", f"{TITLE} o'{TITLE} neil {TITLE} 2b"),
    ("iPhone McDonald GROß", "iPhone McDonald GROß"),  # mixed case, or case that would not come back: as they are
    ("  Two  spaces ", f"  {TITLE} two  spaces "),  # single spaces only: the text's own spaces stay
    ("", ""),
    ("_Hallo __Init__ a_B", f"{TITLE} _hallo {TITLE} __init__ a_{TITLE} b"),  # "_" is not part of a run
]


@pytest.mark.parametrize("text,marked", EXAMPLES)
def test_marks_lowercase_each_word_and_restore_gives_the_text_back(text, marked):
    assert mark(text) == marked
    assert restore(marked) == text


def test_stray_marks_are_removed_from_inputs_and_a_models_slips_are_undone():
    """An input holding a mark character loses it (it is not text); a model's output with a mark glued to its
    word, a run of marks (the last counts) or a mark at the end still comes back as cased text."""
    assert mark(f"x {TITLE}y") == "x y"
    assert restore(f"{TITLE}haus {TITLE}{UPPER} bmw ende {TITLE}") == "Haus BMW ende "


@pytest.mark.skipif(not TEST_SETS, reason=f"no corpora at {MULTI30K.parent}")
@pytest.mark.parametrize("path", TEST_SETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_line_of_every_test_set_comes_back(path):
    """raw -> marked -> restored is the identity on every line of ../shared/data's test sets, and marking did
    lowercase them: the capitals left are in runs of mixed case (product names: "PegIntron", "KMail"; up to 8% of
    the capitals in KDE4's French, under 1.1% in Multi30k, IWSLT and TED)."""
    lines = read_gz(path)
    marked = [mark(line) for line in lines]
    assert [restore(m) for m in marked] == lines
    upper = sum(c.isupper() for line in marked for c in line)
    assert upper < 0.1 * sum(c.isupper() for line in lines for c in line), upper


def test_a_vocabulary_with_case_markup_learns_lowercase_words_and_composes_with_moses(tmp_path):
    """The BPE learns from marked text ("▁haus" serves "Haus" and "haus"), the record says so, and with Moses the
    marks come after its tokenization and before its detokenization."""
    from mt.config import TokenizerConfig
    from mt.data.pretokenize import moses
    from mt.data.tokenizer import Vocabs, load_run_vocabs, train_vocab

    pairs = [("A man, walking.", "Ein Mann, gehend."), ("Two DOGS!", "Zwei Hunde!"), ("a man", "ein mann")] * 20
    marked = [(mark(moses("en").tokenize(s)), mark(moses("de").tokenize(t))) for s, t in pairs]
    cfg = TokenizerConfig(vocab_size=90, min_frequency=1, pretokenize="moses", case_markup=True)
    vocab = train_vocab(cfg, marked, (0, 1))
    plain = Vocabs(vocab, vocab)
    vocabs = plain.pretokenizing("moses", "en", "de", case_markup=True)
    tokens = vocabs.tgt.tokens(vocabs.tgt.encode("Ein Mann, gehend. Zwei Hunde!"))
    assert "▁mann" in tokens and f"▁{TITLE}" in tokens and not any(c.isupper() for t in tokens for c in t)
    for text in ("Ein Mann, gehend. Zwei Hunde!", "ZWEI hunde, EIN Mann."):
        assert vocabs.tgt.decode(vocabs.tgt.encode(text)) == text
    assert vocabs.pretokenize == {"kind": "moses", "src_lang": "en", "tgt_lang": "de", "joiner": "￭",
                                  "case_markup": True}  # fmt: skip
    alone = plain.pretokenizing("none", "", "", case_markup=True)
    assert alone.pretokenize == {"kind": "none", "case_markup": True} and alone.joint
    assert alone.src.digest() != plain.src.digest() and alone.src.digest(pretokenization=False) == plain.src.digest()
    again = Vocabs.from_json(alone.to_json())
    assert again.src.case_markup and again.src.moses is None
    alone.save(tmp_path)
    assert load_run_vocabs(TokenizerConfig(), tmp_path).tgt.case_markup
    plain.save(tmp_path)  # saved again without it: the record goes too
    assert not load_run_vocabs(TokenizerConfig(), tmp_path).tgt.case_markup


@pytest.fixture(scope="module")
def cased_run(tmp_path_factory):
    """A tiny En->De run on the first 3,000 Multi30k pairs with tokenizer.case_markup=true."""
    return tiny_multi30k_run(tmp_path_factory, case_markup=True)


def test_a_case_markup_run_translates_cased_text_at_every_door(cased_run, tmp_path):
    """The run dir and its checkpoints say case_markup; the Translator, the server and a CTranslate2 export give the
    same cased translations; a prefix and a constraint come back as typed."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mt.config import DecodeConfig, ServeConfig
    from mt.decode.translator import Translator
    from mt.export.formats import write_ctranslate2
    from mt.model import saved
    from mt.serve import create_app

    assert json.loads((cased_run / "pretokenize.json").read_text()) == {"kind": "none", "case_markup": True}
    t = Translator.load(cased_run, beam_size=2)
    assert t.vocabs.src.case_markup and t.vocabs.tgt.case_markup and t.vocabs.joint
    vocab = t.vocabs.tgt.tokenizer.get_vocab()  # lowercase subwords (capitals only from names like "KitchenAid")
    assert {"▁ein", "▁mann", "▁man"} <= set(vocab) and not {"▁Ein", "▁Mann", "▁A"} & set(vocab)
    lines = ["A man in a BLUE hat sits.", "Two dogs run on the grass!", ""]
    expected = t.translate(lines, prefix=["Ein Mann", "ZWEI Hunde", ""])
    assert expected[0].startswith("Ein Mann") and expected[1].startswith("ZWEI Hunde"), expected
    out = t.translate(["A dog."], constraints=[["Hund", "UND"]])[0]
    assert "Hund" in out and "UND" in out, out
    ckpt = saved.load(cased_run)
    net, vocabs = saved.build_model(ckpt)
    ct2 = write_ctranslate2(net, vocabs, tmp_path / "ct2", None, ckpt["config"])
    assert json.loads((ct2 / "pretokenize.json").read_text()) == {"kind": "none", "case_markup": True}
    assert Translator.load(ct2, beam_size=2).translate(lines, prefix=["Ein Mann", "ZWEI Hunde", ""]) == expected
    cfg = ServeConfig(checkpoint="cased", decode=DecodeConfig(beam_size=2))
    with TestClient(create_app(Translator.load(cased_run, beam_size=2), cfg)) as client:
        assert client.post("/translate", json={"src": lines}).json()["translations"] == t.translate(lines)


def test_a_prefix_holding_a_mark_character_is_refused_not_changed_in_silence(cased_run):
    from mt.config import ConfigError
    from mt.decode.translator import Translator

    t = Translator.load(cased_run, beam_size=2)
    with pytest.raises(ConfigError, match="would come back as 'Ein Mann': case markup removes the characters"):
        t.translate(["A man."], prefix=[f"Ein{TITLE} Mann"])
    with pytest.raises(ConfigError, match=r"constraint 'Mann\\ue0c2' would come back as 'Mann': case markup removes"):
        t.translate(["A man."], constraints=[[f"Mann{UPPER}"]])


def test_fine_tuning_keeps_the_parents_case_markup(cased_run, tmp_path):
    from mt.train import finetune
    from tests.test_training import make_config

    cfg = make_config(tmp_path, tmp_path / "ft", init_from=str(cased_run))
    adopted = finetune.adopt(cfg, finetune.load_parent(cfg, tmp_path / "ft"), [])
    assert adopted.tokenizer.case_markup and adopted.tokenizer.pretokenize == "none"


def test_an_export_without_its_record_is_refused(cased_run, tmp_path):
    """A release of a case-markup run whose pretokenize.json went missing would feed the model cased text it never
    saw: a one-line error."""
    from mt.decode.translator import Translator
    from mt.errors import CheckpointError
    from mt.export.formats import export_release

    out = export_release(str(cased_run), tmp_path / "release")
    assert Translator.load(out, beam_size=2).vocabs.src.case_markup
    (out / "pretokenize.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer.case_markup=true but pretokenize.json is missing"):
        Translator.load(out, beam_size=2)
