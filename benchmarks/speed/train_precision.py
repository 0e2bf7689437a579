"""Training-step throughput of this project's Transformer on real Multi30k batches: fp32 vs bf16 autocast, and
the trainer's fused output projection + loss vs projecting to logits first.

    python benchmarks/speed/train_precision.py [--model transformer_small] [--max-tokens 4096] [--steps 20]

A step is what the trainer does per update: forward, label-smoothed loss, backward, clip, Adam. Batches come from
the token-bucket sampler over Multi30k train with an 8k joint BPE. The systems are interleaved step by step (same
batches, same process) so machine noise hits all alike; the table gives median [min..max] target tokens/s.
"fp32, logits then loss" is the trainer before `mt.model.loss.projected_label_smoothed_loss`: the (N, V) logits of the
non-padding targets, then `label_smoothed_loss`.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import datasets
import torch
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.speed.reference_loss import label_smoothed_loss  # noqa: E402
from mt.config import register_configs  # noqa: E402
from mt.config_checks import to_dataclass  # noqa: E402
from mt.data.batching import BatchLoader  # noqa: E402
from mt.data.corpus import make_sampler, prepare_data  # noqa: E402
from mt.data.tokenizer import PAD  # noqa: E402
from mt.model.transformer import Transformer  # noqa: E402


def multi30k_batches(model: str, max_tokens: int, n: int):
    """(config, corpus, the first n batches): Multi30k train with the default 8k joint BPE, batched as the trainer
    batches it (token buckets of <= max_tokens padded tokens, seed 1), for the model preset `model`."""
    datasets.disable_progress_bars()
    logging.basicConfig(level=logging.WARNING)
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = to_dataclass(compose("config", overrides=[f"model={model}", "run_dir=x"]))
    corpus = prepare_data(cfg, Path(tempfile.mkdtemp()), cfg.model.max_positions)
    sampler = make_sampler(corpus.train_lengths, max_tokens, seed=1, shuffle=True)
    return cfg, corpus, list(BatchLoader(corpus.train.select_columns(["src_ids", "tgt_ids"]), sampler))[:n]


def print_rates(rates: dict[str, list[float]], reference: str) -> None:
    """The table of target tokens/s per system, median [min..max], and each median's ratio to `reference`'s."""
    print(f"{'system':<24}{'target tokens/s median [min..max]':>36}{'vs ' + reference:>10}")
    base = statistics.median(rates[reference])
    for name, r in rates.items():
        med = statistics.median(r)
        print(f"{name:<24}{med:>14.0f} [{min(r):.0f}..{max(r):.0f}]{'':>6}{med / base:>9.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="transformer_small")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    cfg, corpus, batches = multi30k_batches(args.model, args.max_tokens, args.steps + args.warmup)

    systems = {}
    for name, dtype, fused in (
        ("fp32", None, True),
        ("fp32, logits then loss", None, False),
        ("bf16 autocast", torch.bfloat16, True),
    ):
        torch.manual_seed(0)
        model = Transformer(cfg.model, len(corpus.vocabs.src), len(corpus.vocabs.tgt))
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=True)
        systems[name] = (model, opt, dtype, fused)

    def step(model, opt, dtype, fused, b) -> None:
        model.train()
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            if fused:  # as the trainer
                loss, _ = model.loss(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, 0.1)
            else:
                wanted = b.tgt_out.ne(PAD)
                loss, _ = label_smoothed_loss(model(b.src, b.src_pad_mask, b.tgt_in, wanted), b.tgt_out[wanted], 0.1)
        (loss / b.n_tgt_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    rates: dict[str, list[float]] = {k: [] for k in systems}
    for i, b in enumerate(batches):
        for name, (model, opt, dtype, fused) in systems.items():
            t = time.perf_counter()
            step(model, opt, dtype, fused, b)
            if i >= args.warmup:
                rates[name].append(b.n_tgt_tokens / (time.perf_counter() - t))
    n_params = sum(p.numel() for p in systems["fp32"][0].parameters())
    print(
        f"model {args.model} ({n_params / 1e6:.1f}M parameters), batches of <= {args.max_tokens} padded tokens, "
        f"{args.steps} timed steps, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print_rates(rates, "fp32")


if __name__ == "__main__":
    main()
