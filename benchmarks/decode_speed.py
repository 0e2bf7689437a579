"""Decoding speed of a trained checkpoint on a real test set: greedy and beam 5, with and without the KV cache.

    python benchmarks/decode_speed.py CHECKPOINT [--input ../shared/data/multi30k/test_2016_flickr.en.gz]
                                                 [--limit 1000] [--repeats 2]

Every configuration translates the same sentences through the same path as translate.py (length-sorted token
batches); the configurations are interleaved in each repeat. Prints sentences/s median [min..max] and the
speed-up of the cache; also checks that cached and uncached search produce the same translations.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mt import checkpoint, data  # noqa: E402
from mt.config import DecodeConfig  # noqa: E402
from mt.evaluation import translate_ids  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--input", default=str(ROOT.parent / "shared/data/multi30k/test_2016_flickr.en.gz"))
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    model, vocabs = checkpoint.build_model(checkpoint.load(args.checkpoint))
    model.eval()
    lines = list(data.read_lines(Path(args.input)))[: args.limit]
    src_ids = vocabs.src.encode_batch(lines)
    configs = {
        f"{name} {'cached' if cache else 'uncached'}": DecodeConfig(beam_size=k, use_cache=cache, length_penalty=1.0)
        for name, k in (("greedy", 1), ("beam 5", 5))
        for cache in (True, False)
    }
    times: dict[str, list[float]] = {k: [] for k in configs}
    outputs: dict[str, list] = {}
    for _ in range(args.repeats):
        for name, cfg in configs.items():
            start = time.perf_counter()
            hyps = translate_ids(model, src_ids, cfg, torch.device("cpu"), None)
            times[name].append(time.perf_counter() - start)
            outputs[name] = [h[0].tokens for h in hyps]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.checkpoint}: {model.cfg.name} ({n_params / 1e6:.1f}M parameters), {len(lines)} sentences of "
          f"{Path(args.input).name}, {torch.get_num_threads()} threads, {args.repeats} repeats")  # fmt: skip
    print(f"{'search':<20}{'sentences/s median [min..max]':>34}{'cache speed-up':>16}")
    for name in configs:
        rates = [len(lines) / t for t in times[name]]
        base = name.replace("cached", "uncached") if "uncached" not in name else name
        speedup = statistics.median(times[base]) / statistics.median(times[name])
        print(f"{name:<20}{statistics.median(rates):>16.1f} [{min(rates):.1f}..{max(rates):.1f}]{speedup:>15.2f}x")
    for k in ("greedy", "beam 5"):
        same = outputs[f"{k} cached"] == outputs[f"{k} uncached"]
        print(f"{k}: cached and uncached translations identical: {same}")


if __name__ == "__main__":
    main()
