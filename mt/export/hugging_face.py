"""`python -m mt.export transformers RUN OUT`: a model that Hugging Face transformers loads as one of its own.

No custom code travels with the export: the model becomes an existing transformers architecture whose computation
is this project's, weight for weight (the names: mt/model/hf_format.py, the table the import reads too).

| this project                  | transformers                                                     |
|---|---|
| post-norm (the paper's)       | `MarianMTModel`: post-norm, sinusoidal positions from 0,         |
|                               | embeddings x sqrt(D), no embedding LayerNorm                     |
| pre-norm with final norms     | `PegasusForConditionalGeneration`: pre-norm blocks, final norms, |
|                               | the same positions and scaling                                   |
| an imported OPUS-MT or NLLB   | its own class (`MarianMTModel`, `M2M100ForConditionalGeneration`)|
| model, fine-tuned or not      | with its own tokenizer files and generation config               |
| tie_embeddings all/decoder/none | Marian's `share_encoder_decoder_embeddings` and                |
|                               | `tie_word_embeddings`; Pegasus: one matrix (all only)            |
| sinusoids interleaved (3.5)   | sinusoids in halves, [sin | cos]: `permutation` below            |

This project's own models lay their position table out as the paper does, interleaved; transformers' in halves.
Both hold the same functions of position, in another order, so such a model is re-expressed in transformers'
order by one fixed permutation of the model dimension, applied to every weight that reads or writes the residual
stream (the table's `features` axis). LayerNorm, attention and the FFN commute with a permutation of their input
and output features, so the permuted model computes the same function: the export is exact, and checked once more
on a probe batch before anything is written. An imported model keeps transformers' layout and is written as read.

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
from mt.data.tokenizer import BOS, EOS, PAD, PAPER_FRAMING, SPECIALS, UNK, Framing, Vocabs
from mt.decode.search import output_cap
from mt.errors import TokenizerError
from mt.export.export_dir import export_dir
from mt.export.model_card import model_card
from mt.model import hf_format, saved
from mt.model.transformer import Transformer
from mt.train.records import hub_record

# config.json keys of an imported model that this project does not model (training-time settings): written back
# with the checkpoint's own values rather than transformers' defaults.
CARRIED = ("encoder_layerdrop", "decoder_layerdrop", "init_std", "classifier_dropout", "tokenizer_class")
PROBE_TOLERANCE = 1e-4  # largest |logit difference| accepted on the probe batch (float32 sums in another order)
CLASSES = {"marian": ("MarianConfig", "MarianMTModel"), "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration"),
           "m2m_100": ("M2M100Config", "M2M100ForConditionalGeneration")}  # fmt: skip


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
    why = hf_format.refusal(model.cfg)
    if why is not None or vocabs.family != "bpe":  # an imported model's tokenizer files go back as they came
        return why
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
    return None


def permutation(d_model: int) -> Tensor:
    """Feature order of transformers' sinusoids in this model's: [sin_0, cos_0, sin_1, ...] -> [sin_0, sin_1, ...,
    cos_0, cos_1, ...]. A vector in our layout `x` is `x[PERMUTATION]` in theirs."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def hf_config(model: Transformer, parent: dict | None = None):
    """The transformers config of `model` (hf_format.config_dict: Marian, Pegasus or M2M100), with the values of
    `CARRIED` keys an imported model's own config.json held (`parent`)."""
    transformers = require_transformers()
    kind = hf_format.hf_kind(model.cfg)
    carried = {k: v for k, v in (parent or {}).items() if k in CARRIED}
    config = hf_format.config_dict(model.cfg, model.src_vocab, model.tgt_vocab) | carried
    return getattr(transformers, CLASSES[kind][0])(**config)


def generation_config(model: Transformer, decode: DecodeConfig, imported: bool = False, target: int | None = None):
    """This run's decoding as transformers spells it. Its length limit is one number for every line (the model's
    positions, or decode.max_len); this project's `max_len_a * source + max_len_b` per line is the caller's
    `max_new_tokens`. An imported model's keeps its generation config's keys (length^alpha, its stopping rule,
    renormalized scores, <pad> banned) and forces its target-language token first (`target`: NLLB's)."""
    transformers = require_transformers()
    sp = model.specials
    if imported:
        extra = {"bad_words_ids": [[sp.pad]]} if model.cfg.mask_pad_logit else {}
        extra |= {"renormalize_logits": True} if decode.renormalize else {}
        extra |= {"forced_bos_token_id": target} if target is not None else {}
        beam = dict(length_penalty=decode.length_penalty, early_stopping=decode.early_stopping)
        return transformers.GenerationConfig(
            num_beams=decode.beam_size, **(beam if decode.beam_size > 1 else {}), **extra,
            max_length=output_cap(model, decode) + 1, forced_eos_token_id=sp.eos if model.cfg.mask_pad_logit else None,
            decoder_start_token_id=sp.start, eos_token_id=sp.eos, pad_token_id=sp.pad,
        )  # fmt: skip
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
    """`model`'s weights under transformers' names (hf_format.weight_table), this project's own models permuted
    into transformers' feature order (`permutation`)."""
    ours = model.state_dict()
    perm = permutation(model.cfg.d_model) if model.cfg.sinusoids == "paper" else None
    sd: dict[str, Tensor] = {}
    for w in hf_format.weight_table(model.cfg):
        tensor = ours[w.ours]
        if w.block is not None:  # a block of rows of a fused projection: Q, K, V (or K, V)
            n = 3 if ".qkv_proj." in w.ours else 2
            tensor = tensor.chunk(n)[w.block]
        if perm is not None and w.features is not None:
            tensor = tensor.index_select(w.features, perm)
        sd[w.theirs] = tensor.reshape(1, -1) if w.ours == "output_bias" else tensor
    return {k: v.detach().float().contiguous().clone() for k, v in sd.items()}


def hf_model(model: Transformer, decode: DecodeConfig, imported: bool = False, target: int | None = None,
             parent: dict | None = None):  # fmt: skip
    """The transformers model computing what `model` computes (eval mode, float32)."""
    transformers = require_transformers()
    cls = getattr(transformers, CLASSES[hf_format.hf_kind(model.cfg)][1])
    hf = cls(hf_config(model, parent)).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(model), strict=False)
    # The position tables are computed from the config, the output bias is zeros: nothing else may be left out.
    left = [k for k in missing if "embed_positions" not in k and k != "final_logits_bias"]
    if left or unexpected:
        raise ConfigError(f"this transformers version names the weights otherwise (missing {left[:3]}, "
                          f"unexpected {unexpected[:3]}); pip install 'transformers>=5'")  # fmt: skip
    hf.generation_config = generation_config(model, decode, imported, target)
    return hf


def run_languages(vocabs, data: dict, where: str) -> dict[str, str]:
    """An imported NLLB model's source and target codes as the run reads and writes (data.src_lang / tgt_lang, in
    any spelling: de, deu_Latn), in the checkpoint's spelling; {} for a model without language tokens."""
    if vocabs.family != "tokenizers" or not vocabs.languages:
        return {}
    out = {}
    for key in ("src_lang", "tgt_lang"):
        if data.get(key):
            try:
                out[key] = vocabs.src.id_to_token(vocabs.language_id(data[key], key))
            except TokenizerError as e:
                raise ConfigError(f"{where}: {e}") from None
    return out


def write_languages(staging: Path, codes: dict[str, str]) -> None:
    """tokenizer_config.json's src_lang / tgt_lang set to the run's pair (the tokenizer frames sources with it)."""
    path = staging / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    path.write_text(json.dumps({**config, **codes}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@torch.no_grad()
def probe_difference(model: Transformer, hf) -> float:
    """The largest |logit difference| between `model` and its transformers twin on a made-up batch (padded sources,
    teacher-forced targets) at the logits this model computes (a Marian model's <pad> is -inf here): the export's
    check that the permutation and the names are right."""
    sp = model.specials
    gen = torch.Generator().manual_seed(0)
    special = (sp.pad, sp.unk, sp.start, sp.eos)
    ordinary = torch.tensor([i for i in range(min(model.src_vocab, model.tgt_vocab)) if i not in special])
    src = ordinary[torch.randint(len(ordinary), (3, 11), generator=gen)]
    src[:, -1] = sp.eos
    src[1, 6], src[1, 7:] = sp.eos, sp.pad
    tgt = ordinary[torch.randint(len(ordinary), (3, 9), generator=gen)]
    tgt[:, 0] = sp.start
    was_training = model.training
    model.eval()
    ours = model(src, src.eq(sp.pad), tgt)
    model.train(was_training)
    theirs = hf(input_ids=src, attention_mask=src.ne(sp.pad).long(), decoder_input_ids=tgt).logits
    finite = torch.isfinite(ours)
    return (ours[finite] - theirs[finite]).abs().max().item()


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
        split_special_tokens=True,  # "<s>" or "</s>" typed in a text are its characters, as in translate.py
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
    imported = vocabs.family != "bpe"
    codes = run_languages(vocabs, config.get("data") or {}, source) if imported else {}
    target = vocabs.src.token_to_id(codes["tgt_lang"]) if "tgt_lang" in codes else None
    parent = hub_record(ckpt).get("config") if imported else None
    hf = hf_model(model, decode, imported, target, parent)
    diff = probe_difference(model, hf)
    if diff > PROBE_TOLERANCE:
        raise ConfigError(f"{source}: the transformers model's logits differ by {diff:.2g} from this model's "
                          f"on a probe batch (allowed {PROBE_TOLERANCE}); this transformers version computes "
                          "otherwise")  # fmt: skip
    architecture = type(hf).__name__
    require_transformers().utils.logging.disable_progress_bar()  # no bar for a one-file write
    with export_dir(out_dir, "transformers", Path(ckpt["path"])) as staging:
        hf.save_pretrained(staging)
        if imported:  # its own tokenizer files, as it came, framing the run's pair
            vocabs.save(staging)
            if codes:
                write_languages(staging, codes)
        else:
            hf_tokenizer(vocabs, model.cfg.max_positions).save_pretrained(staging)
        how = "weights as read" if imported else "weights permuted into its feature order"
        exported = (f"Exported with `python -m mt.export transformers` as `{architecture}` ({how}; largest logit "
                    f"difference on a probe batch {diff:.1e}).")  # fmt: skip
        card = model_card(ckpt, model, out_dir.resolve().name, library="transformers", use=use_lines(decode),
                          license=license, exported=exported)  # fmt: skip
        (staging / "README.md").write_text(card, encoding="utf-8")
        record = {"architecture": architecture, "source": str(ckpt["path"]), "probe_max_logit_difference": diff}
        (staging / "mt_export.json").write_text(json.dumps(record, indent=2) + "\n")
    return out_dir


@torch.no_grad()
def generate_ids(hf, sources: list[list[int]], decode: DecodeConfig, batch_size: int = 64,
                 framing: Framing = PAPER_FRAMING) -> list[list[int]]:  # fmt: skip
    """Translate source ids (without </s>) with transformers' `generate` under this project's per-line length limit
    (`max_len_a` x source tokens, </s> included, + `max_len_b`): lines are grouped by their limit, which becomes
    `max_length` (`max_new_tokens` plus the decoder's first token). `framing`: the model's special ids and language
    tokens (NLLB's target language forced first, with </s> forced at the limit as here). Returns the output ids
    without the decoder's first token, the target-language token and </s>, in the order of `sources`."""
    sp, src_lead, tgt_lead = framing.specials, list(framing.src_lead), list(framing.tgt_lead)
    positions = hf.config.max_position_embeddings
    cap = min(positions - 1, decode.max_len or positions)  # as `output_cap`
    lengths = [len(src_lead) + len(s) + 1 for s in sources]
    limit = [max(1, min(cap, int(n * decode.max_len_a + decode.max_len_b))) for n in lengths]
    forced = {"forced_bos_token_id": tgt_lead[0], "forced_eos_token_id": sp.eos} if tgt_lead else {}
    out: list[list[int]] = [[] for _ in sources]
    for n in sorted(set(limit)):
        rows = [i for i in range(len(sources)) if limit[i] == n]
        for start in range(0, len(rows), batch_size):
            part = rows[start : start + batch_size]
            ids = torch.full((len(part), max(lengths[i] for i in part)), sp.pad)
            for j, i in enumerate(part):
                ids[j, : lengths[i]] = torch.tensor(src_lead + sources[i] + [sp.eos])
            # max_length counts the decoder's first token: n new tokens, the last one forced to </s> as here
            gen = hf.generate(input_ids=ids, attention_mask=ids.ne(sp.pad).long(), max_length=n + 1,
                              num_beams=decode.beam_size, do_sample=False, **forced)  # fmt: skip
            for j, i in enumerate(part):
                row = gen[j, 1 + len(tgt_lead) :].tolist()
                out[i] = row[: row.index(sp.eos)] if sp.eos in row else [t for t in row if t != sp.pad]
    return out
