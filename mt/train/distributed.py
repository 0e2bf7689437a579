"""Multi-process training with `torchrun`: joining the process group, rank helpers, and agreeing on a stop.

Under DDP every rank must take the same path: the same number of updates, and the same kind of stop (a budget
stop validates the partial epoch, which has collectives; a signal exits to resume later).
"""

from __future__ import annotations

import logging
import os
import secrets
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
_waiting_group = None  # a gloo group for waiting on rank 0, with its own (long) timeout


def init_distributed(device: str, wait_minutes: float = 120.0) -> int:
    """Join the torchrun process group if there is one; returns this process's rank. The backend follows the
    training device (`train.device`): NCCL for CUDA, gloo for the CPU, even on a machine that has GPUs.
    `wait_minutes`: how long the other ranks wait for rank 0 alone (see `wait_for_rank0`)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0
    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if on_cuda:  # a launcher may show each process only its own GPU: then LOCAL_RANK is not a visible device's index
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    backend = "nccl" if on_cuda else "gloo"
    dist.init_process_group(backend)
    init_waiting(wait_minutes)
    log.info("process group: %s, %s ranks", backend, os.environ["WORLD_SIZE"])
    return dist.get_rank()


def check_shared_run_dir(run_dir: Path) -> None:
    """Stop every rank with the same one-line error unless all of them see the run dir rank 0 writes to. Rank 0
    alone trains the tokenizer and writes checkpoints; a node whose `run_dir` is a local disk would train BPE and
    tokenize into the same paths as its other ranks at once, start afresh on resume and leave the ranks' updates and
    collectives out of step (a hang). Rank 0 writes a random token there; every rank reads it back."""
    from mt.config import ConfigError

    if world_and_rank()[0] == 1:
        return
    token = [secrets.token_hex(16) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0, group=_waiting_group)
    mark = run_dir / ".rank0_token"
    if dist.get_rank() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        mark.write_text(token[0])
    dist.barrier(group=_waiting_group)
    try:
        seen = mark.read_text() == token[0]
    except OSError:
        seen = False
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, seen, group=_waiting_group)
    blind = [rank for rank, ok in enumerate(everyone) if not ok]
    if blind:
        raise ConfigError(
            f"run_dir={run_dir} must be on a filesystem shared by all nodes: rank(s) {', '.join(map(str, blind))} do "
            "not see the files rank 0 writes there (tokenizer, checkpoints); give every node the same shared directory"
        )


def init_waiting(minutes: float) -> None:
    """Create the group `wait_for_rank0` waits in (every rank must call this, after joining the process group)."""
    global _waiting_group
    _waiting_group = dist.new_group(backend="gloo", timeout=timedelta(minutes=minutes))


def wait_for_rank0() -> None:
    """A barrier for the times rank 0 works alone (preparing a corpus: BPE and tokenizing millions of pairs;
    validating with beam search) while the other ranks wait. The process group's own timeout (NCCL: 10 minutes)
    would end the run; this barrier waits in a gloo group whose timeout is `train.wait_timeout`."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=_waiting_group)


def from_rank0(obj):
    """Rank 0's `obj` on every rank (pickled; the others' `obj` is ignored), waiting in `wait_for_rank0`'s group for
    as long as rank 0 takes to make it. `obj` itself in one process."""
    if world_and_rank()[0] == 1:
        return obj
    out = [obj]
    dist.broadcast_object_list(out, src=0, group=_waiting_group)
    return out[0]


def world_and_rank() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def all_gather(obj) -> list:
    """[rank 0's obj, rank 1's, ...]: `[obj]` in one process."""
    if world_and_rank()[0] == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_max(value: float, device: torch.device) -> float:
    """The largest `value` over all ranks (the value itself in one process)."""
    if world_and_rank()[0] == 1:
        return value
    t = torch.tensor([float(value)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


# Why training stopped, as a code that ranks agree on with all_reduce(MAX), the strongest winning.
BUDGET, OTHER, SIGNAL = 1, 2, 3
STOP_ON_ANOTHER_RANK = {BUDGET: "max_time", OTHER: "stopped by another rank", SIGNAL: "SIGTERM"}


def stop_code(reason: str | None) -> int:
    if reason is None:
        return 0
    if reason in ("max_time", "max_updates"):
        return BUDGET
    return SIGNAL if reason in ("SIGINT", "SIGTERM") else OTHER


def agreed_reason(reason: str | None, agreed_code: int) -> str | None:
    """This rank's stop reason (None = go on), raised to `agreed_code`, the strongest kind any rank has (the ranks'
    largest `stop_code`): ranks' clocks differ, so one may reach max_time an update before the others, and a signal
    may reach one rank only."""
    return STOP_ON_ANOTHER_RANK[agreed_code] if agreed_code > stop_code(reason) else reason


def agree_on_stop(reason: str | None, device: torch.device) -> str | None:
    """`agreed_reason` with the ranks' codes gathered now (one all_reduce)."""
    return agreed_reason(reason, int(all_max(stop_code(reason), device)))


def max_over_ranks(t: torch.Tensor) -> torch.Tensor:
    """`t`, element-wise the largest over all ranks (in place; one all_reduce, none in one process)."""
    if world_and_rank()[0] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
