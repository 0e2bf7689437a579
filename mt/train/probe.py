"""How fast this machine trains each candidate shape of `+experiment=auto` (mt/train/auto.py), measured in seconds
and cached per machine and shape, so that the rule knows how many updates and epochs a budget holds.

The probe times a few training updates (forward, the fused loss, backward, Adam) of each shape on made-up
batches of 2,048 padded tokens (sentences of 24 tokens, a vocabulary of 8,000) and reports padded batch tokens
per second. Cached in `$MT_CACHE` (default `~/.cache/mt`)/throughput.json under the machine (CPU model or GPU
name), device, precision, threads, torch version and shape. With `auto.probe=false`, or where the probe cannot
run, the rule reads `TABLE`: figures of this probe on a 2-vCPU AMD EPYC (Zen 5), fp32.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

from mt.config import ModelConfig

log = logging.getLogger(__name__)

TOKENS, SENTENCE, VOCAB, STEPS = 2_048, 24, 8_000, 3
# Padded batch tokens per second: `measure` of auto.SHAPES on a 2-vCPU AMD EPYC (Zen 5, AVX-512), fp32, two
# threads, torch 2.13, 2026-11-29; compact: its FFN-512 figure (6,551) x 1.17, the FFN-256 / FFN-512 ratio measured on
# one such CPU the same day.
TABLE = {"compact": 7_660.0, "small": 3_229.0, "base": 601.0}


def cache_path() -> Path:
    return Path(os.environ.get("MT_CACHE", Path.home() / ".cache" / "mt")) / "throughput.json"


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_key(name: str, shape: dict, device: torch.device, precision: str) -> str:
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    return (f"{machine(device)}|{device.type}|{precision}|{threads} threads|torch {torch.__version__}|{name}|"
            f"{json.dumps(shape, sort_keys=True)}")  # fmt: skip


def measure(shape: dict, device: torch.device, precision: str = "fp32") -> float:
    """Padded batch tokens per second of training updates of `shape` on `device` (one untimed update first)."""
    from mt.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(name="probe", **shape), VOCAB, VOCAB).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    rows = TOKENS // SENTENCE
    src = torch.randint(4, VOCAB, (rows, SENTENCE), device=device)
    tgt = torch.randint(4, VOCAB, (rows, SENTENCE + 1), device=device)
    pad = torch.zeros_like(src, dtype=torch.bool)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def update() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss, _ = model.loss(src, pad, tgt[:, :-1], tgt[:, 1:], 0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    update()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(STEPS):
        update()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return rows * SENTENCE * STEPS / (time.perf_counter() - start)


def throughput(shapes: dict[str, dict], device: torch.device, precision: str, probe: bool = True) -> dict[str, float]:
    """Padded batch tokens per second of each shape: from the cache, else measured (and cached); `TABLE`'s figures
    when `probe` is False."""
    if not probe:
        return {name: TABLE[name] for name in shapes}
    path = cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    out = {}
    for name, shape in shapes.items():
        key = cache_key(name, shape, device, precision)
        if key not in cache:
            start = time.perf_counter()
            cache[key] = measure(shape, device, precision)
            log.info("auto: probed shape '%s': %.0f tokens/s (%.1f s, cached in %s)", name, cache[key],
                     time.perf_counter() - start, path)  # fmt: skip
        out[name] = cache[key]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a read-only home: the run goes on, the next one probes again
        log.warning("auto: could not cache the probe in %s (%s)", path, e)
    return out
