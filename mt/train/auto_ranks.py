"""`+experiment=auto` under `torchrun`: rank 0 chooses the recipe for all ranks, the others take it.

Rank 0 alone reads the corpus, trains BPE, times the shapes on its device (the probe) and plans the run as if every
rank trained at that speed; the plan's updates keep the recipe's tokens an update, shared among the ranks (each
rank's `train.max_tokens` is its share, as fairseq's `--max-tokens` is per GPU). The others wait and receive the
chosen config, so that every rank trains the same recipe.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mt.config import Config, ConfigError
from mt.errors import USER_ERRORS
from mt.train import distributed
from mt.train.auto import PLAN, Choice, Speed

# A rank's batch is no smaller than fine-tuning's smallest (auto_finetune.BATCH_RANGE): below it each update of a
# small model is launch- and communication-bound. Where the recipe's tokens an update shared among many ranks fall
# under it, the update grows to ranks x this, and the plan's updates shrink in proportion (the same tokens in all).
MIN_RANK_TOKENS = 1_024


def scaled(speed: Speed, ranks: int) -> Speed:
    """The ranks' speed together: `speed` (one rank's, as the probe timed it) times `ranks`."""
    return Speed(
        {p: rate * ranks for p, rate in speed.points.items()}, {s: rate * ranks for s, rate in speed.flat.items()}
    )


def over_ranks(choices: list[Choice], ranks: int) -> list[Choice]:
    """`choices` with the update's batch shared among `ranks` ranks: each rank's `train.max_tokens` and
    `train.accumulate` such that one update still holds the recipe's tokens (at least MIN_RANK_TOKENS a rank; then
    the plan's updates are scaled down to the same tokens). Unchanged in one process."""
    if ranks == 1:
        return choices
    chosen = {c.key: c.value for c in choices}
    tokens, accumulate = chosen["train.max_tokens"], chosen.get("train.accumulate", 1)
    update = tokens * accumulate
    steps = max(1, math.ceil(accumulate / ranks))  # batches a rank accumulates into one update
    per_rank = max(MIN_RANK_TOKENS, math.ceil(update / (ranks * steps)))
    now = per_rank * ranks * steps
    why = f"{update:,} tokens an update (the recipe's) over {ranks} ranks: {per_rank:,} a rank x {steps}"
    if now > update * 1.01:
        why = (f"{update:,} tokens an update over {ranks} ranks would be {math.ceil(update / ranks):,} a rank, under "
               f"{MIN_RANK_TOKENS:,}: {per_rank:,} a rank x {steps}, {now:,} tokens an update")  # fmt: skip
    out = []
    for c in choices:
        if c.key == "train.max_tokens":
            c = Choice(c.key, per_rank, why)
        elif c.key == "train.accumulate":
            c = Choice(c.key, steps, why)
        elif c.key == PLAN and now > update * 1.01:
            plan = {**c.value, "updates": round(c.value["updates"] * update / now)}
            c = Choice(PLAN, plan, f"{c.reason}; {plan['updates']:,} updates of {now:,} tokens over {ranks} ranks")
        out.append(c)
    if "train.accumulate" not in chosen and steps != 1:  # (fine-tuning's rule sets no accumulation)
        out.append(Choice("train.accumulate", steps, why))
    return out


def agree(cfg: Config, configure: Callable[[], Config]) -> Config:
    """The config `configure` makes on rank 0, on every rank (the others wait for it, as for any work rank 0 does
    alone: `distributed.wait_for_rank0`). A refusal on rank 0 (ConfigError) is every rank's, so that all of them
    stop with its one line rather than wait for a config that never comes (and any other exception there, named)."""
    world, rank = distributed.world_and_rank()
    if world == 1:
        return configure()
    made: Config | str = cfg
    if rank == 0:
        try:
            made = configure()
        except Exception as e:  # (a defect's too: the others must not wait for it)
            distributed.from_rank0(str(e) if isinstance(e, USER_ERRORS) else f"rank 0 stopped: {e!r}")
            raise
    made = distributed.from_rank0(made)
    if isinstance(made, str):  # rank 0's refusal
        raise ConfigError(made)
    return made
