"""Reading a transformers checkpoint (OPUS-MT's MarianMTModel, NLLB's M2M100ForConditionalGeneration) as a
checkpoint of this project: a local directory (config.json with model.safetensors or pytorch_model.bin, and the
tokenizer files) or a Hub id such as Helsinki-NLP/opus-mt-de-en, fetched by `huggingface_hub` into its cache
(HF_HOME, HF_HUB_OFFLINE=1 honoured). Weights load without unpickling code; fp16 weights are upcast.
The architecture and weight names: mt/model/hf_format.py; the tokenizers: mt/data/hub_vocab.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path

import torch

from mt.data import hub_offline
from mt.data.hub_vocab import read_hub_tokenizers
from mt.data.tokenizer import Specials
from mt.errors import CheckpointError, TokenizerError
from mt.model.hf_format import model_config, weight_table

log = logging.getLogger(__name__)

HUB_FORMAT = "transformers"  # a checkpoint dict read from a transformers checkpoint
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Generation settings this project's search has no counterpart for: named in a warning, not applied.
UNSUPPORTED_GENERATION = {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "num_beam_groups": 1,
                          "do_sample": False, "encoder_no_repeat_ngram_size": 0, "diversity_penalty": 0.0,
                          "exponential_decay_length_penalty": None}  # fmt: skip
# What transformers' generate() reads from config.json where there is no generation_config.json
# (GenerationConfig.from_model_config): the settings above and those this project applies.
CONFIG_GENERATION = ("num_beams", "max_length", "max_new_tokens", "min_length", "length_penalty", "early_stopping",
                     "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "renormalize_logits",
                     *UNSUPPORTED_GENERATION)  # fmt: skip


def is_transformers_dir(path: Path) -> bool:
    """A directory whose config.json names a transformers model_type (not a release of this project)."""
    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return False
    try:
        return "model_type" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


def looks_like_hub_id(source: str) -> bool:
    """`owner/name` that is not a path here: a Hub id."""
    return bool(HUB_ID.fullmatch(source)) and not Path(source).exists()


def listing(dir: Path, most: int = 6) -> str:
    names = sorted(p.name for p in dir.iterdir())
    return "holds " + ", ".join(names[:most]) + (", ..." if len(names) > most else "") if names else "empty"


def fetch(repo_id: str) -> Path:
    """The local snapshot of a Hub model (downloaded into huggingface_hub's cache unless it is there); offline
    without a cached copy, or a name the Hub does not know, is a one-line error."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    patterns = ["*.json", "*.spm", "*.model", "model.safetensors", "pytorch_model.bin"]
    owner = Path(repo_id.split("/")[0])
    # `runs/quickstart_en-de` is a local path whose run is not there, not a Hub id: say that, not "download it"
    if owner.is_dir():
        local = f"; {owner}/ is a local directory here ({listing(owner)}): if {repo_id} is yours, check the path"
    else:  # runs/: where train.py writes, so never a Hub owner's name here
        local = f"; {owner}/ does not exist here: train first, or check the path" if str(owner) == "runs" else ""
    offline = hub_offline.go_offline(f"reading {repo_id}")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=offline))
    except RepositoryNotFoundError:
        raise CheckpointError(f"{repo_id}: no such model on the Hugging Face Hub (or it is private: "
                              f"hf auth login){local}") from None  # fmt: skip
    except LocalEntryNotFoundError:
        if local:
            raise CheckpointError(f"{repo_id}: no such directory{local}") from None
        raise CheckpointError(f"{repo_id}: not in the Hugging Face cache and the Hub cannot be reached (offline, "
                              "or HF_HUB_OFFLINE=1); download it where there is network (hf download "
                              f"{repo_id} --local-dir DIR) and give that folder (checkpoint=DIR or "
                              "train.init_from=DIR)") from None  # fmt: skip
    except (HfHubHTTPError, OSError) as e:
        raise CheckpointError(f"{repo_id}: could not be fetched from the Hugging Face Hub ({type(e).__name__}); "
                              "give a local directory instead") from None  # fmt: skip


def read_weights(dir: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors in float32: model.safetensors, else pytorch_model.bin read with weights_only."""
    if (dir / "model.safetensors").is_file():
        from safetensors.torch import load_file

        try:
            state = load_file(str(dir / "model.safetensors"))
        except Exception as e:
            raise CheckpointError(f"{dir / 'model.safetensors'}: not readable ({type(e).__name__}); download it "
                                  "again") from None  # fmt: skip
    elif (dir / "pytorch_model.bin").is_file():
        try:
            state = torch.load(dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(f"{dir / 'pytorch_model.bin'}: not readable without running its code "
                                  f"({type(e).__name__}); download it again") from None  # fmt: skip
    else:
        raise CheckpointError(f"{dir}: config.json but no weights ({' or '.join(WEIGHT_FILES)}); copy them beside it")
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def our_state_dict(cfg, src_vocab: int, tgt_vocab: int, theirs: dict[str, torch.Tensor], where: str) -> dict:
    """This model's state dict filled from a transformers state dict by `weight_table`: fused projections are
    assembled from their blocks, tied matrices read once, a missing weight is a one-line error."""
    from mt.model.transformer import Transformer

    template = Transformer(cfg, src_vocab, tgt_vocab).state_dict()
    blocks: dict[str, dict[int | None, torch.Tensor]] = {}
    for w in weight_table(cfg):
        tensor = theirs.get(w.theirs)
        if tensor is None and w.theirs.endswith("embed_tokens.weight"):
            tensor = theirs.get("model.shared.weight")  # saved once under the shared name
        if tensor is None and w.theirs == "lm_head.weight" and cfg.tie_embeddings in ("all", "decoder"):
            continue  # tied to the decoder's embeddings, often not saved
        if tensor is None:
            if w.theirs == "model.shared.weight":
                continue
            raise CheckpointError(f"{where}: the weight {w.theirs} is missing; the checkpoint is incomplete")
        blocks.setdefault(w.ours, {})[w.block] = tensor.reshape(-1) if w.ours == "output_bias" else tensor
    out = {}
    for name, like in template.items():
        parts = blocks.get(name)
        if parts is None:
            out[name] = like  # a tied copy filled under its other name below
            continue
        value = parts[None] if None in parts else torch.cat([parts[i] for i in sorted(parts)])
        if value.shape != like.shape:
            raise CheckpointError(f"{where}: {name} has shape {tuple(value.shape)} where config.json implies "
                                  f"{tuple(like.shape)}; the checkpoint and its config disagree")  # fmt: skip
        out[name] = value
    if cfg.tie_embeddings in ("all", "decoder"):
        out["output.weight"] = out["tgt_embed.tokens.weight"]
    if cfg.tie_embeddings in ("all", "inputs"):
        out["src_embed.tokens.weight"] = out["tgt_embed.tokens.weight"]
    return out


def decode_settings(generation: dict, specials: Specials, where: str) -> dict:
    """The checkpoint's generation_config.json as this project's decode.* settings (its beam, length penalty,
    early stopping and length limit); settings with no counterpart here are named in a warning."""
    out = {"beam_size": int(generation.get("num_beams", 1)),
           "length_penalty": float(generation.get("length_penalty", 1.0)), "length_penalty_type": "average",
           "early_stopping": generation.get("early_stopping", False) is True,
           "renormalize": bool(generation.get("renormalize_logits", False)), "score_forced": False}  # fmt: skip
    if generation.get("max_new_tokens"):  # (transformers: it wins over max_length)
        out["max_len"] = int(generation["max_new_tokens"])
    elif generation.get("max_length"):
        out["max_len"] = int(generation["max_length"]) - 1  # theirs counts the decoder's first token
    if generation.get("min_length"):
        out["min_len"] = max(0, int(generation["min_length"]) - 1)
    ignored = [k for k, off in UNSUPPORTED_GENERATION.items() if generation.get(k, off) != off]
    if generation.get("early_stopping") == "never" and out["beam_size"] > 1:
        ignored.append("early_stopping='never' (decoded as false: transformers' default rule)")
    bad_words = [w for w in generation.get("bad_words_ids") or [] if w != [specials.pad]]
    ignored += ["bad_words_ids"] if bad_words else []
    if ignored:
        log.warning(
            "%s: generation_config.json sets %s, which this project's search does not apply", where, ", ".join(ignored)
        )
    return out


def card_license(dir: Path) -> str | None:
    """The licence the checkpoint's model card (README.md's front matter) names, as its page shows it."""
    try:
        text = (dir / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("---"):
        return None
    match = re.search(r"^license:\s*['\"]?([\w.+-]+)", text.split("\n---", 1)[0], re.MULTILINE)
    return match.group(1) if match else None


def languages(vocabs, generation: dict, where: str) -> dict:
    """The checkpoint's own pair, as the run's data.src_lang / tgt_lang: Marian's source_lang / target_lang, NLLB's
    src_lang / tgt_lang (tokenizer_config.json), else the target language whose token generation_config.json forces
    first (forced_bos_token_id). NLLB's legacy_behaviour (the language code after the source) is refused."""
    config = json.loads(vocabs.files_.get("tokenizer_config.json", "{}"))
    if config.get("legacy_behaviour"):
        raise CheckpointError(f"{where}: tokenizer_config.json sets legacy_behaviour: true (NLLB's old framing, the "
                              "language code after the source), which this project does not read; set it to false "
                              "(the framing NLLB-200 was released with) or remove it")  # fmt: skip
    out = {k: config.get(k) or config.get(f) for k, f in (("src_lang", "source_lang"), ("tgt_lang", "target_lang"))}
    forced = generation.get("forced_bos_token_id")
    if forced is not None:  # what generate() starts every output with: it wins over the tokenizer's tgt_lang
        code = next((c for c, i in vocabs.languages.items() if i == forced), None)
        if code is None or vocabs.family != "tokenizers":
            log.warning("%s: generation_config.json forces token %s first, which is no target-language token of "
                        "this model; not applied", where, forced)  # fmt: skip
        else:
            out["tgt_lang"] = code
    return {k: v for k, v in out.items() if v}


def load_transformers(source: str | Path) -> dict:
    """A transformers checkpoint (a directory or a Hub id) as a checkpoint dict of this project: its weights under
    this model's names, its model config, tokenizers and decoding settings, and its own files' values under
    "hub" (what the export back writes)."""
    dir = Path(source) if Path(source).is_dir() else fetch(str(source))
    where = str(source)
    if not (dir / "config.json").is_file():
        raise CheckpointError(f"{where}: no config.json; a transformers checkpoint is a directory with config.json, "
                              "the weights and the tokenizer files")  # fmt: skip
    try:
        config = json.loads((dir / "config.json").read_text())
        gen_path = dir / "generation_config.json"
        generation = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    except ValueError as e:
        raise CheckpointError(f"{where}: config.json or generation_config.json is not JSON ({e})") from None
    if not gen_path.is_file():  # transformers then reads the generation keys of config.json
        generation = {k: config[k] for k in CONFIG_GENERATION if config.get(k) is not None}
    for key in ("eos_token_id", "decoder_start_token_id", "pad_token_id"):
        if isinstance(config.get(key), list):
            config[key] = config[key][0]
        if key in generation and key != "pad_token_id" and not isinstance(generation[key], list):
            config[key] = generation[key]  # generation_config.json wins, as in transformers' generate()
    cfg, src_vocab, tgt_vocab = model_config(config, where)
    try:
        probe = Specials(cfg.pad_id, 0, cfg.decoder_start_id, cfg.eos_id)
        vocabs = read_hub_tokenizers(dir, probe, where)
    except TokenizerError as e:
        raise CheckpointError(str(e)) from None
    unk = vocabs.src.token_to_id("<unk>")
    cfg = dataclasses.replace(cfg, unk_id=unk if unk is not None else cfg.pad_id)
    specials = Specials.of(cfg)
    vocabs = type(vocabs).from_json({**vocabs.to_json(), "specials": list(dataclasses.astuple(specials))})
    if len(vocabs.src) > src_vocab or len(vocabs.tgt) > tgt_vocab:
        raise CheckpointError(f"{where}: the tokenizer has {len(vocabs.src)} types but the model {src_vocab}; "
                              "the tokenizer files belong to another model")  # fmt: skip
    state = our_state_dict(cfg, src_vocab, tgt_vocab, read_weights(dir), where)
    run = {"decode": decode_settings(generation, specials, where), "data": languages(vocabs, generation, where),
           "hub": {"source": where, "config": config, "generation_config": generation,
                   "license": card_license(dir)}}  # fmt: skip
    model_args = {"model": dataclasses.asdict(cfg), "src_vocab": src_vocab, "tgt_vocab": tgt_vocab}
    return {"format": HUB_FORMAT, "path": where, "model": state, "model_args": model_args, "config": run,
            "tokenizer": vocabs.to_json()}  # fmt: skip
