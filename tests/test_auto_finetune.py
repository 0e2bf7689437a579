"""The fine-tuning rule of `+experiment=auto train.init_from=...` (mt/train/auto_finetune.py), as a table."""

import pytest

from mt.train.auto import PLAN, Budget
from mt.train.auto_finetune import BATCH_RANGE, MIN_UPDATES, FineTuneStats, choose, validation_seconds


def chosen(**stats) -> dict:
    base = dict(pairs=4_500, tokens_per_pair=30.0, d_model=512, tokens_per_second=2_000.0)
    budget = stats.pop("budget", Budget(minutes=30))
    return {c.key: c.value for c in choose(FineTuneStats(**{**base, **stats}), budget)}


def test_an_opus_mt_shaped_parent_in_30_minutes():
    stats = FineTuneStats(4_500, 30.0, 512, 2_000.0)
    c = chosen()
    assert c["train.lr"] == 5e-5 and c["train.schedule"] == "linear" and c["train.label_smoothing"] == 0.1
    n_valid = c[PLAN]["updates"] // c["train.valid_every"]
    assert 2 <= n_valid <= 8 and n_valid * validation_seconds(stats) <= 0.15 * 30 * 60  # validations costed
    training = 30 * 60 - n_valid * validation_seconds(stats)
    assert c["train.max_tokens"] == 4_096 and c[PLAN]["updates"] == int(2_000 * training / 4_096)
    assert c["train.warmup"] == int(0.06 * c[PLAN]["updates"]) and c["train.patience"] == 3
    assert c["train.precision"] == "auto" and c["train.max_epochs"] >= 1_000_000


def test_a_slow_machine_validates_less_often_and_keeps_its_updates():
    """A validation costs about as much as a third of a training pass over its tokens, times the beam: on a slow
    machine a 300-sentence beam search is minutes; the plan validates fewer times rather than spend the budget."""
    fast, slow = chosen(tokens_per_second=5_000.0), chosen(tokens_per_second=150.0)
    assert fast[PLAN]["updates"] // fast["train.valid_every"] >= slow[PLAN]["updates"] // slow["train.valid_every"]
    assert slow[PLAN]["updates"] // slow["train.valid_every"] >= 2


@pytest.mark.parametrize("rate", [50.0, 300.0, 2_000.0, 50_000.0])
def test_the_batch_leaves_at_least_the_minimum_of_updates_where_the_range_allows(rate):
    c = chosen(tokens_per_second=rate, budget=Budget(minutes=10))
    assert BATCH_RANGE[0] <= c["train.max_tokens"] <= BATCH_RANGE[1]
    assert c[PLAN]["updates"] >= MIN_UPDATES or c["train.max_tokens"] == BATCH_RANGE[0]


def test_the_rate_falls_with_the_width_and_is_capped():
    rates = [chosen(d_model=d)["train.lr"] for d in (32, 256, 512, 1_024)]
    assert rates == sorted(rates, reverse=True) and rates[0] <= 1e-3 and rates[-1] < 5e-5


def test_a_budget_of_updates_and_a_tiny_budget_warn():
    assert chosen(budget=Budget(updates=80))[PLAN]["updates"] == 80
    notes = [c.reason for c in choose(FineTuneStats(4_500, 30.0, 512, 20.0), Budget(minutes=2))]
    assert any("too short a budget" in n for n in notes)
