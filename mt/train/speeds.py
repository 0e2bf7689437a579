"""What the probe (mt/train/probe.py) measured on one machine, for `+experiment=auto` where it cannot measure its
own (`auto.probe=false`) and for the rule's table (`python -m mt.train.auto_grid`). Here, not in the probe or the rule,
so that the rule reads the figures and the probe reads the rule's points without importing each other."""

from __future__ import annotations

Point = tuple[str, int, bool]  # (shape name, BPE vocabulary, FLoRes' extras)
# Padded batch tokens per second of every point the rule may ask for: `measure_points` on a 2-vCPU AMD EPYC Zen 3
# (AVX2, no AVX-512), fp32, two threads, torch 2.13.0, 2026-12-01 (`python -m mt.train.probe` prints them).
TABLE: dict[Point, float] = {
    ("base", 32_000, False): 205.0,
    ("compact", 4_000, False): 4_253.7,
    ("compact", 4_000, True): 3_652.7,
    ("compact", 8_000, False): 3_306.5,
    ("compact", 10_000, False): 3_126.0,
    ("compact", 16_000, False): 2_398.1,
    ("compact", 32_000, False): 1_537.1,
    ("small", 16_000, False): 1_063.8,
    ("small", 32_000, False): 791.5,
}
