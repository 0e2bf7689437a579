"""The training loss, forward + backward: this project's versions vs the plain ones, on recipe-shaped tensors.

    python benchmarks/speed/loss.py [--tokens 2400] [--dim 128] [--vocab 8000] [--repeats 20] [--chunks 64,256,1024]

1. Label-smoothed cross-entropy from logits: `label_smoothed_loss` (benchmarks/speed/reference_loss.py, closed-form
   backward) vs the same formula left to autograd (log-softmax, gather, mean over the vocabulary, masked sum), which
   is what the
   trainer ran before. Random fp32 logits (N tokens, V types).
2. Output projection + that loss: projecting the decoder states to logits, then `label_smoothed_loss` (what the
   trainer did before) vs `mt.model.loss.projected_label_smoothed_loss`, which does both a chunk of rows at a time,
   for each chunk size given. Random states (N, D) and a weight (V, D) scaled like the model's.

The shapes default to one update of the Multi30k recipe (2,500-token batches, d_model 128, 8k joint BPE; the
trainer projects non-padding targets only). Systems are interleaved call by call; prints the median [min..max]
milliseconds per forward + backward, the speed-up over the reference and the largest gradient difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.speed.reference_loss import label_smoothed_loss  # noqa: E402
from mt.data.tokenizer import PAD  # noqa: E402
from mt.model.loss import projected_label_smoothed_loss  # noqa: E402


def autograd_reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1)
    smooth = -logp.mean(dim=-1)
    return ((1 - eps) * nll + eps * smooth).masked_fill(target.eq(PAD), 0.0).sum()


def compare(title: str, inputs: list[torch.Tensor], systems: dict[str, Callable], repeats: int) -> None:
    """Times loss_fn(*inputs).backward() for each system (the first is the reference); prints one table."""
    grads, times = {}, {name: [] for name in systems}
    for i in range(repeats + 2):
        for name, loss_fn in systems.items():
            xs = [x.clone().requires_grad_() for x in inputs]
            t = time.perf_counter()
            loss_fn(*xs).backward()
            if i >= 2:  # warm-up calls are not timed
                times[name].append((time.perf_counter() - t) * 1e3)
            grads[name] = [x.grad for x in xs]
    ref_name = next(iter(systems))
    ref = statistics.median(times[ref_name])
    print(f"\n{title}")
    print(f"{'system':<44}{'ms per forward+backward':>28}{'speed-up':>10}{'max |grad diff|':>17}")
    for name, ms in times.items():
        med = statistics.median(ms)
        diff = max((g - r).abs().max().item() for g, r in zip(grads[name], grads[ref_name]))
        print(f"{name:<44}{med:>12.1f} [{min(ms):.1f}..{max(ms):.1f}]{'':>2}{ref / med:>9.2f}x{diff:>17.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2400)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--chunks", default="64,256,1024", help="row chunks of the fused projection + loss")
    args = ap.parse_args()
    torch.manual_seed(0)
    n, d, v = args.tokens, args.dim, args.vocab
    target = torch.randint(4, v, (n,))
    print(
        f"N {n} tokens, D {d}, V {v}, fp32, {args.repeats} timed calls each, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )

    compare(
        f"1. label-smoothed loss on logits ({n}, {v})",
        [torch.randn(n, v) * 4],
        {
            "autograd reference": lambda x: autograd_reference(x, target, 0.1),
            "closed-form backward (label_smoothed_loss)": lambda x: label_smoothed_loss(x, target, 0.1)[0],
        },
        args.repeats,
    )
    fused = {
        f"fused, chunks of {c} rows": (lambda h, w, c=c: projected_label_smoothed_loss(h, w, target, 0.1, c)[0])
        for c in map(int, args.chunks.split(","))
    }
    compare(
        f"2. output projection ({n}, {d}) x ({d}, {v}) + label-smoothed loss",
        [torch.randn(n, d), torch.randn(v, d) * d**-0.5],
        {"project, then label_smoothed_loss": lambda h, w: label_smoothed_loss(h @ w.t(), target, 0.1)[0], **fused},
        args.repeats,
    )


if __name__ == "__main__":
    main()
