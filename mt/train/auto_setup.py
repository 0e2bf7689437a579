"""`+experiment=auto` at the start of train.py: measure what the rule (mt/train/auto.py) reads, apply what it
chooses except what the command line sets, log each choice with its reason, and keep the choices in the run dir
(`auto.json`) so that resuming the run trains the same recipe."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from mt import runtime
from mt.config import Config
from mt.data import read
from mt.data.corpus import make_sampler, prepare_data
from mt.run_dir import resume_path
from mt.runtime import pick_device
from mt.train import auto_finetune, auto_ranks, probe
from mt.train.auto import (
    BATCH_TOKENS,
    FREQUENT,
    NOTE,
    PLAN,
    SHAPES,
    VOCABULARIES,
    Budget,
    Choice,
    CorpusStats,
    Epoch,
    Speed,
    choose,
    probe_points,
)
from mt.train.auto_record import AUTO_FILE, block, end_sentences, explicit, set_key, write_record
from mt.train.distributed import world_and_rank

log = logging.getLogger(__name__)

# made / planned updates beyond 1 +- this: train.py warns (check_plan). The seventh change's plans: 0.93-1.03 of the
# updates made (docs/experiments/auto.md); the plan before it, 0.82.
PLAN_TOLERANCE = 0.25
# made / planned updates within PLAN_TOLERANCE but this far from 1: the cached speeds are rescaled (check_plan); a
# nearer run leaves them (a plan's own spread: 0.93-1.03 for the seventh change's).
RESCALE_FROM = 0.03
# Choices that move the run's speed or its count of updates: one set on the command line makes the plan another
# run's, and check_plan neither rescales nor drops the figures.
PLAN_KEYS = {*(f"model.{key}" for key in SHAPES["compact"]), "model.attention_dropout", "model.activation_dropout",
             "tokenizer.vocab_size", "tokenizer.joint", "train.max_tokens", "train.accumulate", "train.valid_every",
             "train.valid_bleu_subset"}  # fmt: skip
# Keys the rule does not choose that move the run's speed or its validations' cost all the same: R-Drop's second
# pass, compilation, EMA's extra validation, the precision, BPE-dropout's re-segmentation, the validations' search
# (decode.*) and whether they decode at all. A command line that sets one, or a whole group, makes the plan
# another run's too.
RATE_KEYS = {"train.rdrop_alpha", "train.compile", "train.ema_decay", "train.ema_validate_raw",
             "train.precision", "train.device", "train.bpe_dropout", "train.valid_bleu", "train.tgt_word_dropout",
             "data.batching"}  # fmt: skip
# Batches of an epoch the probe times against its made-up ones (probe.batch_factor): each stands for an equal share
# of the epoch's padded tokens. Three rounds of them and of the made-up batch: ~15 s on a 2-vCPU Zen 4 (KDE4).
SAMPLE_BATCHES = 6
TYPES_CHECK_EVERY = 100_000  # pairs between checks whether the frequent word types fill the largest vocabulary
SAMPLE_SEED = 0  # the sample's batches are formed with this seed: every seed of a run reads one cached factor


def corpus_stats(cfg: Config) -> CorpusStats:
    """Pairs with text on both sides in the training split (less the pairs held out for validation), their
    whitespace words per side, and the word types (both sides, as written) seen FREQUENT times or more, counted
    until they fill the largest vocabulary the rule has (a corpus of millions of pairs stops counting early)."""
    pairs = src_words = tgt_words = frequent = 0
    types: Counter[str] | None = Counter()
    for s, t in read.TextPairs.of_split(cfg.data, cfg.data.train_split):
        pairs += 1
        source, target = s.split(), t.split()
        src_words += len(source)
        tgt_words += len(target)
        if types is not None:
            types.update(source)
            types.update(target)
            if pairs % TYPES_CHECK_EVERY == 0 and count_frequent(types) >= VOCABULARIES[-1]:
                frequent, types = count_frequent(types), None
    if types is not None:
        frequent = count_frequent(types)
    held = min(cfg.data.valid_from_train, pairs)
    share = (pairs - held) / pairs
    return CorpusStats(pairs - held, round(src_words * share), round(tgt_words * share), frequent_types=frequent,
                       end_sentences=end_sentences(cfg, held))  # fmt: skip


def count_frequent(types: Counter[str]) -> int:
    return sum(1 for n in types.values() if n >= FREQUENT)


def counted(stats: CorpusStats, kept: int, epochs: dict[int, Epoch], vocab: int) -> CorpusStats:
    """`stats` with the pairs training keeps (`kept`: after the length and ratio filters, data.max_len included),
    their words in proportion, and the epochs measured with a BPE of `vocab` entries."""
    share = kept / max(stats.pairs, 1)
    return dataclasses.replace(stats, pairs=kept, src_words=round(stats.src_words * share),
                               tgt_words=round(stats.tgt_words * share), epochs=epochs, measured_at=vocab)  # fmt: skip


def measure_epochs(cfg: Config, run_dir: Path) -> tuple[dict[int, Epoch], int]:
    """An epoch of the training data as `cfg` tokenizes it (BPE trained and the corpus tokenized now, in the caches
    training then reads), cut by the batcher at each of the rule's batch sizes, with a sample of its batches; and
    the training pairs it keeps (after the length and ratio filters, without the held-out ones)."""
    corpus = prepare_data(cfg, run_dir, cfg.model.max_positions)
    out = {}
    for max_tokens in BATCH_TOKENS:
        epochs = []  # the run's batches, and the sample's (SAMPLE_SEED's)
        for seed in dict.fromkeys((cfg.train.seed, SAMPLE_SEED)):
            sampler = make_sampler(corpus.train_lengths, max_tokens, seed, True, formation=cfg.data.batching)
            sampler.mix = corpus.mix.epoch_rows if corpus.mix is not None else None
            epochs.append([(sampler.src_lens[b], sampler.tgt_lens[b]) for b in sampler.batches()])
        out[max_tokens] = Epoch(len(epochs[0]), sum(map(_padded, epochs[0])), sample(epochs[-1]))
    return out, len(corpus.train)


def _padded(batch: tuple[Sequence[int], Sequence[int]]) -> float:
    """A batch's padded tokens: its sentences x its longest source and target, the two sides averaged."""
    src, tgt = batch
    return len(src) * (int(np.max(src)) + int(np.max(tgt))) / 2


def sample(batches: list[tuple[Sequence[int], Sequence[int]]]) -> tuple:
    """SAMPLE_BATCHES of `batches`, shortest to longest, at the midpoints of equal shares of their padded tokens
    (their sentences' lengths)."""
    ranked = sorted(batches, key=lambda b: int(np.max(b[0])) + int(np.max(b[1])))
    total, edge, picked = sum(map(_padded, ranked)), 0.0, []
    for src, tgt in ranked:
        edge += _padded((src, tgt))
        while len(picked) < SAMPLE_BATCHES and edge >= (len(picked) + 0.5) / SAMPLE_BATCHES * total:
            picked.append((tuple(int(n) for n in src), tuple(int(n) for n in tgt)))
    return tuple(picked)


def corrected(speed: Speed, choices: list[Choice], stats: CorpusStats, device, precision: str) -> tuple[Speed, float]:
    """`speed` times the corpus's batches' speed over the probe's made-up batches (probe.batch_factor), measured at
    the point and the batch size `choices` take; unchanged where the epoch has no sample."""
    chosen = {c.key: c.value for c in choices}
    epoch = stats.epochs.get(chosen["train.max_tokens"])
    if epoch is None or not epoch.shapes:
        return speed, 1.0
    shape = next(name for name, dims in SHAPES.items() if dims["d_model"] == chosen["model.d_model"])
    point = (shape, chosen["tokenizer.vocab_size"], bool(chosen["model.attention_dropout"]))
    factor = probe.batch_factor(point, SHAPES[shape], device, precision, [list(b) for b in epoch.shapes])
    return Speed({p: rate * factor for p, rate in speed.points.items()}), factor


def budget(cfg: Config, job_start: float | None = None) -> Budget:
    """The run's budget; `job_start` (time.time() when train.py started): the seconds of it already spent."""
    spent = time.time() - job_start if job_start is not None and cfg.train.max_time else 0.0
    return Budget(minutes=cfg.train.max_time, updates=cfg.train.max_updates if not cfg.train.max_time else 0,
                  spent=spent)  # fmt: skip


def run_key(cfg: Config) -> dict:
    """What a recipe was chosen for: the training corpus (its files' identity), the pairs held out of it, the
    languages and the budget. A run dir's auto.json is another run's where these differ."""
    d = cfg.data
    try:
        files = read.TextPairs.of_split(d, d.train_split).fingerprint
    except (read.DataError, OSError, ValueError):
        files = None  # (the config's own fields below still tell corpora apart)
    corpus = [d.format, d.dir, d.hub_name, d.hub_config, d.train_split, list(d.columns), files]
    return {"corpus": corpus, "valid_from_train": cfg.data.valid_from_train,
            "languages": [cfg.data.src_lang, cfg.data.tgt_lang], "max_time": cfg.train.max_time,
            "max_updates": cfg.train.max_updates}  # fmt: skip


def saved_record(cfg: Config, run_dir: Path) -> dict | None:
    """The run dir's auto.json where this command resumes the run that wrote it (a checkpoint to resume, the same
    corpus and budget), else None: a start killed before its first checkpoint, another corpus or budget in a shared
    run dir, or train.resume=never choose afresh. An unreadable record is none, with a warning."""
    path = run_dir / AUTO_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        assert isinstance(record, dict) and isinstance(record["choices"], list)
    except (OSError, ValueError, AssertionError, KeyError):
        log.warning("auto: %s is not readable (cut short?); choosing the recipe afresh", path)
        return None
    if resume_path(cfg.train.resume, run_dir) is None:
        log.info("auto: %s belongs to a run that left no checkpoint to resume; choosing afresh", path)
        return None
    if record.get("key") != run_key(cfg):
        log.info("auto: %s was chosen for another corpus or budget; choosing afresh", path)
        return None
    return record


def configure(cfg: Config, run_dir: Path, overrides: list[str], job_start: float | None = None) -> Config:
    """`cfg` with the rule's choices applied (in place), the block of reasons logged, `auto.json` written.
    `job_start`: when train.py started (time.time()), whose clock train.max_time counts from. Under torchrun rank 0
    chooses for all ranks (mt/train/auto_ranks.py)."""
    ranks = world_and_rank()[0]
    return auto_ranks.agree(cfg, lambda: _configure(cfg, run_dir, overrides, job_start, ranks))


def _configure(cfg: Config, run_dir: Path, overrides: list[str], job_start: float | None, ranks: int) -> Config:
    keys, groups = explicit(overrides)
    if cfg.train.init_from:  # a fine-tuning run: its own rule (mt/train/auto_finetune.py)
        return auto_finetune.configure(cfg, run_dir, keys, groups, lambda: budget(cfg, job_start), ranks)

    def plan(stats: CorpusStats, planned: Budget, speed: Speed) -> list[Choice]:
        """The rule's choices with every rank at `speed` (one rank's), the update shared among them."""
        return auto_ranks.over_ranks(choose(stats, planned, auto_ranks.scaled(speed, ranks)), ranks)

    saved = run_dir / AUTO_FILE
    resolve_precision(cfg, pick_device(cfg.train.device), keys)
    record = saved_record(cfg, run_dir)
    if record is not None:  # a resumed run: the recipe it started with
        choices = [Choice(c["key"], c["value"], c["reason"]) for c in record["choices"]]
        source = f"{saved} (chosen when this run started)"
    else:
        stats = corpus_stats(cfg)
        device = pick_device(cfg.train.device)
        precision = probe_precision(cfg)
        runtime.use_tf32(device)  # the probe times the matmuls training runs: TF32 on CUDA
        points = {point: SHAPES[point[0]] for point in probe_points(stats)}
        # A budget of updates reads no speed: the probe's seconds would be spent for nothing (TABLE stands in)
        probing = cfg.auto.probe and bool(cfg.train.max_time)
        speed = probed = Speed(probe.throughput(points, device, precision, probing))
        factor = 1.0
        planned = budget(cfg, job_start)
        choices = plan(stats, planned, speed)
        measured_at = None  # the epoch measured with the rule's vocabulary (a parent's: estimated)
        for _ in range(3 if not cfg.train.init_from else 0):  # a measured epoch may move the vocabulary
            trial = copy.deepcopy(cfg)
            for c in choices:
                if c.key.startswith("tokenizer.") and c.key not in keys and "tokenizer" not in groups:
                    set_key(trial, c.key, c.value)
            if trial.tokenizer.vocab_size == measured_at:
                break
            epochs, kept = measure_epochs(trial, run_dir)
            # the pairs training will see: after the length filters; the epoch is the run's whatever the rule asks
            # where the command line sets the vocabulary
            given = "tokenizer.vocab_size" in keys or "tokenizer" in groups
            stats = counted(stats, kept, epochs, 0 if given else trial.tokenizer.vocab_size)
            measured_at = trial.tokenizer.vocab_size
            planned = budget(cfg, job_start)  # less what BPE and the tokenized cache took
            if probing:  # the probe's figures at the corpus's own batches
                unsplit = choose(stats, planned, auto_ranks.scaled(probed, ranks))  # (the batch the epochs were cut in)
                speed, factor = corrected(probed, unsplit, stats, device, precision)
                planned = budget(cfg, job_start)  # less the factor's seconds
            choices = plan(stats, planned, speed)
        record = {"corpus": dataclasses.asdict(stats), "budget": vars(planned),
                  "speed": [[*point, rate] for point, rate in speed.points.items()], "batch_factor": factor,
                  "device": str(device), "ranks": ranks, "probed": probing, "key": run_key(cfg),
                  "command_line": sorted(keys | groups)}  # fmt: skip
        for epoch in record["corpus"]["epochs"].values():
            epoch.pop("shapes", None)  # the sample's lengths: the factor stands for them
        limit = f"{cfg.train.max_time:g} min" if cfg.train.max_time else f"{cfg.train.max_updates:,} updates"
        source = f"{stats.pairs:,} pairs ({stats.src_words:,} / {stats.tgt_words:,} words) in {limit}"
    overridden = [c for c in choices if c.key in keys or c.key.split(".")[0] in groups]
    applied = [c for c in choices if c.key not in (NOTE, PLAN) and c not in overridden]
    lines = [f"auto: the recipe for {source}:", *block(choices, applied, cfg)]
    if record.get("batch_factor", 1.0) != 1.0:
        lines.insert(1, f"  speed: the probe's figures x {record['batch_factor']:.2f}, the corpus's batches timed "
                        "against its made-up ones")  # fmt: skip
    for c in applied:
        set_key(cfg, c.key, c.value)
    for line in lines:
        (log.warning if "WARNING" in line else log.info)(line)
    record["choices"] = [vars(c) for c in choices]
    record["applied"] = [c.key for c in applied]
    write_record(saved, record)
    return cfg


def check_plan(run_dir: Path, made: int, probed: bool, precision: str = "fp32") -> str | None:
    """The plan against the run that train.max_time stopped after `made` updates. Within PLAN_TOLERANCE of it: the
    cached figures the plan read are rescaled by made / planned (probe.rescale), so that the next plan on this
    machine starts from the speed a whole run held (seen on a 2-vCPU Zen 3: a probe at a run's start read ~16% above
    the run, twice), and None. Beyond it, a warning: the speeds the rule planned with were not the machine's. A probe
    made while another job ran would stay in the cache (seen: under a third of the host's speed, a plan of 433
    updates where the run alone planned 1,594) and plan every later run, so its figures for this machine are dropped
    (probe.forget): the next run probes again. Neither where the command line set one of PLAN_KEYS. `precision`: the
    one the run probed at (`probe_precision`)."""
    saved = run_dir / AUTO_FILE
    try:  # a warning only: an unreadable record must not cost the run its test reports
        record = json.loads(saved.read_text()) if saved.is_file() else {}
    except (OSError, ValueError):
        return None
    plan = next((c["value"] for c in record.get("choices", []) if c["key"] == PLAN), None)
    if not plan or not plan.get("updates"):
        return None
    chosen = {c["key"] for c in record["choices"]}
    given = set(record.get("command_line", []))
    # (a whole data group, data=local, chooses the corpus: the plan was made for it)
    moves = {k for k in given if k in RATE_KEYS or k.startswith("decode.") or k in ("decode", "model", "train")}
    if moved := sorted(((chosen & PLAN_KEYS) - set(record.get("applied", chosen))) | moves):
        log.info("auto: the command line set %s: the plan's updates are not this run's, the cached speeds are left "
                 "as they are", ", ".join(moved))  # fmt: skip
        return None
    try:
        device = torch.device(record.get("device", "cpu"))
    except (RuntimeError, TypeError):
        device = torch.device("cpu")
    ratio = made / plan["updates"]
    ranks = record.get("ranks", 1)
    if ranks > 1:  # the probe timed one rank alone: a miss may be the ranks' communication, not the machine's speed
        if abs(ratio - 1) <= PLAN_TOLERANCE:
            return None
        return (f"auto: the plan expected {plan['updates']:,} updates of {ranks} ranks in this budget and the run made "
                f"{made:,} ({ratio:.2f} of them): the ranks together were not {ranks} x the speed the probe timed on "
                "one (their gradients' exchange, each rank's smaller batches, or cores they share); the cached "
                "speeds, one rank's, are left as they are")  # fmt: skip
    if abs(ratio - 1) <= PLAN_TOLERANCE:
        if probed and abs(ratio - 1) >= RESCALE_FROM:
            factor = record.get("batch_factor") or 1.0
            read = {probe.cache_key((name, vocab, extras), SHAPES[name], device, precision): rate / factor
                    for name, vocab, extras, rate in record.get("speed", []) if name in SHAPES}  # fmt: skip
            if n := probe.rescale(read, ratio):
                log.info("auto: the run made %.2f of the %s updates planned: %d cached speed%s of this machine "
                         "x %.2f for the next plan (%s)", ratio, f"{plan['updates']:,}", n, "s" * (n > 1), ratio,
                         probe.cache_path())  # fmt: skip
        return None
    if probed:
        dropped = probe.forget(device, precision)
        source = (f"the probe's figures were not this machine's speed now (a probe made while another job ran?): "
                  f"{dropped} dropped from {probe.cache_path()}, the next run probes again")  # fmt: skip
    else:
        source = "the table's figures (auto.probe=false) are not this machine's: set auto.probe=true"
    return (
        f"auto: the plan expected {plan['updates']:,} updates in this budget and the run made {made:,} "
        f"({ratio:.2f} of them): {source}"
    )


def resolve_precision(cfg: Config, device: torch.device, keys: set[str]) -> None:
    """train.precision=auto (auto.yaml's) made concrete before the probe, which times at one precision: on CUDA what
    `auto` trains at there (bf16 from Ampere on, else fp16); on the CPU fp32, which every measured plan ran at (the
    rule's compact shape is under runtime.CPU_BF16_MIN_WIDTH, where bf16 is not faster)."""
    if cfg.train.precision != "auto" or "train.precision" in keys:
        return
    dtype = runtime.pick_autocast("auto", device) if runtime.on_cuda(device) else None
    cfg.train.precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
    log.info("auto: train.precision=%s on %s (train.precision=auto)", cfg.train.precision, device)


def probe_precision(cfg: Config) -> str:
    """The precision the probe times at: the run's autocast type, else fp32."""
    return cfg.train.precision if cfg.train.precision in ("bf16", "fp16") else "fp32"
