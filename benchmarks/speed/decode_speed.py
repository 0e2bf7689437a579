"""Decoding speed of a trained checkpoint on real text: greedy and beam 5, with and without the KV cache, and
with int8 weights (decode.quantize=int8).

    python benchmarks/speed/decode_speed.py CHECKPOINT [--input ../shared/data/multi30k/test_2016_flickr.en.gz]
                                                 [--references FILE] [--limit 1000] [--repeats 2]

Every configuration translates the same sentences through the same path as translate.py (length-sorted token
batches); the configurations are interleaved in each repeat. Prints sentences/s median [min..max], the speed-up
of the cache and of int8 over fp32, checks that cached and uncached search produce the same translations, and
says how many int8 translations equal the fp32 ones (with --references, the BLEU of each: use a validation set).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mt.config import DecodeConfig  # noqa: E402
from mt.data import files  # noqa: E402
from mt.decode.batched import translate_ids  # noqa: E402
from mt.evaluate.report import score  # noqa: E402
from mt.model import saved  # noqa: E402
from mt.runtime import keep_freed_memory_in_the_heap  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--input", default=str(ROOT.parent / "shared/data/multi30k/test_2016_flickr.en.gz"))
    ap.add_argument("--references", help="reference file of --input: BLEU of fp32 vs int8 decoding")
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    keep_freed_memory_in_the_heap()  # as translate.py does
    model, vocabs = saved.build_model(saved.load(args.checkpoint))
    model.eval()
    lines = list(files.read_lines(Path(args.input)))[: args.limit]
    src_ids = vocabs.src.encode_batch(lines)
    configs = {}
    for name, k in (("greedy", 1), ("beam 5", 5)):
        for variant, cache, quantize in (("cached", True, "none"), ("uncached", False, "none"), ("int8", True, "int8")):
            configs[f"{name} {variant}"] = DecodeConfig(
                beam_size=k, use_cache=cache, length_penalty=1.0, quantize=quantize
            )
    times: dict[str, list[float]] = {k: [] for k in configs}
    outputs: dict[str, list] = {}
    for _ in range(args.repeats):
        for name, cfg in configs.items():
            start = time.perf_counter()
            hyps = translate_ids(model, src_ids, cfg, torch.device("cpu"), None)
            times[name].append(time.perf_counter() - start)
            outputs[name] = [h[0].tokens for h in hyps]
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.checkpoint}: {model.cfg.name} ({n_params / 1e6:.1f}M parameters), {len(lines)} sentences of "
        f"{Path(args.input).name}, {torch.get_num_threads()} threads, {args.repeats} repeats"
    )
    print(f"{'search':<20}{'sentences/s median [min..max]':>34}{'vs uncached':>13}{'vs fp32 cached':>16}")
    for name in configs:
        rates = [len(lines) / t for t in times[name]]
        k = name.rsplit(" ", 1)[0]
        vs = [statistics.median(times[f"{k} {ref}"]) / statistics.median(times[name]) for ref in ("uncached", "cached")]
        print(
            f"{name:<20}{statistics.median(rates):>16.1f} [{min(rates):.1f}..{max(rates):.1f}]"
            f"{vs[0]:>12.2f}x{vs[1]:>15.2f}x"
        )
    refs = list(files.read_lines(Path(args.references)))[: args.limit] if args.references else None
    for k in ("greedy", "beam 5"):
        same = outputs[f"{k} cached"] == outputs[f"{k} uncached"]
        agree = sum(a == b for a, b in zip(outputs[f"{k} cached"], outputs[f"{k} int8"]))
        line = f"{k}: cached and uncached translations identical: {same}; int8 equal to fp32: {agree}/{len(lines)}"
        if refs is not None:
            bleu = {v: score(vocabs.tgt.decode_batch(outputs[f"{k} {v}"]), refs)["bleu"] for v in ("cached", "int8")}
            line += f"; BLEU fp32 {bleu['cached']:.2f}, int8 {bleu['int8']:.2f}"
        print(line)


if __name__ == "__main__":
    main()
