"""The published configs of Helsinki-NLP/opus-mt-de-en and facebook/nllb-200-distilled-600M (tests/fixtures/
hub-configs): the loader reads them as the architectures they are, their generation configs as this project's
decoding, and a tiny model with the same flags (its sizes shrunk, every flag kept) computes transformers' logits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mt.data.tokenizer import Specials
from mt.model.hf_format import model_config
from mt.model.hub import decode_settings

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

FIXTURES = Path(__file__).parent / "fixtures" / "hub-configs"
SHRUNK = dict(d_model=32, encoder_layers=2, decoder_layers=2, num_hidden_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)  # fmt: skip


def fixture(name: str, kind: str) -> dict:
    return json.loads((FIXTURES / f"{name}.{kind}.json").read_text())


def test_the_opus_mt_config_is_marian_as_published():
    cfg, src, tgt = model_config(fixture("opus-mt-de-en", "config"), "opus-mt-de-en")
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.encoder_layers, cfg.decoder_layers) == (512, 8, 2048, 6, 6)
    assert (cfg.norm, cfg.activation, cfg.sinusoids, cfg.position_offset, cfg.scale_embedding) == (
        "post", "swish", "halves", 0, True)  # fmt: skip
    assert cfg.output_bias and cfg.mask_pad_logit and cfg.tie_embeddings == "all" and src == tgt == 58_101
    assert (cfg.pad_id, cfg.decoder_start_id, cfg.eos_id, cfg.max_positions) == (58_100, 58_100, 0, 512)
    decode = decode_settings(fixture("opus-mt-de-en", "generation_config"), Specials.of(cfg), "opus-mt-de-en")
    assert decode == {"beam_size": 4, "length_penalty": 1.0, "length_penalty_type": "average",
                      "early_stopping": False, "renormalize": True, "score_forced": False, "max_len": 511}  # fmt: skip


def test_the_nllb_config_is_m2m100_as_published():
    cfg, src, tgt = model_config(fixture("nllb-200-distilled-600M", "config"), "nllb")
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.encoder_layers, cfg.decoder_layers) == (1024, 16, 4096, 12, 12)
    assert (cfg.norm, cfg.activation, cfg.sinusoids, cfg.position_offset, cfg.scale_embedding) == (
        "pre", "relu", "fairseq", 2, True)  # fmt: skip
    assert not cfg.output_bias and not cfg.mask_pad_logit and cfg.tie_embeddings == "all" and src == 256_206
    assert (cfg.pad_id, cfg.decoder_start_id, cfg.eos_id, cfg.max_positions) == (1, 2, 2, 1024)
    decode = decode_settings(fixture("nllb-200-distilled-600M", "generation_config"), Specials.of(cfg), "nllb")
    assert decode["beam_size"] == 1 and decode["max_len"] == 199 and not decode["renormalize"]


@pytest.mark.parametrize("name", ["opus-mt-de-en", "nllb-200-distilled-600M"])
def test_a_tiny_model_with_the_published_flags_computes_transformers_logits(name, tmp_path):
    """The published config with its sizes shrunk (and the vocabulary of a tiny tokenizer), every other key as
    published: built and saved by transformers, read here, the same logits on a padded batch."""
    from mt.data.batching import collate
    from mt.model import saved
    from tests.hub_models import hub_model

    tiny = hub_model("marian_shared" if name.startswith("opus") else "nllb")
    out = tmp_path / name
    shutil.copytree(tiny, out)
    config = {**fixture(name, "config"), **SHRUNK}
    if name.startswith("opus"):
        vocab = len(json.loads((tiny / "vocab.json").read_text()))
        config |= dict(vocab_size=vocab, decoder_vocab_size=vocab, pad_token_id=vocab - 1,
                       decoder_start_token_id=vocab - 1, bad_words_ids=[[vocab - 1]])  # fmt: skip
        generation = {**fixture(name, "generation_config"), "bad_words_ids": [[vocab - 1]],
                      "decoder_start_token_id": vocab - 1, "pad_token_id": vocab - 1}  # fmt: skip
    else:
        config["vocab_size"] = json.loads((tiny / "config.json").read_text())["vocab_size"]
        generation = fixture(name, "generation_config")
    cls = transformers.MarianMTModel if name.startswith("opus") else transformers.M2M100ForConditionalGeneration
    keys = set(cls.config_class.__dataclass_fields__) if hasattr(cls.config_class, "__dataclass_fields__") else None
    torch.manual_seed(0)
    hf = cls(cls.config_class(**{k: v for k, v in config.items() if keys is None or k in keys})).eval()
    if name.startswith("opus"):
        with torch.no_grad():
            hf.final_logits_bias.normal_(0, 0.5)
    hf.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(config))  # every published key, as the Hub's file has them
    (out / "generation_config.json").write_text(json.dumps(generation))
    hf = cls.from_pretrained(out).eval()
    model, vocabs = saved.build_model(saved.load(out))
    model.eval()
    framing = vocabs.framing("de", "en")
    src = ["Eine Tablette am Tag.", "Wenn Sie andere Arzneimittel einnehmen, fragen Sie Ihren Arzt.", ""]
    tgt = ["One tablet a day.", "Ask your doctor.", "x"]
    b = collate([vocabs.src.encode(s) for s in src], [vocabs.tgt.encode(t) for t in tgt], [0, 1, 2], framing)
    with torch.no_grad():
        ours = model(b.src, b.src_pad_mask, b.tgt_in)
        theirs = hf(input_ids=b.src, attention_mask=(~b.src_pad_mask).long(), decoder_input_ids=b.tgt_in).logits
    real = b.tgt_out.ne(framing.specials.pad)
    finite = torch.isfinite(ours[real])
    assert (ours[real][finite] - theirs[real][finite]).abs().max() < 1e-5
