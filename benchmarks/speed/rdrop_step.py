"""What an R-Drop update costs (`train.rdrop_alpha`): training-step throughput on real Multi30k batches, against
the plain step and against the plain step on the batch stacked twice (R-Drop's inherent price: two passes).

    python benchmarks/speed/rdrop_step.py [--model transformer_compact] [--max-tokens 2500] [--steps 20] [--alpha 3]

Systems, each its own model and Adam, interleaved step by step on the same batches (machine noise hits all alike):

- plain: `Transformer.loss`, what a run without R-Drop computes;
- plain, batch twice: the same on every batch stacked twice, the ideal cost of R-Drop's two passes;
- R-Drop, fused: `mt.train.regularize.rdrop_loss`, the trainer's (`mt.model.loss.projected_rdrop_loss`);
- R-Drop, full logits: the trainer's before it (`benchmarks/reference_loss.rdrop_loss_from_logits`).

A step is forward, loss, backward, clipping and Adam, in fp32 (the recipe's precision on a CPU). The defaults are
the En->De recipe's (conf/experiment/multi30k_en_de.yaml: transformer_compact, dropout 0.2, 2,500-token batches)
and the rdrop trial's alpha. Prints target tokens/s (each batch's targets counted once) median [min..max] and the
ratio to plain.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.speed.reference_loss import rdrop_loss_from_logits  # noqa: E402
from benchmarks.speed.train_precision import multi30k_batches, print_rates  # noqa: E402
from mt.model.transformer import Transformer  # noqa: E402
from mt.train.regularize import rdrop_loss  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="transformer_compact")
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--max-tokens", type=int, default=2500)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=3.0)
    args = ap.parse_args()
    cfg, corpus, batches = multi30k_batches(args.model, args.max_tokens, args.steps + args.warmup)
    cfg.model.dropout = args.dropout
    eps, alpha = 0.1, args.alpha

    def twice(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t], dim=0)

    losses = {
        "plain": lambda m, b: m.loss(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, eps)[0],
        "plain, batch twice": lambda m, b: m.loss(*map(twice, (b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)), eps)[0],
        "R-Drop, fused": lambda m, b: rdrop_loss(m, b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, eps, alpha)[0],
        "R-Drop, full logits": lambda m, b: rdrop_loss_from_logits(
            m, b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, eps, alpha
        )[0],
    }
    systems = {}
    for name in losses:
        torch.manual_seed(0)
        model = Transformer(cfg.model, len(corpus.vocabs.src), len(corpus.vocabs.tgt)).train()
        systems[name] = (model, torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), foreach=True))

    rates: dict[str, list[float]] = {name: [] for name in systems}
    for i, b in enumerate(batches):
        for name, (model, opt) in systems.items():
            t = time.perf_counter()
            (losses[name](model, b) / b.n_tgt_tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= args.warmup:
                rates[name].append(b.n_tgt_tokens / (time.perf_counter() - t))
    print(
        f"model {args.model}, dropout {args.dropout}, batches of <= {args.max_tokens} padded tokens, alpha {alpha}, "
        f"{args.steps} timed steps, fp32, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print_rates(rates, "plain")


if __name__ == "__main__":
    main()
