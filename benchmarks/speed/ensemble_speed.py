"""BLEU and speed of an ensemble against each of its models alone, on real text.

    python benchmarks/speed/ensemble_speed.py RUN_A RUN_B [...] [--split test_2016_flickr] [--threads 2] [--repeats 3]

The models are loaded as `translate.py checkpoint=[RUN_A,RUN_B]` loads them (`mt.decode.loading.load_ensemble`: one
shared tokenizer, the mean of the models' log-probabilities at every step), then every decoder (each model alone, the
ensemble) translates the same source ids of the split, greedy and with the first run's own beam settings, the
configurations interleaved in each repeat. sentences/s is ids in, hypotheses out (median [min..max] of the repeats),
BLEU is sacreBLEU of the detokenized output against the raw references.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import datasets
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mt.config import DataConfig, DecodeConfig  # noqa: E402
from mt.data import read  # noqa: E402
from mt.decode.batched import translate_ids  # noqa: E402
from mt.decode.loading import load_ensemble  # noqa: E402
from mt.errors import USER_ERRORS  # noqa: E402
from mt.evaluate.report import score  # noqa: E402
from mt.model import saved  # noqa: E402
from mt.runtime import keep_freed_memory_in_the_heap  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+", help="two or more run dirs or .pt files of one language pair")
    ap.add_argument("--split", default="test_2016_flickr", help="a split of the first run's data config")
    ap.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if len(args.checkpoints) < 2:
        ap.error("give two or more checkpoints")
    torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    keep_freed_memory_in_the_heap()  # as translate.py does
    cpu = torch.device("cpu")
    try:  # a missing run, models of another vocabulary, an unknown split: one line, as translate.py answers
        ckpts = [saved.load(path) for path in args.checkpoints]
        ensemble, vocabs, _ = load_ensemble(ckpts, DecodeConfig(), "fp32", cpu)
        split = read.drop_empty(read.load_split(DataConfig(**ckpts[0]["config"]["data"]), args.split), args.split)
    except USER_ERRORS as e:
        sys.exit(f"error: {e}")
    if args.limit:
        split = split.select(range(min(args.limit, len(split))))
    src, refs = list(split["src"]), list(split["tgt"])
    src_ids = vocabs.src.encode_batch(src)
    beam = replace(DecodeConfig(**ckpts[0]["config"]["decode"]), nbest=1)
    searches = {"greedy": replace(beam, beam_size=1), f"beam {beam.beam_size}": beam}

    decoders = {f"#{i} {p} alone": m for i, (p, m) in enumerate(zip(args.checkpoints, ensemble.members), 1)}
    decoders[f"ensemble of {len(ckpts)}"] = ensemble
    for model in decoders.values():  # untimed: first-call set-up (thread pools, allocations)
        translate_ids(model, src_ids[:8], replace(beam, max_len_a=0.0, max_len_b=5), cpu, None)
    seconds = {(d, s): [] for d in decoders for s in searches}
    outputs = {}
    for _ in range(args.repeats):
        for search_name, cfg in searches.items():
            for name, model in decoders.items():
                start = time.perf_counter()
                hyps = translate_ids(model, src_ids, cfg, cpu, None)
                seconds[name, search_name].append(time.perf_counter() - start)
                outputs[name, search_name] = [h[0].tokens for h in hyps]

    sizes = ", ".join(f"{m.cfg.name} {sum(p.numel() for p in m.parameters()):,}" for m in ensemble.members)
    print(f"{len(ckpts)} models ({sizes}); {len(src)} sentences of {args.split}, {args.threads} threads, "
          f"{args.repeats} repeats, beam settings of {args.checkpoints[0]}: length penalty "
          f"{beam.length_penalty_type} {beam.length_penalty:g}; torch {torch.__version__}")  # fmt: skip
    print("| decoder | search | BLEU (lowercased) | BLEU | chrF | sentences/s, median [min..max] |")
    print("|---|---|---|---|---|---|")
    for search_name in searches:
        for name in decoders:
            s = score(vocabs.tgt.decode_batch(outputs[name, search_name]), refs)
            rates = [len(src) / t for t in seconds[name, search_name]]
            print(f"| {name} | {search_name} | {s['bleu_lowercase']:.2f} | {s['bleu']:.2f} | {s['chrf']:.2f} | "
                  f"{statistics.median(rates):.1f} [{min(rates):.1f}..{max(rates):.1f}] |")  # fmt: skip


if __name__ == "__main__":
    main()
