"""Tiny transformers checkpoints built by transformers itself, saved as the Hub's are (`save_pretrained`), for the
exactness tests of mt/model/hub.py: OPUS-MT-shaped Marian models (a shared vocabulary; separate vocabularies; a
multilingual one with >>xxx<< target codes) and an NLLB-shaped M2M100 model with its language codes. Their
SentencePiece models are trained on the shared corpora, their weights a few hundred steps on pairs of them (so that
they end their outputs with </s>), and Marian's final_logits_bias is set to non-zero values."""

from __future__ import annotations

import gzip
import hashlib
import inspect
import json
import os
import shutil
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CACHE = Path.home() / ".cache" / "mt-tests" / "hub-models"  # built once per version of this file, kept between runs
STEPS = 400
# What Helsinki-NLP/opus-mt-de-en's generation_config.json holds (../shared/reference/hub-configs), with this model's
# <pad> id: beam 4, <pad> never generated, scores renormalized after the processors.
MARIAN_GENERATION = {"num_beams": 4, "max_length": 512, "renormalize_logits": True}


def lines(corpus: str, split: str, lang: str, n: int) -> list[str]:
    with gzip.open(DATA / corpus / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]


def train_spm(texts: list[str], prefix: Path, kind: str, size: int, symbols: list[str] | None = None) -> Path:
    import sentencepiece as spm

    text = prefix.with_suffix(".txt")
    text.write_text("\n".join(texts), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(prefix), vocab_size=size, model_type=kind,
                                   character_coverage=1.0, minloglevel=2, user_defined_symbols=symbols or [],
                                   num_threads=2)  # fmt: skip
    return prefix.with_suffix(".model")


def marian_vocab(models: list[Path], codes: list[str]) -> dict[str, int]:
    """vocab.json as transformers' Marian converter writes it: </s> 0, <unk> 1, the pieces, the codes, <pad> last."""
    import sentencepiece as spm

    vocab = {"</s>": 0, "<unk>": 1}
    for m in models:
        sp = spm.SentencePieceProcessor(model_file=str(m))
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if piece not in ("<unk>", "<s>", "</s>") and piece not in vocab:
                vocab[piece] = len(vocab)
    for code in codes:
        vocab.setdefault(code, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def fit(model, tokenizer, pairs: list[tuple[str, str]], steps: int = STEPS) -> None:
    """A few hundred Adam steps of teacher forcing on the sources of up to 30 words and their references' first 8
    words: what a model this small learns in seconds well enough to end most of its outputs with </s> (the rest
    loop until the length limit stops them)."""
    pairs = [(s, " ".join(t.split()[:8])) for s, t in pairs if len(s.split()) <= 30]
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model.train()
    for step in range(steps):
        batch = [pairs[(step * 32 + i) % len(pairs)] for i in range(32)]
        enc = tokenizer([s for s, _ in batch], text_target=[t for _, t in batch], return_tensors="pt",
                        padding=True, truncation=True, max_length=64)  # fmt: skip
        enc["labels"][enc["labels"] == tokenizer.pad_token_id] = -100
        loss = model(**enc).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def shape(**extra) -> dict:
    return dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256, dropout=0.1, **extra)  # fmt: skip


def build_marian(out: Path, kind: str) -> Path:
    """kind: "shared" (one vocabulary, tied), "separate" (two vocabularies, the output untied) or "multi" (shared,
    English into German or French by a >>deu<< / >>fra<< code first in the source)."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True)
    if kind == "multi":
        de = list(zip(lines("opus_emea_de_en", "train", "en", 2000), lines("opus_emea_de_en", "train", "de", 2000)))
        fr = list(zip(lines("opus_emea_en_fr", "train", "en", 2000), lines("opus_emea_en_fr", "train", "fr", 2000)))
        pairs = [(f">>deu<< {s}", t) for s, t in de] + [(f">>fra<< {s}", t) for s, t in fr]
        pairs = [p for pair in zip(pairs[:2000], pairs[2000:]) for p in pair]
        src_text, tgt_text, codes = [s for s, _ in de], [t for _, t in de + fr], [">>deu<<", ">>fra<<"]
    else:
        pairs = list(zip(lines("opus_emea_de_en", "train", "de", 3000), lines("opus_emea_de_en", "train", "en", 3000)))
        src_text, tgt_text, codes = [s for s, _ in pairs], [t for _, t in pairs], []
    source = train_spm(src_text, out / "src", "unigram", 800)
    target = train_spm(tgt_text, out / "tgt", "unigram", 800)
    separate = kind == "separate"
    vocab = marian_vocab([source] if separate else [source, target], codes)
    target_vocab = marian_vocab([target], []) if separate else vocab
    shutil.move(source, out / "source.spm")
    shutil.move(target, out / "target.spm")
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2), encoding="utf-8")
    if separate:
        (out / "target_vocab.json").write_text(json.dumps(target_vocab, ensure_ascii=False, indent=2), encoding="utf-8")
    for f in out.glob("*.vocab"):
        f.unlink()
    for f in out.glob("*.txt"):
        f.unlink()
    pad = len(vocab) - 1
    # transformers' Marian has one <pad> id for both sides (as OPUS-MT's separate vocabularies of one size have)
    assert len(target_vocab) - 1 == pad
    config = MarianConfig(vocab_size=len(vocab), decoder_vocab_size=len(target_vocab), activation_function="swish",
                          scale_embedding=True, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                          forced_eos_token_id=0, share_encoder_decoder_embeddings=not separate,
                          tie_word_embeddings=not separate, **shape())  # fmt: skip
    torch.manual_seed(1)
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.5)
    tokenizer = MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                                target_vocab_file=str(out / "target_vocab.json") if separate else None,
                                separate_vocabs=separate, source_lang="en" if kind == "multi" else "de",
                                target_lang=None if kind == "multi" else "en")  # fmt: skip
    fit(model, tokenizer, pairs)
    with torch.no_grad():  # as transformers' converter writes OPUS-MT: the decoder starts from a zero embedding
        for emb in {id(e): e for e in (model.get_input_embeddings(), model.get_decoder().embed_tokens)}.values():
            emb.weight[pad].zero_()
        model.final_logits_bias[0, pad] = 0.0
    model.generation_config.update(bad_words_ids=[[pad]], **MARIAN_GENERATION)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_nllb(out: Path) -> Path:
    """An NLLB-shaped M2M100 (pre-norm, fairseq sinusoids after the padding id, ReLU) with NLLB's tokenizer: a
    SentencePiece BPE model, fairseq's offset and the 202 language codes; trained German -> English."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    out.mkdir(parents=True)
    pairs = list(zip(lines("opus_emea_de_en", "train", "de", 3000), lines("opus_emea_de_en", "train", "en", 3000)))
    bpe = train_spm([s for s, _ in pairs] + [t for _, t in pairs], out / "bpe", "bpe", 1000)
    shutil.move(bpe, out / "sentencepiece.bpe.model")
    for f in [*out.glob("*.vocab"), *out.glob("*.txt")]:
        f.unlink()
    tokenizer = NllbTokenizer.from_pretrained(str(out), extra_special_tokens=FAIRSEQ_LANGUAGE_CODES,
                                              src_lang="deu_Latn", tgt_lang="eng_Latn")  # fmt: skip
    config = M2M100Config(vocab_size=len(tokenizer) + 2, activation_function="relu", scale_embedding=True,
                          pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                          encoder_layerdrop=0.0, decoder_layerdrop=0.0, **shape())  # fmt: skip
    torch.manual_seed(2)
    model = M2M100ForConditionalGeneration(config)
    fit(model, tokenizer, pairs)
    model.generation_config.update(max_length=200)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


BUILDERS = {"marian_shared": lambda d: build_marian(d, "shared"),
            "marian_separate": lambda d: build_marian(d, "separate"),
            "marian_multi": lambda d: build_marian(d, "multi"), "nllb": build_nllb}  # fmt: skip


def hub_model(name: str, root: Path = CACHE) -> Path:
    """The checkpoint `name` under `root`, built once per version of this file and of transformers (a second test
    session reuses it)."""
    import transformers

    root.mkdir(parents=True, exist_ok=True)
    code = inspect.getsource(inspect.getmodule(hub_model)) + transformers.__version__
    key = hashlib.sha256(code.encode()).hexdigest()[:12]
    out = root / f"{name}-{key}"
    if not (out / "config.json").is_file():
        tmp = root / f"{name}-{key}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        BUILDERS[name](tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out
