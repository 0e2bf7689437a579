"""Training-step throughput with glibc malloc's defaults vs `keep_freed_memory_in_the_heap()` (what train.py sets).

    python benchmarks/speed/allocator.py [--model transformer_compact] [--max-tokens 2500] [--steps 15] [--rounds 2]

malloc settings are per process, so each measurement is a child process: the same real Multi30k batches (token
buckets over train, 8k joint BPE, the recipe's 2,500 tokens), the same seed, forward + label-smoothed loss +
backward + clip + Adam as the trainer. Children alternate (default, tuned, default, tuned, ...) so machine noise
hits both alike. Prints target tokens/s median [min..max] over all timed steps, and the share of the children's
CPU time spent in the kernel (page faults for freshly mapped memory show up there).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import datasets
import torch
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mt.config import register_configs  # noqa: E402
from mt.config_checks import to_dataclass  # noqa: E402
from mt.data.batching import BatchLoader  # noqa: E402
from mt.data.corpus import make_sampler, prepare_data  # noqa: E402
from mt.model.transformer import Transformer  # noqa: E402
from mt.runtime import keep_freed_memory_in_the_heap  # noqa: E402


def load(model: str, data_dir: Path):
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = to_dataclass(compose("config", overrides=[f"model={model}", "run_dir=x"]))
    return cfg, prepare_data(cfg, data_dir, cfg.model.max_positions)  # the second call reuses BPE and cache


def child(args) -> None:
    if args.child == "tuned" and not keep_freed_memory_in_the_heap():
        raise SystemExit("keep_freed_memory_in_the_heap() did not take (not glibc?)")
    cfg, corpus = load(args.model, Path(args.data_dir))
    sampler = make_sampler(corpus.train_lengths, args.max_tokens, seed=1, shuffle=True)
    batches = list(BatchLoader(corpus.train.select_columns(["src_ids", "tgt_ids"]), sampler))[: args.steps + 3]
    torch.manual_seed(0)
    model = Transformer(cfg.model, len(corpus.vocabs.src), len(corpus.vocabs.tgt)).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    rates, before = [], None
    for i, b in enumerate(batches):
        if i == 3:  # three warm-up steps
            before = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        loss, _ = model.loss(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, 0.1)
        (loss / b.n_tgt_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 3:
            rates.append(b.n_tgt_tokens / (time.perf_counter() - t))
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    print(json.dumps({"rates": rates, "user_s": user, "sys_s": system}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="transformer_compact")
    ap.add_argument("--max-tokens", type=int, default=2500)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=["default", "tuned"], help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    datasets.disable_progress_bars()
    logging.basicConfig(level=logging.WARNING)
    if args.child:
        return child(args)

    data_dir = tempfile.mkdtemp()
    load(args.model, Path(data_dir))  # BPE and tokenized cache, once, for every child
    runs: dict[str, list[dict]] = {"default": [], "tuned": []}
    for _ in range(args.rounds):
        for name in runs:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                name,
                "--data-dir",
                data_dir,
                "--model",
                args.model,
                "--max-tokens",
                str(args.max_tokens),
                "--steps",
                str(args.steps),
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    print(
        f"model {args.model}, batches of <= {args.max_tokens} padded tokens, {args.rounds} x {args.steps} timed "
        f"steps per setting, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"{'malloc':<34}{'target tokens/s median [min..max]':>36}{'kernel share of CPU':>22}{'vs default':>12}")
    base = statistics.median(r for run in runs["default"] for r in run["rates"])
    labels = {"default": "glibc defaults", "tuned": "keep_freed_memory_in_the_heap()"}
    for name, children in runs.items():
        rates = [r for run in children for r in run["rates"]]
        sys_share = sum(c["sys_s"] for c in children) / sum(c["sys_s"] + c["user_s"] for c in children)
        med = statistics.median(rates)
        print(
            f"{labels[name]:<34}{med:>18.0f} [{min(rates):.0f}..{max(rates):.0f}]{sys_share:>21.1%}{med / base:>11.2f}x"
        )


if __name__ == "__main__":
    main()
