"""`+experiment=auto`: the recipe chosen from the corpus and the budget, by a rule that reads like a table.

Before training, train.py measures what the rule needs (`CorpusStats`: pairs and words of the training split;
`Budget`: train.max_time or train.max_updates; the speed of the candidate shapes on this machine, from
mt/train/probe.py), calls `choose` (a pure function: no I/O, no search) and applies its choices to the config,
except the keys the command line sets: those always win. Each choice is logged with its reason in one block, and
written to the run dir (`auto.json`) so that resuming the run reuses them instead of choosing again.

The thresholds are named below, each with the measurement behind it. Two points are measured in this project on
Multi30k En->De (29,000 pairs, docs/results.md): at 5 minutes of two CPU cores (~950 updates, ~6 epochs) the
quickstart recipe (pre-norm, constant lr 3e-3 cooled to 0 over the last 30%, dropout 0.1, 2,500 tokens an
update) beats the 56-minute recipe cut to 5 minutes by +2.74 BLEU (p 0.001); at 56 minutes (~3,850 updates,
~60 epochs) fairseq's recipe (post-norm, fairseq's init, inverse_sqrt lr 5e-3, dropout 0.3, 8,192 tokens an
update, the last 10 epochs averaged) beats this project's recipes (p < 0.05). The rule reproduces both at their
points; between and beyond them it follows the literature (the issue's references: OPUS-MT's vocabulary tiers,
Zhang & Duh 2020 and FLoRes on small-data vocabularies, dropout and label smoothing; Li et al. 2020 on decaying
to zero at the budget's end). It is provisional until the trials of docs/auto.md hold it against fairseq's recipe
on other corpora and budgets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from mt.config import ConfigError

MIN_PAIRS = 1_000  # fewer pairs: no recipe learns a usable translator (OPUS-MT-train refuses <= 10k lines)

# BPE vocabulary (joint): as large as the corpus's frequent words and the budget's tokens allow, from VOCABULARIES.
# The corpus: at most its word types (whitespace words as written, both sides) seen FREQUENT times or more. Entries
# beyond those would be rare words learnt whole, each seen once or twice: the rare, badly trained classes Gowda & May
# (2020) find hurt, whose criterion asks most types of a vocabulary to be frequent. Counted here: Multi30k cut to
# 3,600 / 7,250 / 14,500 / 29,000 pairs 2,841 / 4,660 / 7,433 / 12,434 such types; IWSLT TED (9,527) 10,008; the
# 4,500-pair OPUS samples 5,210 (KDE4) to 8,213 (JRC-Acquis). The floor, 4k, is measured: at a CPU budget's update
# count 4k beat 2k on Multi30k cut to 3,600 pairs (+0.83 val BLEU lc, p 0.030), and EMEA and KDE4 (4,500 pairs) led
# fairseq's recipe with it; OPUS-MT-train gives 10k-100k lines 1k a side, Zhang & Duh 2020 find 1k beats 32k by 5.4
# BLEU on ~24k pairs, both trained to convergence.
# The budget: a vocabulary larger than the floor only where training sees each entry SEEN_PER_ENTRY times on average
# (padded batch tokens the budget holds at that vocabulary's speed, over its size). Measured at a CPU budget's update
# count (GPU replays, two seeds each, docs/experiments/auto.md): on Multi30k cut to 14,500 pairs in 10 minutes (~360 a
# 10k entry) 10k was level with 4k on val and 0.8 behind on test; on the whole of Multi30k in 30 minutes (~1,000 an 8k
# entry, ~800 a 10k one) 4k was 0.71 behind 8k on test (p 0.020) and 10k level with it (+0.31 val, p 0.131); on IWSLT
# TED in 30 minutes (~1,200 a 10k entry) 10k beat 4k by 0.83 val BLEU lc (p 0.001). The bound sits between the first and
# the second, nearer the second: a larger vocabulary costs updates (a 32k output layer runs at 36% of a 4k one's speed
# on the compact shape), so it must be seen often enough to repay them. On Multi30k in 56 minutes it gives fairseq's
# 10k, which beat 8k there (with its warmup: +0.76 val BLEU lc, p 0.013), as 8k beat 4k by ~2 val BLEU at equal epochs
# of that hour.
VOCABULARIES = (4_000, 8_000, 10_000, 16_000, 32_000)
FREQUENT = 3
SEEN_PER_ENTRY = 800
# Where the tokenized corpus is not at hand (the rule's table, python -m mt.train.auto), an epoch's tokens are
# estimated from its words: BPE tokens per whitespace word at each vocabulary size (Multi30k En/De with this
# project's tokenizer: ~1.25 at 8k-10k; smaller vocabularies cut words into more pieces) and the batches' padding
# efficiency (Multi30k, length-bucketed: 0.935). On OPUS corpora of short segments both are off (EMEA: 0.78
# padding, an epoch 2x the estimate): train.py measures the epoch with the batcher instead (`CorpusStats.epochs`).
TOKENS_PER_WORD = {2_000: 1.7, 4_000: 1.45, 8_000: 1.3, 10_000: 1.25, 16_000: 1.2, 32_000: 1.15}
PADDING = 0.93
HEAPS = 0.7  # word types seen FREQUENT times ~ words ** HEAPS, where they are not counted

# Model shapes by training pairs: the compact shape (d 128, fairseq's Multi30k shape: FFN 256) is the only one
# measured on these budgets; larger corpora get wider models (transformer_small, then the paper's base). FFN 256
# rather than 512: 17% more updates in the same CPU time, +1.59 val BLEU lc on IWSLT TED at 30 minutes (p 0.001),
# and fairseq's schedule with FFN 512 stalled there (val BLEU 1.7) where with 256 it trained (docs/auto.md).
SHAPES = {
    "compact": dict(d_model=128, n_heads=4, d_ff=256, encoder_layers=4, decoder_layers=4),
    "small": dict(d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6),
}
SHAPE_BY_PAIRS = [(100_000, "compact"), (1_000_000, "small"), (math.inf, "base")]
MIN_UPDATES_FOR_SHAPE = 3_000  # a wider shape only when the budget still holds this many updates with it

# Short budgets: few updates, few epochs (the quickstart's point, ~950 updates).
# From here fairseq's recipe (post-norm, 8,192 tokens an update), the measured winner at ~3,850 updates, rather
# than the quickstart's, the winner at ~950 and still at ~2,180 (IWSLT TED at 30 minutes: +1.2 val BLEU lc over
# fairseq's schedule, docs/auto.md).
LONG_RUN_UPDATES = 3_000
SHORT_TOKENS, LONG_TOKENS, LONG_ACCUMULATE = 2_500, 4_096, 2
BATCH_TOKENS = (SHORT_TOKENS, LONG_TOKENS)  # the batch sizes the rule picks from: train.py measures an epoch of each
# Long budgets take fairseq's warmup too: 600 updates (run.sh's count for its hour) rather than a quarter of the
# updates. Measured with fairseq's 10k BPE at Multi30k En->De in 56 minutes (docs/auto.md, two seeds): val BLEU lc
# +0.76 over warmup 978 and 8k (p 0.013); on test, level with fairseq's recipe (-0.30, p 0.136) where the rule was
# 0.60 behind. Measured on the compact shape only: the wider ones keep a quarter of the updates (at most 4,000, the
# paper's).
LONG_WARMUP = 600
# The long schedule's peak rate, 5e-3, is fairseq's for its IWSLT shape at d 128 and measured here on the compact
# shape only (no clipping, post-norm). A wider shape takes the paper's peak instead (5.3: d^-0.5 x warmup^-0.5 at
# its warmup: 1.0e-3 at d 256 and 7.0e-4 at d 512 with 4,000 steps; fairseq's base recipe uses 5e-4 to 1e-3), and
# clips gradients at 1.0: post-norm at a high rate and no clipping diverges more readily as width grows.
# Averaging the last epochs (fairseq: the last 10 of ~60, a sixth of the run) only where they are a real share of
# the run: a corpus of a few thousand pairs over a long budget has epochs of a few updates, whose last 10 are the
# last weights' neighbourhood.
MIN_AVERAGED_SHARE = 0.05
# Dropout by the epochs the budget holds, whatever the corpus's size: 0.1 at ~6 epochs (the quickstart's), 0.3 from
# ~60 (fairseq's recipe on Multi30k in its hour). A corpus seen more often overfits sooner, and a smaller one is seen
# more often in the same budget: so regularization never falls as the data shrinks (Sennrich & Zhang 2019; Araabi &
# Monz 2020). Between the two, 0.2: measured against FLoRes' regime below from 4,500 pairs up, 0.2 won wherever both
# ran (docs/experiments/auto.md): IWSLT TED (9,527 pairs) in 10 minutes (~16 epochs) 7.41 val BLEU against 4.59, in
# 30 minutes (~41) +0.46 on val (p 0.015, two seeds); EMEA (4,500 pairs) in 20 minutes (~40-47 epochs) +2.81 on
# test (p 0.001); KDE4 (4,500) in 20 minutes on a Zen 4 (~41-51 epochs) +1.82 on test. Beyond 60 epochs it was
# measured once, on a Xeon with AMX (KDE4, ~70 epochs, two seeds: +0.75 on test, p 0.046; val +0.32, p 0.151):
# there the rule now takes 0.3 without the extras, which no run has compared.
DROPOUT_BY_EPOCHS = [(10, 0.1), (60, 0.2), (math.inf, 0.3)]
# Under FLORES_PAIRS pairs seen at least FLORES_EPOCHS times: FLoRes' low-resource regime, dropout 0.3 with attention
# and activation dropout 0.1 and label smoothing 0.2 (FLoRes: 0.4, 0.2, 0.2). It won on Multi30k cut to 3,600 pairs in
# 10 minutes (~50 epochs, +1.21 val BLEU) and lost at 4,500 pairs and more (above): FLORES_PAIRS sits between.
FLORES_PAIRS = 4_000
FLORES_EPOCHS = 45
# Case markup (mt/data/casing.py: lowercase words with case marks, the vocabulary of a lowercased model with cased
# output) for a corpus under CASE_MARKUP_PAIRS pairs, where words are seen too few times to learn two spellings of
# each. Measured with the rule's other choices (docs/auto.md, AMD EPYC Zen 4, seed 2): IWSLT TED (9,527 pairs) in
# 30 minutes +1.06 val BLEU lc (p 0.001), Multi30k En->De cut to 14,500 pairs in 10 minutes +0.46 (p 0.14; chrF
# +0.90, p 0.004), though German's capitalized nouns make its target 29% longer. On the whole of Multi30k in 56
# minutes (29,000 pairs) the longer text costs epochs (~38 against fairseq's ~48): -1.31 val BLEU lc against
# fairseq's recipe (p 0.003; Zen 4, seed 1), where the rule without it is level (docs/auto.md).
CASE_MARKUP_PAIRS = 20_000
VALIDATIONS = 10  # validations a run (at least every 100 updates), BLEU on 200 sentences
# What a validation costs, in padded tokens of training at the run's speed: the val loss, 200 sentences
# beam-searched and the best checkpoint saved took 10.7 s on average against 0.35 s an update of 1,894 padded
# tokens (KDE4's 500 held-out pairs, 6 minutes, AMD EPYC Zen 3, 2026-12-01, docs/experiments/auto.md), ~30
# updates' worth. Without it the plan overshot the updates made by 21-22% on that host (KDE4, IWSLT TED).
VALIDATION_TOKENS = 57_000
VALIDATION_SENTENCES = 200  # the BLEU sentences of such a validation: the unit of the end's estimate (auto_setup)
MIN_EPOCHS = 1.0  # a budget under one epoch is warned about


def tokens_per_word(vocab: int) -> float:
    """TOKENS_PER_WORD at `vocab`, or at the nearest size it has (a command line's vocabulary)."""
    return TOKENS_PER_WORD[min(TOKENS_PER_WORD, key=lambda size: abs(math.log(size / vocab)))]


@dataclass(frozen=True)
class Epoch:
    """One pass over the training data in batches of at most `max_tokens`: how many batches, and their padded
    tokens (a batch's sentences x its longest source and target, the two sides averaged: the probe's unit)."""

    batches: float
    padded_tokens: float
    # A few of the epoch's batches, each standing for an equal share of its padded tokens: their sentences' source
    # and target lengths, which the probe times against its made-up batches (auto_setup.SAMPLE_BATCHES,
    # probe.batch_factor). Not read by the rule.
    shapes: tuple = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class CorpusStats:
    """What the rule reads of the training data: pairs with text on both sides, whitespace words per side, word
    types seen FREQUENT times or more (0: not counted, estimated from the words), and, where the corpus is tokenized
    with a BPE of `measured_at` entries, its epoch measured at each of BATCH_TOKENS."""

    pairs: int
    src_words: int
    tgt_words: int
    epochs: Mapping[int, Epoch] = field(default_factory=dict)  # max_tokens -> the epoch in such batches
    frequent_types: int = 0
    measured_at: int = 0  # the BPE vocabulary the epochs were measured with (0: whichever the rule asks about)
    end_sentences: int = 0  # what the run's end decodes after the budget: up to 3 x val (the final choice), the tests

    def epoch(self, vocab: int, max_tokens: int) -> Epoch:
        """The measured epoch, scaled to `vocab`'s tokens a word where it was measured with another BPE; else the
        estimate from words: full batches of a padded corpus."""
        if max_tokens in self.epochs:
            e = self.epochs[max_tokens]
            if not self.measured_at or self.measured_at == vocab:
                return e
            scale = tokens_per_word(vocab) / tokens_per_word(self.measured_at)
            return Epoch(e.batches * scale, e.padded_tokens * scale, e.shapes)
        tokens = max(self.src_words, self.tgt_words) * tokens_per_word(vocab) / PADDING
        return Epoch(tokens / max_tokens, tokens)

    @property
    def frequent(self) -> tuple[int, str]:
        """Word types seen FREQUENT times or more, and whether they were counted or estimated from the words (Heaps'
        law fitted to Multi30k's cuts: types ~ words^0.7 counts 2,400 to 12,000 of their 2,841 to 12,434)."""
        if self.frequent_types:
            return self.frequent_types, "counted"
        return int((self.src_words + self.tgt_words) ** HEAPS), "estimated from words"


@dataclass(frozen=True)
class Budget:
    """train.max_time in minutes (0: none) or train.max_updates (0: none); one of them is set. `spent`: seconds of
    train.max_time gone before the first update (train.py's clock starts with the job: reading the corpus, BPE, the
    tokenized cache, the probe)."""

    minutes: float = 0.0
    updates: int = 0
    spent: float = 0.0


@dataclass(frozen=True)
class Speed:
    """Padded batch tokens per second of training updates on this machine (the probe's unit) by shape, BPE vocabulary
    and FLoRes' extras (mt/train/probe.py measures each such point), else `flat`: one figure a shape, whatever the
    vocabulary and the dropout layers (the tests' and older records' form). A vocabulary between or beside two
    measured ones of its shape is read off the line through them in seconds a token: the output layer's cost grows
    linearly with its rows (probe.TABLE, compact shape: 4k to 32k within 2% of that line)."""

    points: Mapping[tuple[str, int, bool], float] = field(default_factory=dict)
    flat: Mapping[str, float] = field(default_factory=dict)

    def __call__(self, shape: str, vocab: int, extras: bool = False) -> float:
        if (shape, vocab, extras) in self.points:
            return self.points[(shape, vocab, extras)]
        if not self.points:
            return self.flat[shape]
        line = sorted((v, rate) for (s, v, e), rate in self.points.items() if (s, e) == (shape, extras))
        if len(line) >= 2:
            return on_line(line, vocab)
        if extras and len(line) < 2:  # the extras' cost where both were measured (this shape's first), times the speed
            both = sorted((s != shape, v, s) for s, v, e in self.points if e and (s, v, False) in self.points)
            ratio = (
                self.points[(both[0][2], both[0][1], True)] / self.points[(both[0][2], both[0][1], False)]
                if both
                else 1
            )
            return self(shape, vocab) * ratio
        if line:
            return line[0][1]
        return self.flat[shape]


def on_line(known: list[tuple[int, float]], vocab: int) -> float:
    """The speed at `vocab` on the line in seconds a token through the two measured vocabularies nearest it: those
    either side of it, else the two smallest or the two largest."""
    above = next((i for i, (v, _) in enumerate(known) if v > vocab), len(known))
    i = min(max(above, 1), len(known) - 1)
    (v0, r0), (v1, r1) = known[i - 1], known[i]
    seconds = 1 / r0 + (vocab - v0) * (1 / r1 - 1 / r0) / (v1 - v0)
    return 1 / seconds if seconds > 0 else max(r0, r1)


NOTE = "note"  # a Choice that sets nothing: a warning about the corpus or the budget
PLAN = "plan"  # a Choice that sets nothing: the updates and epochs the rule expects the budget to hold


@dataclass(frozen=True)
class Choice:
    key: str  # a dotted config key, e.g. "model.dropout", or NOTE
    value: object
    reason: str


def tier(table: list[tuple[float, object]], x: float):
    """The value of the first row whose bound is above `x`."""
    return next(value for bound, value in table if x < bound)


def updates_in(budget: Budget, tokens_per_second: float, epoch: Epoch, accumulate: int) -> int:
    """Updates of `accumulate` batches the budget holds at `tokens_per_second` (padded batch tokens, the probe's
    unit), the batches as large as `epoch`'s on average: the minutes less what went before training and what the
    validations take."""
    if budget.updates:
        return budget.updates
    seconds = max(0.0, budget.minutes * 60 - budget.spent)
    per_update = epoch.padded_tokens / epoch.batches * accumulate / tokens_per_second
    for validations in range(VALIDATIONS, -1, -1):  # the most the updates left make (valid_every: 100 or more)
        updates = int((seconds - validations * VALIDATION_TOKENS / tokens_per_second) / per_update)
        if updates >= 0 and updates // max(100, updates // VALIDATIONS) >= validations:
            return updates
    return 0


def corpus_vocabulary(corpus: CorpusStats) -> int:
    """The largest of VOCABULARIES the corpus's frequent word types fill (the floor where they fill none)."""
    types, _ = corpus.frequent
    return max([VOCABULARIES[0], *(v for v in VOCABULARIES if v <= types)])


def probe_points(corpus: CorpusStats) -> list[tuple[str, int, bool]]:
    """The (shape, BPE vocabulary, FLoRes' extras) points whose speed `choose` reads for `corpus` (the others on the
    line through them, `Speed`): its shape tier's and the smaller ones, at the floor's vocabulary and the largest the
    corpus fills, and the floor with FLoRes' extras under FLORES_PAIRS pairs."""
    names = [name for _, name in SHAPE_BY_PAIRS]
    shapes = names[: names.index(tier(SHAPE_BY_PAIRS, corpus.pairs)) + 1]
    vocabs = sorted({VOCABULARIES[0], corpus_vocabulary(corpus)})
    extras = [(shapes[0], VOCABULARIES[0], True)] if corpus.pairs < FLORES_PAIRS else []
    return [(s, v, False) for s in shapes for v in vocabs] + extras


def every_probe_point() -> list[tuple[str, int, bool]]:
    """Every point `probe_points` gives for some corpus: each shape at each vocabulary, the floor with the extras
    (what `python -m mt.train.probe` measures for probe.TABLE)."""
    names = [name for _, name in SHAPE_BY_PAIRS]
    return sorted({(s, v, False) for s in names for v in VOCABULARIES} | {(names[0], VOCABULARIES[0], True)})


def choose(corpus: CorpusStats, budget: Budget, speed: Speed | Mapping[str, float]) -> list[Choice]:
    """The recipe for `corpus` in `budget`, given `speed` on this machine (a `Speed`, or one figure a shape of
    SHAPES). Raises ConfigError for a corpus too small to train on or a budget with no end."""
    if corpus.pairs < MIN_PAIRS:
        raise ConfigError(f"+experiment=auto: {corpus.pairs} training pairs, fewer than {MIN_PAIRS:,}: too few to "
                          "learn a translator; add data or fine-tune a trained model (train.init_from)")  # fmt: skip
    if not budget.minutes and not budget.updates:
        raise ConfigError("+experiment=auto chooses the recipe for a budget: set train.max_time (minutes) or "
                          "train.max_updates")  # fmt: skip
    if not isinstance(speed, Speed):
        speed = Speed(flat=speed)
    cap, (types, how) = corpus_vocabulary(corpus), corpus.frequent

    def fitted(shape: str) -> tuple[int, int, float]:
        """The largest vocabulary up to `cap` whose entries `shape`'s budget shows SEEN_PER_ENTRY times (else the
        floor), the updates of 8,192 tokens it holds with it, and how often it shows each entry."""
        for v in sorted((v for v in VOCABULARIES if v <= cap), reverse=True):
            epoch = corpus.epoch(v, LONG_TOKENS)
            updates = updates_in(budget, speed(shape, v), epoch, LONG_ACCUMULATE)
            seen = updates * LONG_ACCUMULATE * epoch.padded_tokens / epoch.batches / v
            if seen >= SEEN_PER_ENTRY or v == VOCABULARIES[0]:
                return v, updates, seen
        raise AssertionError("VOCABULARIES[0] is always fitted")

    shape = tier(SHAPE_BY_PAIRS, corpus.pairs)
    while shape != "compact" and fitted(shape)[1] < MIN_UPDATES_FOR_SHAPE:
        shape = {"base": "small", "small": "compact"}[shape]  # too slow for the budget: one size down
    vocab, long_updates, seen = fitted(shape)  # long_updates: of 8,192 tokens
    long_run = long_updates >= LONG_RUN_UPDATES
    tokens, accumulate = (LONG_TOKENS, LONG_ACCUMULATE) if long_run else (SHORT_TOKENS, 1)
    fill = f"{types:,} word types seen {FREQUENT}+ times ({how})"
    if vocab == cap:
        why = f"{fill}: a joint BPE of {vocab:,}" + (
            f", each entry seen ~{seen:,.0f} times in the budget (>= {SEEN_PER_ENTRY})" if vocab > VOCABULARIES[0]
            else f" (the floor: {VOCABULARIES[1]:,} would be rare words)")  # fmt: skip
    else:
        why = (f"{fill} fill {cap:,}, but the budget would show a larger one's entries under {SEEN_PER_ENTRY} times "
               f"each: a joint BPE of {vocab:,} (~{seen:,.0f} each)")  # fmt: skip
    case_markup = corpus.pairs < CASE_MARKUP_PAIRS
    out = [
        Choice("tokenizer.vocab_size", vocab, why),
        Choice("tokenizer.joint", True, "one vocabulary, all embeddings tied (fewer parameters to learn)"),
        Choice(
            "tokenizer.case_markup",
            case_markup,
            f"{corpus.pairs:,} pairs < {CASE_MARKUP_PAIRS:,}: lowercase words with case marks, cased output"
            if case_markup
            else f"{corpus.pairs:,} pairs: case markup only under {CASE_MARKUP_PAIRS:,}",
        ),
    ]
    epoch = corpus.epoch(vocab, tokens)
    # FLoRes' regime for a corpus under FLORES_PAIRS the budget shows FLORES_EPOCHS times at the regime's own speed:
    # its extra dropout layers cost updates, and a plan at the speed without them can cross a bound the run does not
    # reach.
    tiny = corpus.pairs < FLORES_PAIRS
    flores_epochs = (updates_in(budget, speed(shape, vocab, True), epoch, accumulate) * accumulate / epoch.batches
                     if tiny else 0.0)  # fmt: skip
    small_and_long = tiny and flores_epochs >= FLORES_EPOCHS
    rate = speed(shape, vocab, small_and_long)
    updates = updates_in(budget, rate, epoch, accumulate)
    epochs = updates * accumulate / epoch.batches
    spent = f", {budget.spent:.0f} s of it before training" if budget.spent >= 1 else ""
    at = f" in {budget.minutes:g} min{spent} at {rate:,.0f} tokens/s" if not budget.updates else ""
    counted = "measured" if tokens in corpus.epochs else "estimated from words"
    how_long = (f"{updates:,} updates of {tokens * accumulate:,} tokens, ~{epochs:.1f} epochs ({counted}: "
                f"{epoch.batches:,.0f} batches an epoch){at}")  # fmt: skip
    out.append(Choice(PLAN, {"updates": updates, "epochs": round(epochs, 2)}, how_long))
    if corpus.end_sentences and not budget.updates:
        end = corpus.end_sentences / VALIDATION_SENTENCES * VALIDATION_TOKENS / rate
        out.append(Choice(NOTE, None, f"after the budget: ~{max(end / 60, 1):.0f} min more to choose the final "
                          f"weights on the whole val split and score the test splits ({corpus.end_sentences:,} "
                          "sentences decoded; train.max_time covers training)"))  # fmt: skip
    if epochs < MIN_EPOCHS:
        out.append(Choice(NOTE, None, f"WARNING: the budget holds {how_long}: less than one pass over the data; "
                          "a longer train.max_time would help more than any setting"))  # fmt: skip
    for key, value in SHAPES[shape].items():
        out.append(Choice(f"model.{key}", value, f"shape '{shape}': {corpus.pairs:,} pairs, {how_long}"))
    out.append(Choice("model.tie_embeddings", "all", "joint vocabulary"))
    out.append(Choice("train.max_tokens", tokens, how_long))
    out.append(Choice("train.accumulate", accumulate, how_long))
    if long_run:  # fairseq's recipe, the measured winner at ~3,850 updates
        why = f"{updates:,} updates >= {LONG_RUN_UPDATES:,}: fairseq's recipe (the winner at 56 min on Multi30k)"
        warmup = (LONG_WARMUP, "fairseq's count in its hour (run.sh)")
        lr, clip = (5e-3, why), (0.0, why)
        if shape != "compact":  # LONG_WARMUP and 5e-3 are measured on the compact shape only
            steps = max(100, min(4_000, updates // 4))
            warmup = (steps, f"a quarter of the {updates:,} updates, at most 4,000")
            d = SHAPES[shape]["d_model"]
            lr = (float(f"{d**-0.5 * steps**-0.5:.2g}"), f"shape '{shape}': the paper's peak d^-0.5 x warmup^-0.5 "
                  f"(5.3) at d {d}, warmup {steps:,}, not the compact shape's 5e-3")  # fmt: skip
            clip = (1.0, f"shape '{shape}': post-norm at its peak rate, clipped (wider shapes diverge more readily)")
        out += [
            Choice("model.norm", "post", why),
            Choice("model.init", "fairseq", why),
            Choice("train.schedule", "inverse_sqrt", why),
            Choice("train.lr", *lr),
            Choice("train.warmup", *warmup),
            Choice("train.warmup_init_lr", 0.0, why),
            Choice("train.cooldown", 0.0, why),
            Choice("train.adam_eps", 1e-8, why),
            Choice("train.clip_norm", *clip),
        ]
    else:  # the quickstart's, the measured winner at ~950 updates
        why = (f"{long_updates:,} updates of {LONG_TOKENS * LONG_ACCUMULATE:,} tokens < {LONG_RUN_UPDATES:,}: the "
               "quickstart's schedule (the winner at 5 min)")  # fmt: skip
        out += [
            Choice("model.norm", "pre", why),
            Choice("model.init", "xavier", why),
            Choice("train.schedule", "constant", why),
            Choice("train.lr", 3e-3, why),
            Choice("train.warmup", max(50, min(200, updates // 5)), why),
            Choice("train.cooldown", 0.3, "the last 30% of the budget cools the lr to 0 (Li et al. 2020)"),
            Choice("train.clip_norm", 1.0, why),
        ]
    dropout = 0.3 if small_and_long else tier(DROPOUT_BY_EPOCHS, epochs)
    bounds = ", ".join(f"{v:g} under {b:g}" for b, v in DROPOUT_BY_EPOCHS if b != math.inf)
    why = (f"~{epochs:.1f} epochs of {corpus.pairs:,} pairs < {FLORES_PAIRS:,}: FLoRes' regime" if small_and_long
           else f"~{epochs:.1f} epochs: by the epochs the budget holds ({bounds}, else 0.3)")  # fmt: skip
    out.append(Choice("model.dropout", dropout, why))
    at_flores = f" (~{flores_epochs:.1f} at the speed of FLoRes' extras)" if tiny and not small_and_long else ""
    inner = 0.1 if small_and_long else 0.0
    why = (f"{corpus.pairs:,} pairs < {FLORES_PAIRS:,} seen ~{epochs:.1f} times (FLoRes)" if small_and_long
           else f"~{epochs:.1f} epochs{at_flores} of {corpus.pairs:,} pairs: FLoRes' extras only from "
           f"{FLORES_EPOCHS} epochs under {FLORES_PAIRS:,} pairs")  # fmt: skip
    out.append(Choice("model.attention_dropout", inner, why))
    out.append(Choice("model.activation_dropout", inner, why))
    out.append(Choice("train.label_smoothing", 0.2 if small_and_long else 0.1, why))
    every = max(100, updates // VALIDATIONS)
    out.append(Choice("train.valid_every", every, f"{VALIDATIONS} validations in {updates:,} updates"))
    out.append(Choice("train.valid_bleu_subset", 200, "val BLEU on 200 sentences: validation stays a small cost"))
    # The short schedule cools the lr to 0 over its last 30%: its last weights are settled, and averaging its last
    # 10 epochs was level with them (IWSLT TED in 30 minutes, GPU replay, two seeds: +0.10 val BLEU, p 0.186).
    average = min(10, int(epochs // 2)) if long_run else 0
    if long_run:
        why = "the last epochs averaged (fairseq's recipe: 10)" if average else "too few epochs to average"
        if average and average / epochs < MIN_AVERAGED_SHARE:
            why = (f"~{epochs:.0f} epochs: the last {average} would be {100 * average / epochs:.1f}% of the run (under "
                   f"{100 * MIN_AVERAGED_SHARE:.0f}%), the last weights' neighbourhood: not averaged")  # fmt: skip
            average = 0
    else:
        why = "the short schedule cools the lr to 0: averaging its last epochs measured level (+0.10, p 0.186)"
    out.append(Choice("train.average_last", average, why))
    out.append(Choice("train.keep_last", max(average, 2), "the epoch checkpoints averaging reads"))
    out.append(Choice("train.max_epochs", 1_000_000, "the budget ends the run, whatever its epochs (the plan counts "
                                                     "on its time-based cooldown and its end)"))  # fmt: skip
    return out
