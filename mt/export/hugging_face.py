"""`python -m mt.export transformers RUN OUT`: a model that Hugging Face transformers loads as one of its own.

No custom code travels with the export: the model becomes an existing transformers architecture whose computation
is this project's, weight for weight.

| this project                  | transformers                                                     |
|---|---|
| post-norm (the paper's)       | `MarianMTModel`: post-norm, sinusoidal positions from 0,         |
|                               | embeddings x sqrt(D), no embedding LayerNorm                     |
| pre-norm with final norms     | `PegasusForConditionalGeneration`: pre-norm blocks, final norms, |
|                               | the same positions and scaling                                   |
| tie_embeddings all/decoder/none | Marian's `share_encoder_decoder_embeddings` and                |
|                               | `tie_word_embeddings`; Pegasus: one matrix (all only)            |
| sinusoids interleaved (3.5)   | sinusoids in halves, [sin | cos]: `permutation` below            |

The layouts differ in one place: the position table's dimensions. Both hold the same functions of position, in
another order, so the whole model is re-expressed in transformers' order by one fixed permutation of the model
dimension, applied to every weight that reads or writes the residual stream (embeddings, the Q/K/V and FFN inputs,
the attention and FFN outputs, LayerNorms, the output projection). LayerNorm, attention and the FFN commute with a
permutation of their input and output features, so the permuted model computes the same function: the export is
exact, and checked once more on a probe batch before anything is written.

What no transformers architecture computes is refused with one line saying why: learned positions, Moses
pre-tokenization (transformers' tokenizers cannot run it), several target languages, a pre-norm model whose
encoder and decoder embeddings differ (Pegasus has one matrix).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from mt.config import ConfigError, DecodeConfig
from mt.data.tokenizer import BOS, EOS, PAD, SPECIALS, UNK, Vocabs
from mt.decode.search import output_cap
from mt.export.export_dir import export_dir
from mt.export.model_card import model_card
from mt.model import saved
from mt.model.transformer import Transformer

PROBE_TOLERANCE = 1e-4  # largest |logit difference| accepted on the probe batch (float32 sums in another order)


def require_transformers():
    """The transformers module, or a one-line error naming the extra that installs it."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            "transformers is not installed; pip install -e '.[transformers]' (or pip install transformers)"
        ) from None
    return transformers


def refusal(model: Transformer, vocabs: Vocabs, config: dict) -> str | None:
    """Why no transformers architecture computes this model exactly, or None when one does."""
    m = model.cfg
    if m.positions != "sinusoidal":
        return (f"model.positions={m.positions}: transformers' Marian and Pegasus add sinusoidal positions only; "
                "a learned table has no exact counterpart there (export release or ctranslate2 instead)")  # fmt: skip
    if vocabs.src.moses is not None:
        return ("tokenizer.pretokenize=moses: transformers' tokenizers cannot run Moses before the BPE, so its "
                "inputs would not be this model's (train without it to export to transformers)")  # fmt: skip
    if vocabs.src.case_markup:
        return ("tokenizer.case_markup=true: transformers' tokenizers cannot mark case before the BPE nor restore "
                "it after (train without it to export to transformers)")  # fmt: skip
    if (config.get("data") or {}).get("directions"):
        return ("a multilingual model (data.directions): its target-language tokens are chosen by this project's "
                "translate.py (tgt_lang=); export release or ctranslate2 instead")  # fmt: skip
    if not vocabs.joint:
        return ("separate source and target tokenizers: a transformers tokenizer holds one vocabulary "
                "(train with tokenizer.joint=true to export to transformers)")  # fmt: skip
    if m.norm == "pre" and m.tie_embeddings != "all":
        return (f"a pre-norm model with model.tie_embeddings={m.tie_embeddings}: Pegasus, transformers' "
                "pre-norm encoder-decoder, has one embedding matrix for encoder, decoder and output "
                "(tie_embeddings=all)")  # fmt: skip
    return None


def permutation(d_model: int) -> Tensor:
    """Feature order of transformers' sinusoids in this model's: [sin_0, cos_0, sin_1, ...] -> [sin_0, sin_1, ...,
    cos_0, cos_1, ...]. A vector in our layout `x` is `x[PERMUTATION]` in theirs."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def hf_config(model: Transformer):
    """The transformers config of `model`: Marian for post-norm, Pegasus for pre-norm, with our special ids."""
    transformers = require_transformers()
    m = model.cfg
    shape = dict(
        d_model=m.d_model,
        encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers,
        encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        max_position_embeddings=m.max_positions,
        activation_function="relu",  # 3.3
        scale_embedding=True,  # 3.4: embeddings x sqrt(D)
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation_dropout=m.activation_dropout,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,  # the decoder reads <s> first
        forced_eos_token_id=EOS,  # at the length limit only </s>, as this project's search
    )
    if m.norm == "pre":
        return transformers.PegasusConfig(vocab_size=model.src_vocab, tie_word_embeddings=True, **shape)
    return transformers.MarianConfig(
        vocab_size=model.src_vocab,
        decoder_vocab_size=model.tgt_vocab,
        share_encoder_decoder_embeddings=m.tie_embeddings == "all",
        tie_word_embeddings=m.tie_embeddings in ("all", "decoder"),
        **shape,
    )


def generation_config(model: Transformer, decode: DecodeConfig):
    """This run's decoding as transformers spells it. Its length limit is one number for every line (the model's
    positions, or decode.max_len); this project's `max_len_a * source + max_len_b` per line is the caller's
    `max_new_tokens`."""
    transformers = require_transformers()
    beam = dict(length_penalty=decode.length_penalty, early_stopping=True) if decode.beam_size > 1 else {}
    return transformers.GenerationConfig(
        num_beams=decode.beam_size,
        **beam,  # early_stopping: a sentence's search ends with its beam_size-th finished hypothesis, as here
        max_length=output_cap(model, decode) + 1,  # counts the decoder's <s>
        min_new_tokens=decode.min_len or None,
        suppress_tokens=[PAD, BOS] + ([UNK] if decode.no_unk else []),  # never produced by this project's search
        forced_eos_token_id=EOS,
        decoder_start_token_id=BOS,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )


def hf_state_dict(model: Transformer) -> dict[str, Tensor]:
    """`model`'s weights under transformers' names, permuted into its feature order (`permutation`)."""
    perm = permutation(model.cfg.d_model)
    reads = lambda w: w[:, perm]  # noqa: E731  a weight applied to the residual stream (or the encoder output)
    writes = lambda w: w[perm]  # noqa: E731  a weight or bias added to the residual stream; a LayerNorm's
    sd: dict[str, Tensor] = {}

    def linear(name: str, weight: Tensor, bias: Tensor, read: bool, write: bool) -> None:
        sd[f"{name}.weight"] = writes(reads(weight) if read else weight) if write else reads(weight)
        sd[f"{name}.bias"] = writes(bias) if write else bias

    def norm(name: str, ln) -> None:
        sd[f"{name}.weight"], sd[f"{name}.bias"] = writes(ln.weight), writes(ln.bias)

    def attention(name: str, attn) -> None:
        d = attn.out_proj.weight.size(0)
        if attn.cross:
            q = (attn.q_proj.weight, attn.q_proj.bias)
            k, v = zip(attn.kv_proj.weight.split(d), attn.kv_proj.bias.split(d))
        else:
            q, k, v = zip(attn.qkv_proj.weight.split(d), attn.qkv_proj.bias.split(d))
        for proj, (w, b) in zip(("q_proj", "k_proj", "v_proj"), (q, k, v)):
            linear(f"{name}.{proj}", w, b, read=True, write=False)
        linear(f"{name}.out_proj", attn.out_proj.weight, attn.out_proj.bias, read=False, write=True)

    def ffn(name: str, layer) -> None:
        linear(f"{name}.fc1", layer.ffn.linear1.weight, layer.ffn.linear1.bias, read=True, write=False)
        linear(f"{name}.fc2", layer.ffn.linear2.weight, layer.ffn.linear2.bias, read=False, write=True)

    for i, layer in enumerate(model.encoder):
        name = f"model.encoder.layers.{i}"
        attention(f"{name}.self_attn", layer.self_attn)
        norm(f"{name}.self_attn_layer_norm", layer.sub_attn.norm)
        ffn(name, layer)
        norm(f"{name}.final_layer_norm", layer.sub_ffn.norm)
    for i, layer in enumerate(model.decoder):
        name = f"model.decoder.layers.{i}"
        attention(f"{name}.self_attn", layer.self_attn)
        norm(f"{name}.self_attn_layer_norm", layer.sub_self.norm)
        attention(f"{name}.encoder_attn", layer.cross_attn)
        norm(f"{name}.encoder_attn_layer_norm", layer.sub_cross.norm)
        ffn(name, layer)
        norm(f"{name}.final_layer_norm", layer.sub_ffn.norm)
    if model.cfg.norm == "pre":
        norm("model.encoder.layer_norm", model.encoder_norm)
        norm("model.decoder.layer_norm", model.decoder_norm)
    if model.cfg.tie_embeddings == "all":
        sd["model.shared.weight"] = reads(model.tgt_embed.tokens.weight)
    sd["model.encoder.embed_tokens.weight"] = reads(model.src_embed.tokens.weight)
    sd["model.decoder.embed_tokens.weight"] = reads(model.tgt_embed.tokens.weight)
    sd["lm_head.weight"] = reads(model.output.weight)
    return {k: v.detach().float().contiguous().clone() for k, v in sd.items()}


def hf_model(model: Transformer, decode: DecodeConfig):
    """The transformers model computing what `model` computes (eval mode, float32)."""
    transformers = require_transformers()
    config = hf_config(model)
    cls = transformers.PegasusForConditionalGeneration if model.cfg.norm == "pre" else transformers.MarianMTModel
    hf = cls(config).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(model), strict=False)
    # The position tables are computed from the config, the output bias is zeros: nothing else may be left out.
    left = [k for k in missing if "embed_positions" not in k and k != "final_logits_bias"]
    if left or unexpected:
        raise ConfigError(f"this transformers version names the weights otherwise (missing {left[:3]}, "
                          f"unexpected {unexpected[:3]}); pip install 'transformers>=5'")  # fmt: skip
    hf.generation_config = generation_config(model, decode)
    return hf


@torch.no_grad()
def probe_difference(model: Transformer, hf) -> float:
    """The largest |logit difference| between `model` and its transformers twin on a made-up batch (padded sources,
    teacher-forced targets): the export's check that the permutation and the names are right."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(len(SPECIALS), model.src_vocab, (3, 11), generator=gen)
    src[1, 7:] = PAD
    src[:, -1].masked_fill_(src[:, -1] != PAD, EOS)
    src[1, 6] = EOS
    tgt = torch.randint(len(SPECIALS), model.tgt_vocab, (3, 9), generator=gen)
    tgt[:, 0] = BOS
    was_training = model.training
    model.eval()
    ours = model(src, src.eq(PAD), tgt)
    model.train(was_training)
    theirs = hf(input_ids=src, attention_mask=src.ne(PAD).long(), decoder_input_ids=tgt).logits
    return (ours - theirs).abs().max().item()


def hf_tokenizer(vocabs: Vocabs, max_positions: int):
    """The joint tokenizer as a `PreTrainedTokenizerFast`: this project's tokenizer.json with </s> appended to every
    input (the model reads sources that end with it), the specials named, no clean-up of spaces on decoding."""
    transformers = require_transformers()
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_str(vocabs.src.tokenizer.to_str())
    eos = SPECIALS[EOS]
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, EOS)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIALS[PAD],
        unk_token=SPECIALS[UNK],
        bos_token=SPECIALS[BOS],
        eos_token=SPECIALS[EOS],
        model_max_length=max_positions,
        clean_up_tokenization_spaces=False,
    )


def use_lines(decode: DecodeConfig) -> list[str]:
    """The model card's "Use" section for transformers."""
    penalty = "((5 + length) / 6)^alpha" if decode.length_penalty_type == "gnmt" else "length^alpha"
    return [
        "Load it with transformers (no custom code, nothing beyond `pip install transformers torch`):",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("THIS_DIR")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("THIS_DIR")',
        'batch = tokenizer(["A sentence to translate."], return_tensors="pt", padding=True)',
        "out = model.generate(**batch)  # the run's settings, from generation_config.json",
        "print(tokenizer.batch_decode(out, skip_special_tokens=True))",
        "```",
        "",
        f"generation_config.json holds the run's decoding: beam {decode.beam_size}, length penalty "
        f"{decode.length_penalty}. transformers divides a hypothesis' log-probability by length^alpha; the run's own "
        f"decoder divided by {penalty}, "
        "so beam outputs may differ on some lines (greedy ones do not). The run limited each line to "
        f"{decode.max_len_a} x its source tokens (</s> included) + {decode.max_len_b}; pass that as "
        "`max_new_tokens` to match it.",
        "",
    ]


def export_transformers(source: str, out_dir: Path, license: str | None = None) -> Path:
    """config.json, generation_config.json, model.safetensors, the tokenizer files and README.md (a model card)."""
    ckpt = saved.load(source)
    model, vocabs = saved.build_model(ckpt)
    config = ckpt.get("config") or {}
    why = refusal(model, vocabs, config)
    if why is not None:
        raise ConfigError(f"{source}: cannot export to transformers: {why}")
    known = DecodeConfig.__dataclass_fields__
    decode = DecodeConfig(**{k: v for k, v in (config.get("decode") or {}).items() if k in known})
    model.eval()
    hf = hf_model(model, decode)
    diff = probe_difference(model, hf)
    if diff > PROBE_TOLERANCE:
        raise ConfigError(f"{source}: the transformers model's logits differ by {diff:.2g} from this model's "
                          f"on a probe batch (allowed {PROBE_TOLERANCE}); this transformers version computes "
                          "otherwise")  # fmt: skip
    architecture = type(hf).__name__
    require_transformers().utils.logging.disable_progress_bar()  # no bar for a one-file write
    with export_dir(out_dir, "transformers", Path(ckpt["path"])) as staging:
        hf.save_pretrained(staging)
        hf_tokenizer(vocabs, model.cfg.max_positions).save_pretrained(staging)
        exported = (f"Exported with `python -m mt.export transformers` as `{architecture}` (weights permuted into its "
                    f"feature order; largest logit difference on a probe batch {diff:.1e}).")  # fmt: skip
        card = model_card(ckpt, model, out_dir.resolve().name, library="transformers", use=use_lines(decode),
                          license=license, exported=exported)  # fmt: skip
        (staging / "README.md").write_text(card, encoding="utf-8")
        record = {"architecture": architecture, "source": str(ckpt["path"]), "probe_max_logit_difference": diff}
        (staging / "mt_export.json").write_text(json.dumps(record, indent=2) + "\n")
    return out_dir


@torch.no_grad()
def generate_ids(hf, sources: list[list[int]], decode: DecodeConfig, batch_size: int = 64) -> list[list[int]]:
    """Translate source ids (without </s>) with transformers' `generate` under this project's per-line length limit
    (`max_len_a` x source tokens, </s> included, + `max_len_b`): lines are grouped by their limit, which becomes
    `max_length` (`max_new_tokens` plus the decoder's <s>). Returns the output ids without <s> and </s>, in the
    order of `sources`."""
    positions = hf.config.max_position_embeddings
    cap = min(positions - 1, decode.max_len or positions)  # as `output_cap`
    limit = [max(1, min(cap, int((len(s) + 1) * decode.max_len_a + decode.max_len_b))) for s in sources]
    out: list[list[int]] = [[] for _ in sources]
    for n in sorted(set(limit)):
        rows = [i for i in range(len(sources)) if limit[i] == n]
        for start in range(0, len(rows), batch_size):
            part = rows[start : start + batch_size]
            longest = max(len(sources[i]) + 1 for i in part)
            ids = torch.full((len(part), longest), PAD)
            for j, i in enumerate(part):
                ids[j, : len(sources[i]) + 1] = torch.tensor(sources[i] + [EOS])
            # max_length counts the decoder's <s>: n new tokens, the last one forced to </s> as here
            gen = hf.generate(input_ids=ids, attention_mask=ids.ne(PAD).long(), max_length=n + 1,
                              num_beams=decode.beam_size, do_sample=False)  # fmt: skip
            for j, i in enumerate(part):
                row = gen[j, 1:].tolist()
                out[i] = row[: row.index(EOS)] if EOS in row else [t for t in row if t != PAD]
    return out
