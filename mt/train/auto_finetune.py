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
| valid_every, patience   | 2-8 validations, at most 15% of the budget;       | early stopping on small corpora     |
|                         | stop after 3 without a gain                       |                                     |
| train.valid_bleu_subset | 200 sentences, the parent's beam                  | a validation stays a small share    |
| train.precision         | auto (bf16 where native; the probe times in it)   | 1.9x fp32 on a Zen 4                |

Each choice is logged with its reason and kept in the run dir (auto.json), as `+experiment=auto` does for a run
from nothing (mt/train/auto_setup.py); the command line's keys win.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from mt.config import Config, ModelConfig
from mt.data import read
from mt.model import saved
from mt.runtime import pick_autocast, pick_device
from mt.train import auto_ranks, finetune, probe
from mt.train.auto import NOTE, PLAN, Budget, Choice
from mt.train.auto_record import AUTO_FILE, block, end_sentences, set_key, write_record

log = logging.getLogger(__name__)

MIN_UPDATES = 300  # the budget's tokens are cut into batches so that it holds this many updates
BATCH_RANGE = (1_024, 4_096)  # train.max_tokens: padded tokens an update
WARMUP_SHARE, WARMUP_RANGE = 0.06, (10, 1_000)
PATIENCE, BLEU_SUBSET = 3, 200
# Validations share at most this much of the budget (their loss over the held-out pairs, their BLEU's beam search
# over BLEU_SUBSET sentences), between MIN_VALIDATIONS and MAX_VALIDATIONS of them. A validation's cost, from the
# training speed: a forward pass is about a third of a training update's work per token (no backward, no Adam),
# and the search computes beam_size rows per output token.
VALIDATION_SHARE, MIN_VALIDATIONS, MAX_VALIDATIONS = 0.15, 2, 8
FORWARD_SHARE = 1 / 3


@dataclass(frozen=True)
class FineTuneStats:
    """What the rule reads: training pairs (held-out ones left out), their mean padded tokens a pair in the parent's
    tokenizer (source and target averaged, with </s>), the parent's width and the speed of its updates."""

    pairs: int
    tokens_per_pair: float
    d_model: int
    tokens_per_second: float
    valid_pairs: int = 500  # the held-out pairs a validation's loss reads
    beam: int = 4  # the parent's beam (its generation config): the validations' search
    precision: str = "fp32"  # what the probe timed (train.precision=auto's choice on this machine)
    end_sentences: int = 0  # decoded after the budget: the final choice's val passes, the test splits, the parent's


def end_seconds(stats: FineTuneStats) -> float:
    """What the run's end costs after the budget at this speed: `end_sentences` beam-searched."""
    forward = stats.tokens_per_second / FORWARD_SHARE
    return stats.end_sentences * stats.tokens_per_pair * (1 + stats.beam) / forward


def validation_seconds(stats: FineTuneStats) -> float:
    """What one validation costs at this speed: the loss's forward passes and the BLEU subset's search."""
    forward = stats.tokens_per_second / FORWARD_SHARE  # tokens a second of forward passes alone
    loss = stats.valid_pairs * 2 * stats.tokens_per_pair / forward
    search = BLEU_SUBSET * (stats.tokens_per_pair * (1 + stats.beam)) / forward
    return loss + search


def choose(stats: FineTuneStats, budget: Budget) -> list[Choice]:
    """The fine-tuning recipe for `stats` in `budget` (see the module's table)."""
    seconds = budget.minutes * 60 - budget.spent if budget.minutes else 0.0
    per_validation = validation_seconds(stats)
    if seconds > 0:
        n_valid = int(min(max(VALIDATION_SHARE * seconds // per_validation, MIN_VALIDATIONS), MAX_VALIDATIONS))
        tokens = stats.tokens_per_second * max(seconds - n_valid * per_validation, 0.0)
        batch = int(min(max(tokens / MIN_UPDATES, BATCH_RANGE[0]), BATCH_RANGE[1]) // 256 * 256)
        updates = max(1, int(tokens / batch))
        how = (f"{budget.minutes:g} min at {stats.tokens_per_second:,.0f} tokens/s ({stats.precision}), less "
               f"{n_valid} validations of ~{per_validation:.0f} s")  # fmt: skip
    else:
        batch, updates, how, n_valid = BATCH_RANGE[1], budget.updates, "train.max_updates", MAX_VALIDATIONS
    epochs = updates * batch / max(stats.pairs * stats.tokens_per_pair, 1)
    lr = finetune.pretrained_lr(stats.d_model)
    warmup = int(min(max(WARMUP_SHARE * updates, WARMUP_RANGE[0]), WARMUP_RANGE[1]))
    every = max(10, updates // n_valid)
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
        Choice(
            "train.valid_every",
            every,
            f"{n_valid} validations, ~{per_validation:.0f} s each: at most {VALIDATION_SHARE:.0%} of the budget",
        ),  # fmt: skip
        Choice("train.patience", PATIENCE, f"early stopping: {PATIENCE} validations without a better val BLEU"),
        Choice(
            "train.valid_bleu_subset",
            BLEU_SUBSET,
            f"val BLEU on {BLEU_SUBSET} sentences: a validation stays a small share of the budget",
        ),  # fmt: skip
        Choice("train.max_epochs", 1_000_000, "the budget, not an epoch count, ends the run"),
        Choice(
            "train.precision",
            "auto",
            f"bf16 where this machine computes it natively, else fp32 (here: "
            f"{stats.precision}; 1.9x the speed of fp32 on a Zen 4, benchmarks/RESULTS.md)",
        ),  # fmt: skip
        Choice("train.average_last", 0, "one short schedule decayed to 0: its last weights, no average"),
    ]
    if epochs > 50:
        out.append(Choice(NOTE, None, f"~{epochs:.0f} epochs of a small corpus: early stopping (train.patience) "
                                      "guards against over-fitting it"))  # fmt: skip
    if updates < 100:
        out.append(Choice(NOTE, None, f"WARNING: ~{updates} updates: too short a budget to adapt the parent much; "
                                      "raise train.max_time"))  # fmt: skip
    if stats.end_sentences and budget.minutes:
        out.append(Choice(NOTE, None, f"after the budget: ~{max(end_seconds(stats) / 60, 1):.0f} min more to choose "
                          f"the final weights on the whole val split and score the test splits, the parent's too "
                          f"({stats.end_sentences:,} sentences decoded; train.max_time covers training)"))  # fmt: skip
    return out


def parent_stats(cfg: Config) -> tuple[ModelConfig, FineTuneStats]:
    """The parent's model config and what the rule reads (pairs, tokens a pair in its tokenizer, its update speed
    on this machine: probed and cached, or estimated from TABLE's base shape with `auto.probe=false`)."""
    ckpt = saved.load(cfg.train.init_from)
    model, vocabs = saved.build_model(ckpt)
    finetune.check_direction(cfg, finetune.Parent(ckpt, model, vocabs))  # before the probe
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
    device = pick_device(cfg.train.device)
    amp = pick_autocast("auto", device, model.cfg.d_model)  # what the run trains in (train.precision=auto)
    precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(amp, "fp32")
    if cfg.auto.probe:
        rate = probe.throughput({point: shape}, device, precision)[point]
    else:  # the base shape's table figure, scaled by the parameters an update trains
        base = probe.TABLE[("base", 32_000, False)]
        rate = base * 76e6 / sum(p.numel() for p in model.parameters())
    held = min(cfg.data.valid_from_train, len(pairs))
    beam = int(((ckpt.get("config") or {}).get("decode") or {}).get("beam_size", cfg.decode.beam_size))
    valid = held or 1_000
    end = end_sentences(cfg, held, parent=cfg.train.test_parent)
    return model.cfg, FineTuneStats(len(pairs) - held, tokens, model.cfg.d_model, rate, valid, beam, precision,
                                    end)  # fmt: skip


def configure(cfg: Config, run_dir: Path, keys: set[str], groups: set[str], budget, ranks: int = 1) -> Config:
    """`cfg` with the fine-tuning rule's choices applied except the command line's, the block of reasons logged and
    auto.json written (a resumed run reads it back: the recipe it started with). `ranks`: torchrun's processes, each
    at the probed speed, sharing each update's tokens (mt/train/auto_ranks.py)."""
    saved_record = run_dir / AUTO_FILE
    if saved_record.is_file():
        record = json.loads(saved_record.read_text())
        choices = [Choice(c["key"], c["value"], c["reason"]) for c in record["choices"]]
        source = f"{saved_record} (chosen when this run started)"
    else:
        _, stats = parent_stats(cfg)
        planned = budget()  # less what reading the parent and the probe took
        choices = auto_ranks.over_ranks(
            choose(replace(stats, tokens_per_second=stats.tokens_per_second * ranks), planned), ranks
        )
        record = {"fine_tuning": asdict(stats), "budget": vars(planned), "parent": cfg.train.init_from, "ranks": ranks}
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
