"""Starting a run from a trained model (`train.init_from`): fine-tuning on new data, as fairseq's
--finetune-from-model, Eole's train_from + reset_optim, JoeyNMT's load_model do.

The new run takes the parent's weights (those it translates with: its final, averaged or EMA model), its tokenizer
(the new data is segmented by the parent's BPE) and its architecture; everything else starts fresh: optimizer
moments (unless `train.init_optimizer`), schedule and warmup, update and epoch counters, data order, the best
score and patience, and the weight average (seeded from the starting weights). It applies when a run starts; the
same command later resumes the fine-tuning run like any run. `train.freeze` keeps named parts as they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from mt import errors, runtime
from mt.config import Config, ConfigError, DataConfig, DecodeConfig, TrainConfig
from mt.data import read
from mt.data.hub_vocab import same_language
from mt.data.tokenizer import Vocabs
from mt.errors import TokenizerError
from mt.model import hub, saved
from mt.model.transformer import Transformer
from mt.train.ema import WeightEMA
from mt.train.records import PARENT_FILE, read_parent, test_scores
from mt.train.schedules import noam_lr

log = logging.getLogger(__name__)

SHAPE_KEYS = ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers", "norm", "tie_embeddings",
              "positions", "max_positions", "activation", "scale_embedding", "sinusoids", "position_offset",
              "output_bias", "mask_pad_logit", "pad_id", "unk_id", "decoder_start_id", "eos_id")  # fmt: skip
PARTS = ("embeddings", "encoder", "decoder")  # what train.freeze may name
UNK_WARNING = 0.005  # share of <unk> tokens in the new data above which the log names the characters
# A transformers parent (OPUS-MT, NLLB) ends its training at a small rate; a from-scratch rate (the finetune preset's
# 4e-3, noam's peak) moves its weights far from it. Its rate, as transformers' translation examples fine-tune d 512 to
# 1,024 (2e-5 to 5e-5): 5e-5 x sqrt(512 / d_model), at most 1e-3 (also +experiment=auto's, mt/train/auto_finetune.py).
PRETRAINED_LR, PRETRAINED_WIDTH, MAX_PRETRAINED_LR = 5e-5, 512, 1e-3
PRETRAINED_WARMUP = 100  # the warm-up that replaces noam's 4,000 updates under such a rate


def pretrained_lr(d_model: int) -> float:
    """The fine-tuning rate of a transformers parent of width `d_model`."""
    return min(PRETRAINED_LR * math.sqrt(PRETRAINED_WIDTH / d_model), MAX_PRETRAINED_LR)


@dataclass
class Parent:
    """The model a run starts from: its checkpoint dict, model (weights loaded) and tokenizers."""

    ckpt: dict
    model: Transformer
    vocabs: Vocabs

    @property
    def digest(self) -> str:
        """A content digest of the weights (sha256 of the tensors in name order), to name them in records."""
        h = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().float().cpu().numpy().tobytes())
        return h.hexdigest()[:16]


def load_parent(cfg: Config, run_dir: Path) -> Parent:
    """`train.init_from` loaded and checked against the run: not the run itself, not with `train.resume=PATH`."""
    source = Path(cfg.train.init_from)
    if cfg.train.resume not in ("auto", "never"):
        raise ConfigError(f"train.init_from={source} and train.resume={cfg.train.resume}: one run starts from one "
                          "model; give one of them")  # fmt: skip
    if hub.looks_like_hub_id(cfg.train.init_from):  # a transformers model on the Hugging Face Hub
        if cfg.train.init_optimizer:
            raise ConfigError(f"train.init_optimizer: {cfg.train.init_from} is a transformers checkpoint, which holds "
                              "no optimizer state; set train.init_optimizer=false")  # fmt: skip
        try:
            ckpt = saved.load(cfg.train.init_from)
            return Parent(ckpt, *saved.build_model(ckpt))
        except errors.CheckpointError as e:
            raise ConfigError(f"train.init_from: {e}") from None
    if not source.exists():
        raise ConfigError(f"train.init_from={source}: no such file or directory; give a run dir, a .pt, a release, "
                          "a transformers checkpoint dir or a Hub id (Helsinki-NLP/opus-mt-de-en)")  # fmt: skip
    where = source.resolve() if source.is_dir() else source.resolve().parent
    if where == run_dir.resolve():
        raise ConfigError(f"train.init_from={source} is this run's own dir; give the parent's run dir and a new "
                          "run_dir for the fine-tuning run")  # fmt: skip
    if cfg.train.init_optimizer and source.is_dir() and (source / "checkpoint_last.pt").is_file():
        # The moments belong to the run's last weights, not to its averaged or best ones: start from the pair.
        source = source / "checkpoint_last.pt"
        log.info("train.init_optimizer: starting from %s, the weights its optimizer state belongs to", source)
    try:
        ckpt = saved.load(source)
        if cfg.train.init_optimizer and ckpt["format"] == hub.HUB_FORMAT:
            raise ConfigError(f"train.init_optimizer: {source} is a transformers checkpoint, which holds no "
                              "optimizer state; set train.init_optimizer=false")  # fmt: skip
        if cfg.train.init_optimizer and "raw_model" in ckpt:
            # Under a weight average (train.ema_decay) "model" is the average; the moments belong to the trained
            # weights, kept as "raw_model".
            ckpt = {**ckpt, "model": ckpt["raw_model"]}
            log.info("train.init_optimizer: the parent's trained weights, not its weight average")
        model, vocabs = saved.build_model(ckpt)
    except errors.CheckpointError as e:
        raise ConfigError(f"train.init_from: {e}") from None
    return Parent(ckpt, model, vocabs)


def check_direction(cfg: Config, parent: Parent) -> None:
    """A transformers parent that names its pair (Marian's source_lang / target_lang, NLLB's src_lang / tgt_lang)
    fine-tunes in that direction only; a multilingual one (language tokens) in any pair it has tokens for."""
    data, source = cfg.data, cfg.train.init_from
    if parent.ckpt["format"] != hub.HUB_FORMAT or data.directions:
        return
    if getattr(parent.vocabs, "languages", None):
        try:
            parent.vocabs.framing(data.src_lang, data.tgt_lang)
        except TokenizerError as e:
            raise ConfigError(f"train.init_from={source}: {e} (data.src_lang / data.tgt_lang)") from None
        return
    theirs = (parent.ckpt.get("config") or {}).get("data") or {}
    src, tgt = theirs.get("src_lang"), theirs.get("tgt_lang")
    if src and tgt and not (same_language(src, data.src_lang) and same_language(tgt, data.tgt_lang)):
        raise ConfigError(f"data.src_lang={data.src_lang} data.tgt_lang={data.tgt_lang}: the parent "
                          f"(train.init_from={source}) translates {src}->{tgt} (its tokenizer_config.json); "
                          f"fine-tune it in that direction, or start from a {data.src_lang}->{data.tgt_lang} "
                          "model")  # fmt: skip


def adopt(cfg: Config, parent: Parent, overrides: list[str]) -> Config:
    """`cfg` with the parent's architecture and tokenizer. A command-line override that changes a shape, or a
    tokenizer.path that is not the parent's, is a one-line error; other tokenizer settings are ignored with a
    warning; dropout keys keep the command line's values, else the parent's."""
    check_direction(cfg, parent)
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    theirs = parent.model.cfg
    model = dataclasses.replace(cfg.model)
    for key in SHAPE_KEYS:
        mine, parents = getattr(cfg.model, key), getattr(theirs, key)
        if mine != parents and (f"model.{key}" in given or "model" in given):
            raise ConfigError(f"model.{key}={mine}: the parent (train.init_from) has model.{key}={parents}; a "
                              "fine-tuning run keeps the parent's shapes (drop the override)")  # fmt: skip
        setattr(model, key, parents)
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        if f"model.{key}" not in given:
            setattr(model, key, getattr(theirs, key))
    model.name = theirs.name
    prepared = parent.vocabs.pretokenize or {}  # the parent's text preparation, too
    tokenizer = dataclasses.replace(cfg.tokenizer, joint=parent.vocabs.joint, path=None,
                                    pretokenize=prepared.get("kind", "none"),
                                    case_markup=prepared.get("case_markup", False))  # fmt: skip
    if cfg.tokenizer.path:
        from mt.data.tokenizer import Vocab

        mine = Vocab.from_file(cfg.tokenizer.path)
        theirs = (parent.vocabs.src.digest(pretokenization=False), parent.vocabs.tgt.digest(pretokenization=False))
        if mine.digest() not in theirs:  # (the file holds the BPE; the parent's Moses setting comes with it above)
            raise ConfigError(
                f"tokenizer.path={cfg.tokenizer.path}: not the tokenizer of the parent "
                "(train.init_from), whose vocabulary the model's embeddings index; drop tokenizer.path"
            )
    ignored = sorted(k for k in given if k.startswith("tokenizer.") and k != "tokenizer.path")
    if ignored:
        log.warning("%s: ignored; a fine-tuning run segments its data with the parent's tokenizer", ", ".join(ignored))
    train = cfg.train if cfg.auto.enabled else learning_rate(cfg.train, parent, given)  # (auto planned its own)
    return dataclasses.replace(cfg, model=model, tokenizer=tokenizer, train=train,
                               decode=parent_decoding(cfg, parent, given))  # fmt: skip


def learning_rate(tc: TrainConfig, parent: Parent, given: set[str]) -> TrainConfig:
    """The rate a fine-tuning run trains at, said in the log with its reason. A transformers parent gets its
    fine-tuning rate (`pretrained_lr`; under noam, a constant one after a short warm-up) unless the command line gives
    train.lr; noam's rate, which does not read train.lr, is named as the from-scratch rate it is."""
    d_model = parent.model.cfg.d_model
    if parent.ckpt["format"] == hub.HUB_FORMAT and not given & {"train.lr", "train"}:
        noam = tc.schedule == "noam"
        schedule = "constant" if noam and "train.schedule" not in given else tc.schedule
        warmup = min(tc.warmup, PRETRAINED_WARMUP) if noam and "train.warmup" not in given else tc.warmup
        tc = dataclasses.replace(tc, lr=pretrained_lr(d_model), schedule=schedule, warmup=warmup)
        if schedule != "noam":
            log.info("train.lr=%.3g (%s schedule, %d warm-up updates): a fine-tuning rate for a transformers parent of "
                     "d_model %d, 5e-5 x sqrt(512 / d_model) as transformers' translation examples use; train.lr= sets "
                     "another", tc.lr, schedule, warmup, d_model)  # fmt: skip
            return tc
    if tc.schedule == "noam":
        peak = noam_lr(tc.warmup, d_model, tc.warmup, tc.noam_scale)
        unused = f"train.lr={tc.lr:g} is not used: " if "train.lr" in given else ""
        log.warning("%sfine-tuning at the noam schedule's rate, a from-scratch one (peak %.2g at update %d, from "
                    "d_model %d); train.schedule=constant train.lr=... (or +experiment=finetune) fine-tunes at a rate "
                    "of your own", unused, peak, tc.warmup, d_model)  # fmt: skip
    else:
        log.info("fine-tuning at train.lr=%g (%s schedule, %d warm-up updates)", tc.lr, tc.schedule, tc.warmup)
    return tc


def parent_decoding(cfg: Config, parent: Parent, given: set[str]) -> DecodeConfig:
    """A transformers parent's decoding (its generation config: beam, length penalty, stopping rule), which the run
    validates, tests and exports with, under the command line's decode.* keys; another parent leaves the run's."""
    theirs = (parent.ckpt.get("config") or {}).get("decode")
    if parent.ckpt["format"] != hub.HUB_FORMAT or not theirs or "decode" in given:
        return cfg.decode
    mine = {k.removeprefix("decode.") for k in given if k.startswith("decode.")}
    fields = {f.name for f in dataclasses.fields(DecodeConfig)}
    merged = {**dataclasses.asdict(cfg.decode), **{k: v for k, v in theirs.items() if k in fields and k not in mine}}
    log.info("decoding as the parent's generation config: beam %d, length penalty %s %g", merged["beam_size"],
             merged["length_penalty_type"], merged["length_penalty"])  # fmt: skip
    return DecodeConfig(**merged)


def freeze(model: Transformer, parts: list[str]) -> None:
    """No gradients (hence no optimizer state or updates) for the named parts: `embeddings` (token and position
    embeddings, and the output projection tied to them), `encoder`, `decoder` (their layers and final norms)."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ConfigError(f"train.freeze: {unknown[0]!r} is not a part of the model; give any of {', '.join(PARTS)}")
    prefixes = {"embeddings": ("src_embed.", "tgt_embed.", "output."), "encoder": ("encoder.", "encoder_norm."),
                "decoder": ("decoder.", "decoder_norm.")}  # fmt: skip
    frozen = tuple(prefix for part in parts for prefix in prefixes[part])
    for name, p in model.named_parameters():  # a tied matrix is listed once, under its first name
        if name.startswith(frozen):
            p.requires_grad_(False)
    if parts and not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"train.freeze={list(parts)} leaves nothing to train; freeze fewer parts")
    if parts:
        n = sum(p.numel() for p in model.parameters() if not p.requires_grad)
        log.info("frozen: %s (%d parameters)", ", ".join(parts), n)


def start(trainer, parent: Parent) -> None:
    """Put the parent's weights (and with `train.init_optimizer` its optimizer moments) into a new run, seed the
    weight average from them, record the parent, and say what its tokenizer makes of the new data."""
    trainer.model.load_state_dict(parent.model.state_dict())
    if trainer.tc.ema_decay:
        trainer.ema = WeightEMA(trainer.model, trainer.tc.ema_decay)
    if trainer.tc.init_optimizer:
        if "optimizer" not in parent.ckpt:
            raise ConfigError(f"train.init_optimizer: {parent.ckpt['path']} holds no optimizer state (weights "
                              "only); give a run's checkpoint_last.pt, or train.init_optimizer=false")  # fmt: skip
        # Only the per-parameter moments come over: this run's lr (its schedule's first step), betas, eps and
        # weight decay stay, which load_state_dict would replace with the parent's.
        settings = [{k: v for k, v in group.items() if k != "params"} for group in trainer.optimizer.param_groups]
        trainer.optimizer.load_state_dict(parent.ckpt["optimizer"])
        for group, own in zip(trainer.optimizer.param_groups, settings):
            group.update(own)
        for p in trainer.model.parameters():
            if not p.requires_grad:  # frozen: no state, whatever the parent had
                trainer.optimizer.state.pop(p, None)
        runtime.use_optimizer_kernel(trainer.optimizer, trainer.device)  # the parent's device may differ
    record = {"path": str(parent.ckpt["path"]), "weights_digest": parent.digest,
              "test_scores": test_scores(parent.ckpt), "data": (parent.ckpt.get("config") or {}).get("data", {}),
              "optimizer": bool(trainer.tc.init_optimizer)}  # fmt: skip
    if hub_files := (parent.ckpt.get("config") or {}).get("hub"):  # a transformers parent: what the export back needs
        record["hub"] = hub_files
    if trainer.rank == 0:
        (trainer.run_dir / PARENT_FILE).write_text(json.dumps(record, indent=2) + "\n")
        trainer.metrics.write({"kind": "parent", **{k: record[k] for k in ("path", "weights_digest", "optimizer")}})
    log.info("starting from %s (weights %s)%s", record["path"], record["weights_digest"],
             ", with its optimizer state" if trainer.tc.init_optimizer else "")  # fmt: skip
    if trainer.rank == 0:
        report_tokenization(parent, trainer.corpus.train_text)


def tokenization(vocabs: Vocabs, pairs, n: int = 2000) -> dict:
    """Share of <unk> tokens, subwords per word, and the characters that became <unk>, over the first `n` pairs."""
    sample = [p for _, p in zip(range(n), pairs)]
    texts = {"source": [s for s, _ in sample], "target": [t for _, t in sample]}
    out, unknown = {}, Counter()
    for side, lines in texts.items():
        vocab = vocabs.src if side == "source" else vocabs.tgt
        ids = vocab.encode_batch(lines)
        tokens, words = sum(map(len, ids)), sum(len(line.split()) for line in lines)
        unk = sum(i.count(vocab.specials.unk) for i in ids)
        out[side] = {"unk_share": unk / max(tokens, 1), "subwords_per_word": tokens / max(words, 1)}
        if unk:  # what became <unk> (a lone character is encoded as "▁" + it)
            for line in lines:
                unknown.update(vocab.unknown_spans(line))
    out["unknown_characters"] = "".join(c for c, _ in unknown.most_common(20))
    return out


def report_tokenization(parent: Parent, new_pairs) -> None:
    """Log what the parent's tokenizer does to the new data beside what it does to its own training data."""
    new = tokenization(parent.vocabs, new_pairs)
    own = None
    parent_data = (parent.ckpt.get("config") or {}).get("data")
    if parent_data and (parent_data.get("dir") or parent_data.get("hub_name")):  # (a transformers parent has none)
        try:
            fields = {k: v for k, v in parent_data.items() if k in DataConfig.__dataclass_fields__}
            dc = DataConfig(**{**fields, "corpora": [], "directions": []})
            if read.uses_hub(dc):  # 2,000 pairs are not worth loading (maybe downloading) a hub dataset's split
                raise read.DataError(f"a hub dataset, {dc.hub_name}, not read for a comparison")
            own = tokenization(parent.vocabs, read.TextPairs.of_split(dc, dc.train_split))
        except (read.DataError, TypeError, OSError) as e:
            log.info("the parent's training data is not readable here (%s); no comparison", str(e)[:120])
    for side in ("source", "target"):
        s = new[side]
        line = f"{side}: {100 * s['unk_share']:.2f}% <unk>, {s['subwords_per_word']:.2f} subwords/word"
        if own is not None:
            o = own[side]
            line += f" (parent's data: {100 * o['unk_share']:.2f}%, {o['subwords_per_word']:.2f})"
        log.info("the parent's tokenizer on the new data, %s", line)
    if max(new["source"]["unk_share"], new["target"]["unk_share"]) > UNK_WARNING:
        log.warning("the parent's tokenizer makes over %.1f%% of the new data's tokens <unk>; characters it does not "
                    "know: %s", 100 * UNK_WARNING, new["unknown_characters"])  # fmt: skip


def parent_test_splits(run_dir: Path) -> list[tuple[DataConfig, str]]:
    """The parent's own test splits (its data config), to report beside the new data's (forgetting)."""
    record = read_parent(run_dir)
    dc = (record or {}).get("data") or {}
    if not dc or dc.get("directions"):
        return []
    fields = {k: v for k, v in dc.items() if k in DataConfig.__dataclass_fields__}
    config = DataConfig(**{**fields, "corpora": [], "directions": []})
    return [(config, split) for split in config.test_splits]
