"""Label-smoothed cross-entropy, forward + backward: this project's closed-form backward vs plain autograd.

    python benchmarks/loss.py [--tokens 2400] [--vocab 8000] [--repeats 20]

The reference is the same formula left to autograd (log-softmax, gather, mean over the vocabulary, masked sum),
which is what the trainer ran before `mt.training.label_smoothed_loss` got its own backward. Logits are random
fp32 (N tokens, V types) shaped like one update of the Multi30k recipe (2,500-token batches, 8k joint BPE; the
trainer projects non-padding targets only). The two are interleaved call by call; prints the median [min..max]
milliseconds per forward + backward, the ratio, and the largest gradient difference.
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

from mt.tokenizer import PAD  # noqa: E402
from mt.training import label_smoothed_loss  # noqa: E402


def autograd_reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1)
    smooth = -logp.mean(dim=-1)
    return ((1 - eps) * nll + eps * smooth).masked_fill(target.eq(PAD), 0.0).sum()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2400)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    logits = torch.randn(args.tokens, args.vocab) * 4
    target = torch.randint(4, args.vocab, (args.tokens,))

    systems = {
        "closed-form backward (this project)": lambda x: label_smoothed_loss(x, target, 0.1)[0],
        "autograd reference": lambda x: autograd_reference(x, target, 0.1),
    }
    grads, times = {}, {name: [] for name in systems}
    for i in range(args.repeats + 2):
        for name, loss_fn in systems.items():
            x = logits.clone().requires_grad_()
            t = time.perf_counter()
            loss_fn(x).backward()
            if i >= 2:  # warm-up calls are not timed
                times[name].append((time.perf_counter() - t) * 1e3)
            grads[name] = x.grad
    diff = (grads["closed-form backward (this project)"] - grads["autograd reference"]).abs().max().item()
    print(f"logits ({args.tokens}, {args.vocab}) fp32, {args.repeats} timed calls each, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; max |grad difference| {diff:.2e}")  # fmt: skip
    ref = statistics.median(times["autograd reference"])
    print(f"{'loss':<40}{'ms per forward+backward':>30}{'speed-up':>10}")
    for name, ms in times.items():
        med = statistics.median(ms)
        print(f"{name:<40}{med:>14.1f} [{min(ms):.1f}..{max(ms):.1f}]{'':>4}{ref / med:>9.2f}x")


if __name__ == "__main__":
    main()
