"""What a run records as it trains: `metrics.jsonl` (one JSON object a line) and, optionally, TensorBoard scalars
of the same figures in `RUN_DIR/tb/`. Rank 0 writes; the other ranks' logs are no-ops."""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class MetricsLog:
    """Appends records to `metrics.jsonl` and mirrors their numbers to TensorBoard under `{kind}/{name}`."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool | None):
        self.path, self.enabled, self.writer = run_dir / "metrics.jsonl", enabled, None
        if enabled and tensorboard is not False:
            if tensorboard_available():
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))
            elif tensorboard:
                log.warning("train.tensorboard=true but the tensorboard package is missing: pip install tensorboard")

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            step = record.get("update", 0)
            for key, value in record.items():
                if key not in ("kind", "update") and isinstance(value, int | float) and not isinstance(value, bool):
                    self.writer.add_scalar(f"{record['kind']}/{key}", value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class RunningSums:
    """Per-token loss, NLL and target tokens/s over the updates since the last log line. The sums may be device
    tensors: they are read (a wait for the GPU) only in `read`, every `log_every` updates."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.start, self.tokens, self.loss, self.nll = time.perf_counter(), 0, 0.0, 0.0

    def add(self, loss, nll, tokens: int) -> None:
        if torch.is_tensor(loss):  # sums of many updates in float64, as the Python floats they replace
            loss, nll = loss.double(), nll.double()
        self.loss, self.nll, self.tokens = self.loss + loss, self.nll + nll, self.tokens + tokens

    def read(self) -> dict:
        n = max(self.tokens, 1)
        out = {
            "loss": float(self.loss) / n,
            "nll": float(self.nll) / n,
            "tgt_tokens_per_s": self.tokens / (time.perf_counter() - self.start),
        }
        self.reset()
        return out
