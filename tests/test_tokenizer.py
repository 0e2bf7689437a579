"""BPE training, special-token ids, lossless round trip on real Multi30k val, reuse of a trained tokenizer,
lowercasing."""

import logging
import random
import re
from collections import Counter
from types import SimpleNamespace

import datasets
import pytest

from mt.config import DataConfig, DecodeConfig, TokenizerConfig
from mt.data import read
from mt.data.corpus import build_vocabs, tokenize
from mt.data.tokenizer import BOS, EOS, PAD, UNK, Vocab, train_vocab
from mt.evaluate import report, scoring
from tests.conftest import MULTI30K, needs_multi30k


@pytest.fixture(scope="module")
def multi30k_vocab(tmp_path_factory):
    cfg = DataConfig(name="multi30k", dir=str(MULTI30K), src_lang="en", tgt_lang="de")
    vocabs = build_vocabs(
        TokenizerConfig(vocab_size=8000), read.TextPairs.of_split(cfg, "train"), tmp_path_factory.mktemp("tok")
    )
    return vocabs, read.load_split(cfg, "val")


@needs_multi30k()
def test_round_trip_on_multi30k_val(multi30k_vocab):
    vocabs, val = multi30k_vocab
    assert vocabs.joint and len(vocabs.src) == 8000
    checked = 0
    for line in list(val["src"]) + list(val["tgt"]):
        ids = vocabs.src.encode(line)
        if UNK in ids:  # characters never seen in training cannot round-trip
            continue
        assert vocabs.src.decode(ids) == line
        checked += 1
    assert checked >= 0.99 * 2 * len(val)


@needs_multi30k()
def test_special_token_ids(multi30k_vocab):
    vocab = multi30k_vocab[0].src
    assert [vocab.tokenizer.token_to_id(t) for t in ("<pad>", "<unk>", "<s>", "</s>")] == [PAD, UNK, BOS, EOS]
    assert vocab.decode([BOS] + vocab.encode("Ein Hund.") + [EOS, PAD]) == "Ein Hund."


def tiny_train():
    return datasets.Dataset.from_dict(
        {"src": ["a small cat", "the dog runs"] * 50, "tgt": ["eine kleine Katze", "der Hund rennt"] * 50}
    )


def test_reused_when_unchanged_and_retrained_when_config_changes(tmp_path):
    train = tiny_train()
    v1 = build_vocabs(TokenizerConfig(vocab_size=60, min_frequency=1), read.TextPairs.of_table(train), tmp_path)
    mtime = (tmp_path / "tokenizer.json").stat().st_mtime_ns
    v2 = build_vocabs(TokenizerConfig(vocab_size=60, min_frequency=1), read.TextPairs.of_table(train), tmp_path)
    assert (tmp_path / "tokenizer.json").stat().st_mtime_ns == mtime and v1.src.digest() == v2.src.digest()
    v3 = build_vocabs(TokenizerConfig(vocab_size=50, min_frequency=1), read.TextPairs.of_table(train), tmp_path)
    assert len(v3.src) == 50


def test_separate_vocabularies(tmp_path):
    vocabs = build_vocabs(
        TokenizerConfig(vocab_size=40, joint=False, min_frequency=1), read.TextPairs.of_table(tiny_train()), tmp_path
    )
    assert not vocabs.joint
    assert (tmp_path / "tokenizer.src.json").is_file() and (tmp_path / "tokenizer.tgt.json").is_file()
    # Each side learned only its own language: German words are whole tokens on the target side only.
    assert vocabs.tgt.tokenizer.token_to_id("▁Katze") is not None
    assert vocabs.src.tokenizer.token_to_id("▁Katze") is None and vocabs.src.tokenizer.token_to_id("▁cat") is not None


def test_tokenize_adds_id_columns_and_is_cached(tmp_path):
    train = tiny_train()
    vocabs = build_vocabs(TokenizerConfig(vocab_size=60, min_frequency=1), read.TextPairs.of_table(train), tmp_path)
    a, b = tokenize(train, vocabs), tokenize(train, vocabs)
    assert a._fingerprint == b._fingerprint
    assert a[0]["src_ids"] == vocabs.src.encode("a small cat")


def test_broken_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a usable tokenizer.json"):
        Vocab.from_file(tmp_path / "tokenizer.json")


def test_a_lowercasing_tokenizer_learns_and_reads_lowercase_text(tmp_path):
    pairs = read.TextPairs.of_table(tiny_train())
    cfg = TokenizerConfig(vocab_size=60, min_frequency=1, normalization="NFC+Lowercase")
    vocab = build_vocabs(cfg, pairs, tmp_path / "lc").tgt
    assert vocab.lowercases and Vocab.from_file(tmp_path / "lc" / "tokenizer.json").lowercases  # as translate loads it
    assert vocab.tokenizer.token_to_id("▁Hund") is None and vocab.tokenizer.token_to_id("▁hund") is not None
    assert vocab.encode("Der HUND rennt") == vocab.encode("der hund rennt")
    assert vocab.decode(vocab.encode("Der Hund rennt")) == "der hund rennt"
    cased = build_vocabs(TokenizerConfig(vocab_size=60, min_frequency=1), pairs, tmp_path / "cased").tgt
    assert not cased.lowercases and cased.decode(cased.encode("der Hund rennt")) == "der Hund rennt"
    assert cased.tokenizer.normalizer.__class__.__name__ == "NFC"  # one step stays one normalizer: digests unchanged


@pytest.mark.parametrize("normalization, lowercases", [("NFC+Lowercase", True), ("NFC", False)])
def test_a_lowercased_model_is_selected_by_lowercased_bleu(tmp_path, monkeypatch, normalization, lowercases):
    refs = ["der Hund rennt eine kleine Katze rennt", "eine kleine Katze der Hund rennt"] * 3  # seen characters
    cfg = TokenizerConfig(vocab_size=60, min_frequency=1, normalization=normalization)
    vocabs = build_vocabs(cfg, read.TextPairs.of_table(tiny_train()), tmp_path)
    # the search "translates" each sentence into its reference, lowercased when the tokenizer lowercases
    ds = datasets.Dataset.from_dict({"src_ids": [vocabs.src.encode(r) for r in refs], "tgt": refs})
    fake = lambda model, src_ids, *rest, **kw: [[SimpleNamespace(tokens=ids)] for ids in src_ids]  # noqa: E731
    monkeypatch.setattr(scoring, "translate_ids", fake)
    result = scoring.validation_bleu(None, ds, vocabs, DecodeConfig(), None, None)
    cased = report.score(vocabs.tgt.decode_batch(list(ds["src_ids"])), refs)["bleu"]
    assert result["valid_bleu"] == 100.0 and (cased < 100.0) == lowercases
    written = report.write_report(tmp_path, "val", refs, refs, refs, {}, vocabs.tgt.lowercases)
    assert written.get("lowercased_model", False) == lowercases
    assert ("The model lowercases" in (tmp_path / "val.report.md").read_text()) == lowercases


@pytest.mark.parametrize("special", ["<pad>", "<unk>", "<s>", "</s>", "<2fr>", "<bt>"])
def test_special_token_text_in_input_is_plain_text(special):
    """Before: HF tokenizers matched added tokens in raw text, so a literal <pad> in a source was masked as padding,
    </s> in a prefix ended the hypothesis, and <2fr> or <bt> typed by a user added a tag."""
    from mt.data.tokenizer import SPECIALS, with_bpe_dropout

    pairs = [("the <x> cat sees a dog / pad unk s bt 2fr", "die katze sieht einen hund")] * 20  # every character
    vocab = train_vocab(TokenizerConfig(vocab_size=80, min_frequency=1), pairs, (0, 1), ("<2fr>", "<bt>"))
    specials = {vocab.tokenizer.token_to_id(t) for t in (*SPECIALS, "<2fr>", "<bt>")}
    for encode in (vocab.encode, lambda text: vocab.encode_batch([text])[0],
                   lambda text: with_bpe_dropout(vocab, 0.1).encode(text, add_special_tokens=False).ids):  # fmt: skip
        ids = encode(f"the {special} cat")
        assert ids and not set(ids) & specials, (special, vocab.tokens(ids))
    assert vocab.decode(vocab.encode(f"the {special}x cat")).count(special[1:-1]) == 1


def _zipf_text(alphabet: list[str], n: int, length: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(alphabet))]
    return ["".join(rng.choices(alphabet, weights, k=length)) for _ in range(n)]


def test_a_cjk_alphabet_leaves_the_vocabulary_room_for_merges(caplog):
    """5,000 characters would fill a 4k vocabulary whole (no merges); the frequent ones are kept instead."""
    han = _zipf_text([chr(0x4E00 + i) for i in range(5_000)], 6_000, 30)
    english = [" ".join(random.Random(i).choices(["the", "cat", "sees", "a", "house"], k=6)) for i in range(6_000)]
    pairs = list(zip(han, english))
    whole = train_vocab(TokenizerConfig(vocab_size=4_000, character_coverage=1.0), pairs, (0, 1))
    with caplog.at_level(logging.INFO):
        cut = train_vocab(TokenizerConfig(vocab_size=4_000), pairs, (0, 1))
    merges = [len([t for t in v.tokenizer.get_vocab() if len(t) > 1 and t[0] >= "\u4e00"]) for v in (whole, cut)]
    assert merges[0] < 10 and merges[1] > 1_000
    assert re.search(r"an alphabet of 4,?\d{3} characters for 4000 entries: the 2000 most frequent kept", caplog.text)
    rarest = Counter("".join(han)).most_common()[-1][0]  # out of the cut alphabet: <unk>; in the whole: itself
    assert UNK in cut.encode(rarest) and UNK not in whole.encode(rarest)


def test_a_latin_alphabet_is_kept_whole_rare_letters_included():
    text = _zipf_text(list("abcdefghijklmnopqrstuvwxyz "), 3_000, 40) + ["Smørrebrød på Ærø"]
    vocab = train_vocab(TokenizerConfig(vocab_size=500, min_frequency=1), list(zip(text, text)), (0, 1))
    assert all(vocab.tokenizer.token_to_id(c) is not None for c in "øÆå")
    assert vocab.decode(vocab.encode("Ærø")) == "Ærø"
