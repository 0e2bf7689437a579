"""Export a trained model for use outside training.

    python -m mt.export ctranslate2 RUN_DIR_OR_PT OUT_DIR [--quantization int8|int8_float32|float16|...]
    python -m mt.export release RUN_DIR_OR_PT OUT_DIR [--license ID]
    python -m mt.export transformers RUN_DIR_OR_PT OUT_DIR [--license ID]

`ctranslate2`: a CTranslate2 model directory (model.bin, vocabularies, config.json) built with CTranslate2's
Transformer spec from this project's weights, plus our `tokenizer.json` and `decode.json` so that translate.py
(`checkpoint=OUT_DIR`) decodes it with the same tokenizer and settings. `release`: `model.safetensors`,
`config.json` and the tokenizer, a model that loads without unpickling anything (a `.pt` is a pickle: loading one
from elsewhere runs whatever code it carries). `transformers`: a folder that transformers' AutoModelForSeq2SeqLM
and AutoTokenizer load offline (mt/export/hugging_face.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from mt.data.tokenizer import BOS, EOS, PAD, UNK, Vocabs
from mt.decode.ct2 import require_ctranslate2
from mt.errors import USER_ERRORS
from mt.export.export_dir import export_dir
from mt.export.model_card import model_card
from mt.model import saved
from mt.model.saved import CT2_FORMAT, RELEASE_FORMAT
from mt.model.transformer import Transformer


def _array(t) -> np.ndarray:
    """A copy: `.numpy()` shares the tensor's memory, and the converter's quantization rewrites arrays in place."""
    return t.detach().float().cpu().numpy().copy()


def _linear(spec, module) -> None:
    spec.weight = _array(module.weight)
    if module.bias is not None:
        spec.bias = _array(module.bias)


def _norm(spec, module) -> None:
    spec.gamma, spec.beta = _array(module.weight), _array(module.bias)


def _embedding(spec, embed) -> None:
    """Tokens and this model's own position table (3.5, sin and cos interleaved from position 0): CTranslate2's
    built-in sinusoid concatenates the halves instead, which would silently scramble every position."""
    tokens = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings  # the encoder's is a list
    tokens.weight = _array(embed.tokens.weight)
    spec.position_encodings.encodings = _array(embed.positions)
    spec.scale_embeddings = True  # x sqrt(D) (3.4), as Embedding does


def _vocabulary(vocab) -> list[str]:
    tokens = [vocab.id_to_token(i) for i in range(len(vocab))]
    tokens[PAD] = "<blank>"  # CTranslate2's name for padding
    return tokens


def ctranslate2_spec(model: Transformer, vocabs: Vocabs):
    """CTranslate2's TransformerSpec filled with `model`'s weights and vocabularies."""
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm == "pre",
        activation=common_spec.Activation.RELU,
    )
    enc, dec = spec.encoder, spec.decoder
    _embedding(enc, model.src_embed)
    _embedding(dec, model.tgt_embed)
    for s, layer in zip(enc.layer, model.encoder):
        _linear(s.self_attention.linear[0], layer.self_attn.qkv_proj)  # fused q, k, v in that order
        _linear(s.self_attention.linear[1], layer.self_attn.out_proj)
        _norm(s.self_attention.layer_norm, layer.sub_attn.norm)
        _linear(s.ffn.linear_0, layer.ffn.linear1)
        _linear(s.ffn.linear_1, layer.ffn.linear2)
        _norm(s.ffn.layer_norm, layer.sub_ffn.norm)
    for s, layer in zip(dec.layer, model.decoder):
        _linear(s.self_attention.linear[0], layer.self_attn.qkv_proj)
        _linear(s.self_attention.linear[1], layer.self_attn.out_proj)
        _norm(s.self_attention.layer_norm, layer.sub_self.norm)
        _linear(s.attention.linear[0], layer.cross_attn.q_proj)
        _linear(s.attention.linear[1], layer.cross_attn.kv_proj)  # fused k, v
        _linear(s.attention.linear[2], layer.cross_attn.out_proj)
        _norm(s.attention.layer_norm, layer.sub_cross.norm)
        _linear(s.ffn.linear_0, layer.ffn.linear1)
        _linear(s.ffn.linear_1, layer.ffn.linear2)
        _norm(s.ffn.layer_norm, layer.sub_ffn.norm)
    if cfg.norm == "pre":  # the stacks' final norms
        _norm(enc.layer_norm, model.encoder_norm)
        _norm(dec.layer_norm, model.decoder_norm)
    dec.projection.weight = _array(model.output.weight)  # tied: the same values, stored once by the converter
    spec.register_source_vocabulary(_vocabulary(vocabs.src))
    spec.register_target_vocabulary(_vocabulary(vocabs.tgt))
    spec.config.unk_token = vocabs.tgt.tokenizer.id_to_token(UNK)
    spec.config.bos_token = vocabs.tgt.tokenizer.id_to_token(BOS)
    spec.config.eos_token = vocabs.tgt.tokenizer.id_to_token(EOS)
    spec.config.decoder_start_token = spec.config.bos_token  # the decoder reads <s> first
    spec.config.add_source_eos = True  # sources end with </s>
    spec.config.layer_norm_epsilon = model.encoder[0].sub_attn.norm.eps
    return spec


def export_ctranslate2(source: str, out_dir: Path, quantization: str | None = None) -> Path:
    require_ctranslate2()  # before anything is read or written
    ckpt = saved.load(source)
    model, vocabs = saved.build_model(ckpt)
    with export_dir(out_dir, "ctranslate2", Path(ckpt["path"])) as staging:
        if vocabs.family != "bpe":  # an imported model: CTranslate2's own converter, from its transformers export
            convert_imported(ckpt, model, vocabs, staging, quantization)
        else:
            write_ctranslate2(model, vocabs, staging, quantization, _shareable_config(ckpt), str(ckpt["path"]))
    return out_dir


def convert_imported(ckpt: dict, model: Transformer, vocabs: Vocabs, out_dir: Path, quantization: str | None) -> None:
    """An imported model (OPUS-MT, NLLB) through CTranslate2's transformers converter, the way its users convert
    such models (ct2-transformers-converter), from this model's transformers export; then its tokenizer files
    and `mt.json` beside, as `write_ctranslate2` writes them."""
    import tempfile

    from ctranslate2.converters import TransformersConverter

    from mt.export.hugging_face import export_transformers

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = export_transformers(str(ckpt["path"]), Path(tmp) / "hf")
        converted = Path(tmp) / "ct2"
        TransformersConverter(str(hf_dir)).convert(str(converted), quantization=quantization)
        for f in converted.iterdir():
            f.replace(out_dir / f.name)
    vocabs.save(out_dir)
    meta = {"format": CT2_FORMAT, "source": str(ckpt["path"]), "quantization": quantization or "float32",
            "model_args": model.config_dict(), "config": _shareable_config(ckpt)}  # fmt: skip
    (out_dir / "mt.json").write_text(json.dumps(meta, indent=2))


def write_ctranslate2(
    model: Transformer, vocabs: Vocabs, out_dir: Path, quantization: str | None, config: dict, source: str = ""
) -> Path:
    """The CTranslate2 model directory, with our tokenizer files and `mt.json` (model and decode settings), written
    into `out_dir` (created if missing). What CTranslate2's Converter does, without its `force`, which deletes the
    whole output directory first."""
    spec = ctranslate2_spec(model, vocabs)
    spec.validate()
    spec.optimize(quantization=quantization)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))
    vocabs.save(out_dir)
    meta = {"format": CT2_FORMAT, "source": source, "quantization": quantization or "float32"}
    meta |= {"model_args": model.config_dict(), "config": config}
    (out_dir / "mt.json").write_text(json.dumps(meta, indent=2))
    return out_dir


# ---------------------------------------------------------------------------------------------------- release


def _shareable_config(ckpt: dict) -> dict:
    """What a user of the model needs from the run's config: languages, decode settings, and where the corpus was
    (so that `references=test` still finds a split on the machine that trained it)."""
    config = ckpt.get("config") or {}
    data = config.get("data", {})
    return {
        "data": {k: data[k] for k in ("name", "format", "dir", "src_lang", "tgt_lang") if k in data},
        "decode": config.get("decode", {}),
        "tokenizer": config.get("tokenizer", {}),
        "length_ratio": ckpt.get("length_ratio"),  # the training pairs' length range (mt/decode/flags.py)
    }


def export_release(source: str, out_dir: Path, license: str | None = None) -> Path:
    """model.safetensors (weights; a tied matrix once), config.json, tokenizer.json (or .src/.tgt), and README.md,
    a model card (mt/export/model_card.py)."""
    from safetensors.torch import save_model

    ckpt = saved.load(source)
    model, vocabs = saved.build_model(ckpt)
    with export_dir(out_dir, "release", Path(ckpt["path"])) as staging:
        save_model(model, str(staging / "model.safetensors"))
        vocabs.save(staging)
        config = {"format": RELEASE_FORMAT, "model_args": model.config_dict(), "config": _shareable_config(ckpt)}
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        card = model_card(ckpt, model, out_dir.resolve().name, license=license)
        (staging / "README.md").write_text(card, encoding="utf-8")
    return out_dir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m mt.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="kind", required=True)
    ct = sub.add_parser("ctranslate2", help="a CTranslate2 model directory")
    ct.add_argument("source", help="a run dir (its final checkpoint) or a .pt")
    ct.add_argument("out", type=Path)
    ct.add_argument("--quantization", default=None, help="int8, int8_float32, int8_float16, float16, bfloat16, ...")
    rel = sub.add_parser("release", help="safetensors weights, config.json and the tokenizer: no pickle")
    rel.add_argument("source", help="a run dir (its final checkpoint) or a .pt")
    rel.add_argument("out", type=Path)
    hf = sub.add_parser("transformers", help="a Hugging Face transformers model (Marian or Pegasus) and tokenizer")
    hf.add_argument("source", help="a run dir (its final checkpoint) or a .pt")
    hf.add_argument("out", type=Path)
    for p in (rel, hf):
        p.add_argument("--license", default=None, help="the model card's licence field, e.g. cc-by-4.0")
    args = ap.parse_args(argv)
    try:
        if args.kind == "ctranslate2":
            out = export_ctranslate2(args.source, args.out, args.quantization)
        elif args.kind == "transformers":
            from mt.export.hugging_face import export_transformers

            out = export_transformers(args.source, args.out, args.license)
        else:
            out = export_release(args.source, args.out, args.license)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{args.kind}: wrote {out}")


if __name__ == "__main__":
    main()
