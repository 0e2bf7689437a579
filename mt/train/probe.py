"""How fast this machine trains each model `+experiment=auto` (mt/train/auto.py) may choose, measured in seconds and
cached per machine and model, so that the rule knows how many updates and epochs a budget holds.

A point is a shape of auto.SHAPES with the output layer of a BPE vocabulary and, or not, FLoRes' extra dropout
layers (attention and activation dropout): at the compact shape's width a 10k output layer costs a fifth of the
tokens a second a 4k one trains, and the extra layers more than a tenth (docs/experiments/auto.md), so a probe of
another vocabulary or without them misplans the run. The probe times training updates of the point (forward, the fused
loss, backward, Adam) on made-up batches of 2,048 padded tokens (4,096 on a GPU; sentences of 24 tokens), the points
in turn (`measure_points`), and reports padded batch tokens per second. Cached in `$MT_CACHE` (default
`~/.cache/mt`)/throughput.json under the machine (CPU model, family and vector extensions, or GPU name), device,
precision, threads, torch version and point. With `auto.probe=false`, or where the probe cannot run, the rule reads
`TABLE`: this probe's figures on one 2-vCPU AMD EPYC.

A corpus's own batches train at another speed than those made-up ones: slower where its batches hold long sentences
(self- and cross-attention grow with the length), faster where its targets are padded (the loss skips padding rows).
`batch_factor` times a sample of the corpus's batches (their shapes, made-up tokens) against the made-up batches,
interleaved in one process so that a shared host's drift moves both alike, and the plan scales every point's speed
by it. Measured on KDE4 (4,500 pairs with a long tail of segments, its 4k-BPE batches 67 tokens long on average,
weighted by their tokens): the probe read 21-26% above the run's speed on an AMD EPYC Zen 4 and an Intel Xeon with
AMX, and the plan took FLoRes' regime for ~49 epochs the run did not reach (~41). The factor there: 0.85 on the
Zen 4; on IWSLT TED's batches 0.99 (docs/experiments/auto.md, "The plan and the probe").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

from mt import runtime
from mt.config import ModelConfig
from mt.data.tokenizer import PAD
from mt.train.speeds import TABLE, Point

log = logging.getLogger(__name__)

TOKENS, SENTENCE, STEPS, ROUNDS = 2_048, 24, 2, 5  # ROUNDS rounds of STEPS timed updates a point
# A GPU's made-up batch: the long schedule's batch (auto.py's LONG_TOKENS), which a GPU's budget takes. At 2,048
# tokens a GPU update of these small models is bound by its kernel launches, not its arithmetic: tokens a second
# would read a fraction of what training's batches reach, and more so for the narrow shapes than the wide ones.
# (A CPU's time grows with the tokens; TABLE's figures are at TOKENS.)
CUDA_TOKENS = 4_096
EXTRAS_DROPOUT = 0.1  # the rule's FLoRes extras (auto.py): attention and activation dropout
# CPU flags that change how fast torch trains: a "model name" alone does not tell a Zen 3 (AVX2) from a Zen 4.
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
ARM_VECTOR_FLAGS = ("asimd", "asimddp", "sve", "sve2", "bf16", "i8mm")  # an Arm core's (Graviton3: SVE and BF16)
Shape = tuple[tuple[int, ...], tuple[int, ...]]  # a batch's source and target lengths, sentence by sentence
FACTOR_ROUNDS = 3  # rounds of the sample's batches (and STEPS made-up updates) `batch_factor` times


def cache_path() -> Path:
    return Path(os.environ.get("MT_CACHE", Path.home() / ".cache" / "mt")) / "throughput.json"


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        return describe_cpu(Path("/proc/cpuinfo").read_text(), platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def describe_cpu(cpuinfo: str, arch: str) -> str:
    """The cache's name for this CPU, from /proc/cpuinfo's first processor: x86's model name, family, model and
    vector extensions; an Arm core's implementer, part and variant (Graviton2's Neoverse N1 is part 0xd0c,
    Graviton3's V1 0xd40: they share no "model name") and its vector extensions."""
    lines = cpuinfo.split("\n\n")[0].splitlines()
    info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in lines if ":" in line)}
    if "CPU implementer" in info and "cpu family" not in info:  # Arm (aarch64): no family, no model
        flags = set(info.get("Features", "").split())
        vector = ",".join(f for f in ARM_VECTOR_FLAGS if f in flags) or "no sve"
        return (f"{info.get('model name', arch)} (implementer {info['CPU implementer']} part "
                f"{info.get('CPU part', '?')} variant {info.get('CPU variant', '?')}, {vector})")  # fmt: skip
    flags = set(info.get("flags", "").split())
    vector = ",".join(f for f in VECTOR_FLAGS if f in flags) or "no avx2"
    return f"{info.get('model name', arch)} (family {info.get('cpu family', '?')} model " \
           f"{info.get('model', '?')}, {vector})"  # fmt: skip


def batch_tokens(device: torch.device) -> int:
    """The made-up batch's padded tokens on `device`."""
    return CUDA_TOKENS if runtime.on_cuda(device) else TOKENS


def _setting(device: torch.device, precision: str) -> str:
    """The cache keys' start: the machine, device, precision, threads and torch a figure was measured with (and, on
    a GPU, the made-up batch's size: figures from smaller batches are not reused)."""
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    batch = f"batch {CUDA_TOKENS}|" if runtime.on_cuda(device) else ""
    return f"{machine(device)}|{device.type}|{precision}|{threads} threads|torch {torch.__version__}|{batch}"


def cache_key(point: Point, shape: dict, device: torch.device, precision: str) -> str:
    name, vocab, extras = point
    return (f"{_setting(device, precision)}{name}|{json.dumps(shape, sort_keys=True)}|vocab {vocab}|"
            f"{'extras' if extras else 'no extras'}")  # fmt: skip


class _Trial:
    """One point's model, optimizer and made-up batches, timed update by update: one batch of TOKENS // SENTENCE
    sentences of SENTENCE tokens, or batches of `shapes` (made-up tokens, padded as the corpus's batches are)."""

    def __init__(self, shape: dict, device: torch.device, precision: str, vocab: int, extras: bool,
                 shapes: list[Shape] | None = None):  # fmt: skip
        from mt.model.transformer import Transformer

        torch.manual_seed(0)
        inner = EXTRAS_DROPOUT if extras else 0.0
        mc = ModelConfig(name="probe", **shape, attention_dropout=inner, activation_dropout=inner)
        self.model = Transformer(mc, vocab, vocab).to(device).train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        if shapes is None:  # padded tokens a batch: its source tokens (TABLE's and the cache's unit)
            rows = batch_tokens(device) // SENTENCE
            shapes = [((SENTENCE,) * rows, (SENTENCE,) * rows)]
            self.tokens = [float(rows * SENTENCE)]
        else:  # its sentences x its longest source and target, the two sides averaged (auto.Epoch's unit)
            self.tokens = [len(src) * (max(src) + max(tgt)) / 2 for src, tgt in shapes]
        self.batches = [_made_up(src, tgt, vocab, device) for src, tgt in shapes]
        self.device, self.dtype = device, {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        for batch in self.batches:  # untimed: the first update of each shape allocates
            self.update(batch)

    def update(self, batch: tuple[torch.Tensor, ...]) -> None:
        src, pad, tgt_in, tgt_out = batch
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            loss, _ = self.model.loss(src, pad, tgt_in, tgt_out, 0.1)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def seconds(self, batch: tuple[torch.Tensor, ...], steps: int = 1) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            self.update(batch)
        if runtime.on_cuda(self.device):  # CUDA runs the updates asynchronously: wait for them before the clock stops
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - start) / steps

    def rate(self, steps: int) -> float:
        """Padded batch tokens per second of `steps` updates of the first batch."""
        return self.tokens[0] / self.seconds(self.batches[0], steps)


def _made_up(src_lens: tuple[int, ...], tgt_lens: tuple[int, ...], vocab: int, device: torch.device):
    """(src, src_pad_mask, tgt_in, tgt_out) of random tokens, each sentence its length, padding after it."""

    def padded(lengths: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        at = torch.arange(max(lengths)).unsqueeze(0)
        pad = at >= torch.tensor(lengths).unsqueeze(1)
        return torch.randint(4, vocab, pad.shape).masked_fill(pad, PAD).to(device), pad.to(device)

    src, src_pad = padded(src_lens)
    tgt_in, _ = padded(tgt_lens)
    tgt_out, _ = padded(tgt_lens)
    return src, src_pad, tgt_in, tgt_out


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
    cache = _read(path)
    keys = {point: cache_key(point, shape, device, precision) for point, shape in points.items()}
    missing = {point: shape for point, shape in points.items() if keys[point] not in cache}
    if missing:
        start = time.perf_counter()
        for point, rate in measure_points(missing, device, precision).items():
            cache[keys[point]] = rate
            log.info("auto: probed shape '%s' with a %d BPE%s: %.0f tokens/s", point[0], point[1],
                     ", FLoRes' extras" if point[2] else "", rate)  # fmt: skip
        log.info("auto: the probe took %.1f s (cached in %s)", time.perf_counter() - start, path)
        _write(path, cache)
    return {point: cache[keys[point]] for point in points}


def measure_factor(point: Point, shape: dict, device: torch.device, precision: str, shapes: list[Shape]) -> float:
    """The corpus's batches' speed over the made-up batches' at `point`: `shapes` (batches that each stand for an
    equal share of an epoch's padded tokens) timed in turn with STEPS made-up updates, FACTOR_ROUNDS times, the
    median of the rounds' ratios. An epoch's rate is its tokens over the sum of its batches' seconds: with equal
    shares, the mean of the sample's seconds per token."""
    corpus = _Trial(shape, device, precision, point[1], point[2], shapes)
    made_up = _Trial(shape, device, precision, point[1], point[2])
    made_up.rate(STEPS)  # untimed, as in measure_points
    ratios = []
    for _ in range(FACTOR_ROUNDS):
        per_token = [corpus.seconds(b) / tokens for b, tokens in zip(corpus.batches, corpus.tokens)]
        ratios.append(len(per_token) / sum(per_token) / made_up.rate(STEPS))
    return sorted(ratios)[len(ratios) // 2]


def batch_factor(point: Point, shape: dict, device: torch.device, precision: str, shapes: list[Shape]) -> float:
    """`measure_factor`, cached beside the probe's figures (keyed by the point and the sample's shapes)."""
    path = cache_path()
    digest = hashlib.sha1(json.dumps(shapes).encode()).hexdigest()[:16]
    key = f"{cache_key(point, shape, device, precision)}|batches {digest}"
    cache = _read(path)
    if key not in cache:
        start = time.perf_counter()
        cache[key] = measure_factor(point, shape, device, precision, shapes)
        log.info("auto: the corpus's batches train at %.2f of the probe's speed (%d sampled, %.1f s)", cache[key],
                 len(shapes), time.perf_counter() - start)  # fmt: skip
        _write(path, cache)
    return cache[key]


def forget(device: torch.device, precision: str) -> int:
    """Drop every figure cached for this machine, device, precision, threads and torch (the points and the batch
    factors), so that the next run probes again; the number dropped. A run far from its plan calls it: one reading
    taken while another job ran, or on a slow minute of a shared host, would otherwise plan every later run (seen
    on a 2-vCPU Zen 3: a cached 4,120 tokens/s where the probe alone read 5,418-5,487 and the run trained at 5,153)."""
    path = cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(cache, dict):  # not a cache this probe wrote: left as it is
        return 0
    setting = _setting(device, precision)
    kept = {key: value for key, value in cache.items() if not key.startswith(setting)}
    if len(kept) < len(cache):
        _write(path, kept)
    return len(cache) - len(kept)


def rescale(planned: dict[str, float], ratio: float) -> int:
    """Multiply the cached figures a run planned with (`planned`: cache key -> the figure it read) by `ratio`, the
    updates the run made over those its plan expected, so that the next plan on this machine reads the speed a
    whole run held rather than the probe's few seconds; the number rescaled. A figure that is no longer the one the
    run read (probed again since, or dropped) is left as it is."""
    path = cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(cache, dict):
        return 0
    hits = [key for key, rate in planned.items() if isinstance(cache.get(key), float)
            and abs(cache[key] - rate) <= 1e-6 * rate]  # fmt: skip
    for key in hits:
        cache[key] = planned[key] * ratio
    if hits:
        _write(path, cache)
    return len(hits)


def _read(path: Path) -> dict:
    """The cache's figures; an unreadable file, or one that is not a JSON object (not what this module writes), is
    none (it is rewritten with the next figures)."""
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(cache, dict):
        log.warning("auto: %s is not a JSON object; the probe's figures start afresh there", path)
        return {}
    return cache


def _write(path: Path, cache: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a read-only home: the run goes on, the next one probes again
        log.warning("auto: could not cache the probe in %s (%s)", path, e)


if __name__ == "__main__":  # python -m mt.train.probe: TABLE's figures measured on this machine (CPU, fp32)
    from mt.train.auto import SHAPES, every_probe_point

    cpu = torch.device("cpu")
    print(f"# {machine(cpu)}, fp32, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for point, rate in measure_points({p: SHAPES[p[0]] for p in every_probe_point()}, cpu).items():
        print(f"    {point!r}: {rate:.1f},")
