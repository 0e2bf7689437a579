"""How fast this machine trains each model `+experiment=auto` (mt/train/auto.py) may choose, measured in seconds and
cached per machine and model, so that the rule knows how many updates and epochs a budget holds.

A point is a shape of auto.SHAPES with the output layer of a BPE vocabulary and, or not, FLoRes' extra dropout
layers (attention and activation dropout): at the compact shape's width a 10k output layer costs a fifth of the
tokens a second a 4k one trains, and the extra layers more than a tenth (docs/experiments/auto.md), so a probe of
another vocabulary or without them misplans the run. The probe times training updates of the point (forward, the fused
loss, backward, Adam) on made-up batches of 2,048 padded tokens (sentences of 24 tokens), the points in turn
(`measure_points`), and reports padded batch tokens per second. Cached in `$MT_CACHE` (default
`~/.cache/mt`)/throughput.json under the machine (CPU model, family and vector extensions, or GPU name), device,
precision, threads, torch version and point. With `auto.probe=false`, or where the probe cannot run, the rule reads
`TABLE`: this probe's figures on one 2-vCPU AMD EPYC.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

from mt import runtime
from mt.config import ModelConfig

log = logging.getLogger(__name__)

TOKENS, SENTENCE, STEPS, ROUNDS = 2_048, 24, 2, 5  # ROUNDS rounds of STEPS timed updates a point
EXTRAS_DROPOUT = 0.1  # the rule's FLoRes extras (auto.py): attention and activation dropout
# CPU flags that change how fast torch trains: a "model name" alone does not tell a Zen 3 (AVX2) from a Zen 4.
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
Point = tuple[str, int, bool]  # (shape name, BPE vocabulary, FLoRes' extras)
# Padded batch tokens per second of every point the rule may ask for: `measure_points` on a 2-vCPU AMD EPYC Zen 3
# (AVX2, no AVX-512), fp32, two threads, torch 2.13.0, 2026-12-01 (`python -m mt.train.probe` prints them).
TABLE: dict[Point, float] = {
    ("base", 32_000, False): 205.0,
    ("compact", 4_000, False): 4_253.7,
    ("compact", 4_000, True): 3_652.7,
    ("compact", 8_000, False): 3_306.5,
    ("compact", 10_000, False): 3_126.0,
    ("compact", 10_000, True): 2_547.5,
    ("compact", 16_000, False): 2_398.1,
    ("compact", 32_000, False): 1_537.1,
    ("small", 16_000, False): 1_063.8,
    ("small", 32_000, False): 791.5,
}


def cache_path() -> Path:
    return Path(os.environ.get("MT_CACHE", Path.home() / ".cache" / "mt")) / "throughput.json"


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        info = dict(
            line.split(":", 1)
            for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
            if ":" in line
        )
    except OSError:
        return platform.processor() or platform.machine()
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = set(info.get("flags", "").split())
    vector = ",".join(f for f in VECTOR_FLAGS if f in flags) or "no avx2"
    return f"{info.get('model name', platform.machine())} (family {info.get('cpu family', '?')} model " \
           f"{info.get('model', '?')}, {vector})"  # fmt: skip


def cache_key(point: Point, shape: dict, device: torch.device, precision: str) -> str:
    name, vocab, extras = point
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    return (f"{machine(device)}|{device.type}|{precision}|{threads} threads|torch {torch.__version__}|{name}|"
            f"{json.dumps(shape, sort_keys=True)}|vocab {vocab}|{'extras' if extras else 'no extras'}")  # fmt: skip


class _Trial:
    """One point's model, optimizer and made-up batch, timed update by update."""

    def __init__(self, shape: dict, device: torch.device, precision: str, vocab: int, extras: bool):
        from mt.model.transformer import Transformer

        torch.manual_seed(0)
        inner = EXTRAS_DROPOUT if extras else 0.0
        mc = ModelConfig(name="probe", **shape, attention_dropout=inner, activation_dropout=inner)
        self.model = Transformer(mc, vocab, vocab).to(device).train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        rows = TOKENS // SENTENCE
        self.src = torch.randint(4, vocab, (rows, SENTENCE), device=device)
        self.tgt = torch.randint(4, vocab, (rows, SENTENCE + 1), device=device)
        self.pad = torch.zeros_like(self.src, dtype=torch.bool)
        self.device, self.dtype = device, {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.update()  # untimed: the first update allocates

    def update(self) -> None:
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            loss, _ = self.model.loss(self.src, self.pad, self.tgt[:, :-1], self.tgt[:, 1:], 0.1)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def rate(self, steps: int) -> float:
        """Padded batch tokens per second of `steps` updates."""
        start = time.perf_counter()
        for _ in range(steps):
            self.update()
        if runtime.on_cuda(self.device):  # CUDA runs the updates asynchronously: wait for them before the clock stops
            torch.cuda.synchronize(self.device)
        return self.src.numel() * steps / (time.perf_counter() - start)


def measure_points(points: dict[Point, dict], device: torch.device, precision: str = "fp32") -> dict[Point, float]:
    """Padded batch tokens per second of training updates of each point (its shape given) on `device`: the points
    timed in turn, ROUNDS times each, and the median of each point's rounds, so that a slower few seconds of a shared
    machine (seen here: +-15% from one 2-second probe to the next) shift every point alike rather than one of them."""
    trials = {point: _Trial(shape, device, precision, point[1], point[2]) for point, shape in points.items()}
    for trial in trials.values():  # untimed: a new process's first seconds of training run slower (seen: -15%)
        trial.rate(STEPS)
    rounds: dict[Point, list[float]] = {point: [] for point in points}
    for _ in range(ROUNDS):
        for point, trial in trials.items():
            rounds[point].append(trial.rate(STEPS))
    return {point: sorted(rates)[len(rates) // 2] for point, rates in rounds.items()}


def measure(
    shape: dict, device: torch.device, precision: str = "fp32", vocab: int = 8_000, extras: bool = False
) -> float:
    """Padded batch tokens per second of training updates of `shape` with a `vocab`-type output layer (and FLoRes'
    extra dropout layers with `extras`) on `device`."""
    return measure_points({("shape", vocab, extras): shape}, device, precision)[("shape", vocab, extras)]


def throughput(
    points: dict[Point, dict], device: torch.device, precision: str, probe: bool = True
) -> dict[Point, float]:
    """Padded batch tokens per second of each point (its shape given): from the cache, else measured (and cached);
    `TABLE`'s figures when `probe` is False."""
    if not probe:
        return {point: TABLE[point] for point in points}
    path = cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    keys = {point: cache_key(point, shape, device, precision) for point, shape in points.items()}
    missing = {point: shape for point, shape in points.items() if keys[point] not in cache}
    if missing:
        start = time.perf_counter()
        for point, rate in measure_points(missing, device, precision).items():
            cache[keys[point]] = rate
            log.info("auto: probed shape '%s' with a %d BPE%s: %.0f tokens/s", point[0], point[1],
                     ", FLoRes' extras" if point[2] else "", rate)  # fmt: skip
        log.info("auto: the probe took %.1f s (cached in %s)", time.perf_counter() - start, path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, path)
        except OSError as e:  # a read-only home: the run goes on, the next one probes again
            log.warning("auto: could not cache the probe in %s (%s)", path, e)
    return {point: cache[keys[point]] for point in points}


if __name__ == "__main__":  # python -m mt.train.probe: TABLE's figures measured on this machine (CPU, fp32)
    from mt.train.auto import SHAPES, every_probe_point

    cpu = torch.device("cpu")
    print(f"# {machine(cpu)}, fp32, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for point, rate in measure_points({p: SHAPES[p[0]] for p in every_probe_point()}, cpu).items():
        print(f"    {point!r}: {rate:.1f},")
