"""`+experiment=auto train.init_from=...`: a fine-tuning run planned for the budget. The parent fixes the
architecture, the tokenizer and its dropout; the rule (`choose`, a pure function) sets what fine-tuning has to
decide, from the parent's width, the corpus (pairs and tokens, read with the parent's tokenizer) and the speed of
the parent's own updates on this machine (mt/train/probe.py, cached):

| key                     | rule                                              | why                                 |
|---|---|---|
| train.max_tokens        | the budget's tokens / 300, 1,024-4,096            | at least ~300 updates in the budget |
| train.lr                | 5e-5 x sqrt(512 / d_model), at most 1e-3          | transformers' translation examples  |
|                         |                                                   | fine-tune d 512-1,024 at 2e-5-5e-5  |
| train.schedule, warmup  | linear to 0 at the budget's end, warmup 6%        | the examples' (Seq2SeqTrainer's)    |
| train.label_smoothing   | 0.1                                               | OPUS-MT's and NLLB's training       |
| valid_every, patience   | ~8 validations, stop after 3 without a gain       | early stopping on small corpora     |
| train.valid_bleu_subset | 300 sentences                                     | a validation stays a small share    |

Each choice is logged with its reason and kept in the run dir (auto.json), as `+experiment=auto` does for a run
from nothing (mt/train/auto_setup.py); the command line's keys win.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from mt.config import Config, ModelConfig
from mt.data import read
from mt.model import saved
from mt.runtime import pick_device
from mt.train import probe
from mt.train.auto import NOTE, PLAN, Budget, Choice
from mt.train.auto_record import AUTO_FILE, block, set_key, write_record

log = logging.getLogger(__name__)

MIN_UPDATES = 300  # the budget's tokens are cut into batches so that it holds this many updates
BATCH_RANGE = (1_024, 4_096)  # train.max_tokens: padded tokens an update
BASE_LR, BASE_WIDTH, MAX_LR = 5e-5, 512, 1e-3
WARMUP_SHARE, WARMUP_RANGE = 0.06, (10, 1_000)
VALIDATIONS, PATIENCE, BLEU_SUBSET = 8, 3, 300


@dataclass(frozen=True)
class FineTuneStats:
    """What the rule reads: training pairs (held-out ones left out), their mean padded tokens a pair in the parent's
    tokenizer (source and target averaged, with </s>), the parent's width and the speed of its updates."""

    pairs: int
    tokens_per_pair: float
    d_model: int
    tokens_per_second: float


def choose(stats: FineTuneStats, budget: Budget) -> list[Choice]:
    """The fine-tuning recipe for `stats` in `budget` (see the module's table)."""
    seconds = budget.minutes * 60 - budget.spent if budget.minutes else 0.0
    if seconds > 0:
        tokens = stats.tokens_per_second * seconds
        batch = int(min(max(tokens / MIN_UPDATES, BATCH_RANGE[0]), BATCH_RANGE[1]) // 256 * 256)
        updates = max(1, int(tokens / batch))
        how = f"{budget.minutes:g} min at {stats.tokens_per_second:,.0f} tokens/s"
    else:
        batch, updates, how = BATCH_RANGE[1], budget.updates, "train.max_updates"
    epochs = updates * batch / max(stats.pairs * stats.tokens_per_pair, 1)
    lr = min(BASE_LR * math.sqrt(BASE_WIDTH / stats.d_model), MAX_LR)
    warmup = int(min(max(WARMUP_SHARE * updates, WARMUP_RANGE[0]), WARMUP_RANGE[1]))
    every = max(10, updates // VALIDATIONS)
    plan = {"updates": updates, "epochs": round(epochs, 1)}
    out = [
        Choice(
            PLAN,
            plan,
            f"~{updates:,} updates of {batch:,} tokens ({how}), ~{epochs:.1f} epochs of {stats.pairs:,} pairs",
        ),  # fmt: skip
        Choice(
            "train.max_tokens",
            batch,
            f"at least ~{MIN_UPDATES} updates in the budget, {BATCH_RANGE[0]:,}-{BATCH_RANGE[1]:,} tokens an update",
        ),  # fmt: skip
        Choice(
            "train.lr",
            float(f"{lr:.3g}"),
            f"a fine-tuning rate: 5e-5 x sqrt(512 / d_model {stats.d_model}) "
            "(transformers' translation examples: 2e-5-5e-5 at d 512-1,024)",
        ),  # fmt: skip
        Choice("train.schedule", "linear", "decays to 0 at the budget's end (Seq2SeqTrainer's schedule)"),
        Choice(
            "train.warmup",
            warmup,
            f"{WARMUP_SHARE:.0%} of the updates (the parent's weights are trained: a short warmup)",
        ),  # fmt: skip
        Choice("train.label_smoothing", 0.1, "OPUS-MT's and NLLB's training value"),
        Choice("train.valid_every", every, f"~{VALIDATIONS} validations in the budget"),
        Choice("train.patience", PATIENCE, f"early stopping: {PATIENCE} validations without a better val BLEU"),
        Choice(
            "train.valid_bleu_subset",
            BLEU_SUBSET,
            f"val BLEU on {BLEU_SUBSET} sentences: a validation stays a small share of the budget",
        ),  # fmt: skip
        Choice("train.max_epochs", 1_000, "the budget, not an epoch count, ends the run"),
        Choice("train.average_last", 0, "one short schedule decayed to 0: its last weights, no average"),
    ]
    if epochs > 50:
        out.append(Choice(NOTE, None, f"~{epochs:.0f} epochs of a small corpus: early stopping (train.patience) "
                                      "guards against over-fitting it"))  # fmt: skip
    if updates < 100:
        out.append(Choice(NOTE, None, f"WARNING: ~{updates} updates: too short a budget to adapt the parent much; "
                                      "raise train.max_time"))  # fmt: skip
    return out


def parent_stats(cfg: Config) -> tuple[ModelConfig, FineTuneStats]:
    """The parent's model config and what the rule reads (pairs, tokens a pair in its tokenizer, its update speed
    on this machine: probed and cached, or estimated from TABLE's base shape with `auto.probe=false`)."""
    ckpt = saved.load(cfg.train.init_from)
    model, vocabs = saved.build_model(ckpt)
    pairs = list(read.TextPairs.of_split(cfg.data, cfg.data.train_split))
    sample = pairs[:: max(1, len(pairs) // 2000)]
    src = vocabs.src.encode_batch([s for s, _ in sample])
    tgt = vocabs.tgt.encode_batch([t for _, t in sample])
    tokens = (sum(map(len, src)) + sum(map(len, tgt))) / (2 * max(len(sample), 1)) + 1
    shape = {k: v for k, v in asdict(model.cfg).items() if k not in ("name", "attention_dropout", "activation_dropout")}
    point = (
        f"parent-{model.cfg.d_model}x{model.cfg.encoder_layers}+{model.cfg.decoder_layers}",
        model.tgt_vocab,
        False,
    )
    if cfg.auto.probe:
        rate = probe.throughput({point: shape}, pick_device(cfg.train.device), "fp32")[point]
    else:  # the base shape's table figure, scaled by the parameters an update trains
        base = probe.TABLE[("base", 32_000, False)]
        rate = base * 76e6 / sum(p.numel() for p in model.parameters())
    held = min(cfg.data.valid_from_train, len(pairs))
    return model.cfg, FineTuneStats(len(pairs) - held, tokens, model.cfg.d_model, rate)


def configure(cfg: Config, run_dir: Path, keys: set[str], groups: set[str], budget: Budget) -> Config:
    """`cfg` with the fine-tuning rule's choices applied except the command line's, the block of reasons logged and
    auto.json written (a resumed run reads it back: the recipe it started with)."""
    saved_record = run_dir / AUTO_FILE
    if saved_record.is_file():
        record = json.loads(saved_record.read_text())
        choices = [Choice(c["key"], c["value"], c["reason"]) for c in record["choices"]]
        source = f"{saved_record} (chosen when this run started)"
    else:
        _, stats = parent_stats(cfg)
        choices = choose(stats, budget)
        record = {"fine_tuning": asdict(stats), "budget": vars(budget), "parent": cfg.train.init_from}
        source = f"fine-tuning {cfg.train.init_from} on {stats.pairs:,} pairs"
    applied = [
        c for c in choices if c.key not in (NOTE, PLAN) and c.key not in keys and c.key.split(".")[0] not in groups
    ]
    for c in applied:
        set_key(cfg, c.key, c.value)
    for line in [f"auto: the recipe for {source}:", *block(choices, applied, cfg)]:
        (log.warning if "WARNING" in line else log.info)(line)
    record |= {"choices": [vars(c) for c in choices], "applied": [c.key for c in applied]}
    write_record(saved_record, record)
    return cfg
