"""Training-step throughput side by side: this project vs torch.nn.Transformer vs Hugging Face MarianMTModel.

    pip install -e ".[bench]"
    python benchmarks/peers/train_peers.py --shape small [--dtypes fp32,bf16] [--steps 8]
    python benchmarks/peers/train_peers.py --shape base
    python benchmarks/peers/train_peers.py --shape small --dtypes fp32 --compile   # this project under torch.compile
    python benchmarks/peers/train_peers.py --shape base --dtypes fp32 --profile    # then where a step's time goes
    python benchmarks/peers/train_peers.py --shape small --peers joeynmt,eole,fairseq --rounds 3   # the NMT toolkits

With --peers, this project and each toolkit run in their own processes and virtual environments
(benchmarks/peers/peer_steps.py, which says what a toolkit's step is), alternating in rounds; the toolkits' venvs
are the ones benchmarks/peers/<peer>/run.sh makes.

One step = forward + label-smoothed cross-entropy + backward + Adam. The peers project every position to logits and
take `label_smoothed_loss` (benchmarks/speed/reference_loss.py); this project runs its trainer's `TrainingLoss` (non-
padding targets only, output projection fused with the same loss, `mt.model.loss`), which gives the same loss and
gradients. On random batches of ~4,000 target tokens with lengths 10-30 and an 8,000-type tied vocabulary. All
systems have the same shape (post-norm, ReLU, dropout 0.1, three-way tied embeddings), see the same batches and are
interleaved step by step in one process, so machine noise hits all alike. Prints target tokens/s median [min..max],
ratios to each peer, and model FLOP/s as a share of the measured matmul peak of the same dtype. `--profile` then
profiles two steps of this project and of HF Marian (torch.profiler, top operators by self CPU time, and the share
spent in matmuls, which bounds what any implementation can gain at a given matmul speed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.peers.peer_steps import SYSTEMS, random_batches, this_project_model  # noqa: E402
from benchmarks.speed.reference_loss import label_smoothed_loss  # noqa: E402
from benchmarks.speed.shapes import SHAPES, VOCAB  # noqa: E402
from mt.model.transformer import sinusoidal_positions  # noqa: E402
from mt.train.trainer import TrainingLoss  # noqa: E402

V, PAD, BOS = VOCAB, 0, 2


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with a scaled, tied embedding, sinusoidal positions and a tied output projection."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(V, d_model, padding_idx=PAD)
        self.register_buffer("pe", sinusoidal_positions(512, d_model), persistent=False)
        self.core = nn.Transformer(d_model, n_heads, layers, layers, d_ff, dropout=0.1, batch_first=True)
        self.core.encoder.norm, self.core.decoder.norm = None, None  # post-norm as in the paper
        self.scale, self.drop = math.sqrt(d_model), nn.Dropout(0.1)

    def emb(self, x):
        return self.drop(self.embed(x) * self.scale + self.pe[: x.size(1)])

    def forward(self, src, src_pad, tgt_in):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), dtype=torch.bool)
        h = self.core(
            self.emb(src),
            self.emb(tgt_in),
            tgt_mask=mask,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return h @ self.embed.weight.t()


def marian(d_model: int, n_heads: int, d_ff: int, layers: int) -> nn.Module:
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=V,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=n_heads,
        decoder_attention_heads=n_heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        activation_function="relu",
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=512,
        pad_token_id=PAD,
        eos_token_id=3,
        decoder_start_token_id=BOS,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    model = MarianMTModel(cfg)

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, src, src_pad, tgt_in):
            return self.m(input_ids=src, attention_mask=(~src_pad).long(), decoder_input_ids=tgt_in).logits

    return Wrapped()


ours = this_project_model


def train_step(name: str, model: nn.Module, opt: torch.optim.Optimizer, dtype: torch.dtype | None, batch: tuple):
    src, src_pad, tgt_in, tgt_out, n_tok = batch
    model.train()
    with torch.autocast(src.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        if name.startswith("this project"):  # as its trainer runs
            loss, _ = model(src, src_pad, tgt_in, tgt_out)
        else:
            loss, _ = label_smoothed_loss(model(src, src_pad, tgt_in), tgt_out, 0.1)
    (loss / n_tok).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmm_", "aten::_addmm_activation"}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(dtype: torch.dtype, device: torch.device) -> float:
    n = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    for _ in range(2):
        a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(5):
        a @ b
    sync(device)
    return 2 * n**3 * 5 / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="small")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--compile", action="store_true", help="also time this project's model under torch.compile")
    ap.add_argument("--profile", action="store_true", help="then profile this project's and HF Marian's steps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (then shapes base/big, bf16, >= 25,000 tokens)")
    ap.add_argument("--peers", help="toolkits to compare instead, in their own venvs: e.g. joeynmt,eole,fairseq")
    ap.add_argument("--rounds", type=int, default=3, help="with --peers: rounds, each running every system once")
    ap.add_argument("--threads", type=int, default=2, help="with --peers: threads per system")
    args = ap.parse_args()
    if args.peers:
        return toolkits(args)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # what the trainer enables for fp32 on CUDA
    shape = SHAPES[args.shape]
    builders = {"this project": ours, "torch.nn.Transformer": TorchTransformer, "HF Marian": marian}
    if importlib.util.find_spec("transformers") is None:  # the GPU kit ships it; an image without it still measures
        print("HF Marian: skipped (transformers is not installed: pip install -e '.[bench]')")
        del builders["HF Marian"]
    if args.compile:
        builders["this project compiled"] = ours
    dtypes = {"fp32": None, "bf16": torch.bfloat16}
    systems = {}
    for dname in args.dtypes.split(","):
        for name, build in builders.items():
            torch.manual_seed(0)
            model = build(**shape).to(device)
            fused = dict(fused=True) if device.type == "cuda" else dict(foreach=True)  # as the trainer picks
            opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, **fused)
            if name.startswith("this project"):  # the trainer's loss module (what it compiles when asked to)
                objective = TrainingLoss(model, 0.1)
                model = torch.compile(objective) if name.endswith("compiled") else objective
            systems[(name, dname)] = (model, opt, dtypes[dname])
    batches = [
        tuple(x.to(device) if torch.is_tensor(x) else x for x in b)
        for b in random_batches(args.steps + args.warmup, args.tokens)
    ]
    rates: dict[tuple, list[float]] = {k: [] for k in systems}
    for i, batch in enumerate(batches):
        for key, system in systems.items():
            sync(device)
            t = time.perf_counter()
            train_step(key[0], *system, batch)
            sync(device)
            if i >= args.warmup:
                rates[key].append(batch[-1] / (time.perf_counter() - t))
    n_params = sum(p.numel() for p in systems[("this project", args.dtypes.split(",")[0])][0].parameters())
    # Model FLOPs per target token: 6 x parameters touched (forward 2, backward 4); source ~ target length.
    flops_per_token = 6 * n_params
    peaks = {d: matmul_peak(torch.float32 if d == "fp32" else torch.bfloat16, device) for d in args.dtypes.split(",")}
    print(
        f"shape {args.shape} {shape}, vocab {V} tied, {n_params / 1e6:.1f}M parameters, batches of ~{args.tokens} "
        f"target tokens (lengths 10-30), {args.steps} timed steps, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name() if device.type == 'cuda' else f'{torch.get_num_threads()} threads'}"
    )
    print(
        f"matmul peak ({'8192' if device.type == 'cuda' else '2048'}^3): "
        + ", ".join(f"{d} {p / 1e9:.0f} GFLOP/s" for d, p in peaks.items())
    )
    header = f"{'system':<22}{'dtype':<6}{'target tok/s median [min..max]':>34}{'% of peak':>11}"
    peers = [n for n in builders if not n.startswith("this project")]
    print(header + "".join(f"{'vs ' + n:>24}" for n in peers))
    for (name, dname), r in rates.items():
        med = statistics.median(r)
        pct = 100 * med * flops_per_token / peaks[dname]
        line = f"{name:<22}{dname:<6}{med:>16.0f} [{min(r):.0f}..{max(r):.0f}]{pct:>10.1f}%"
        if name.startswith("this project"):
            for peer in peers:
                line += f"{med / statistics.median(rates[(peer, dname)]):>23.2f}x"
        print(line)
    if args.profile:
        dname, profiled = args.dtypes.split(",")[0], batches[:2]
        for name in [n for n in ("this project", "HF Marian") if n in builders]:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=acts) as prof:
                for batch in profiled:
                    train_step(name, *systems[(name, dname)], batch)
                sync(device)
            events = prof.key_averages()
            # time where the work happens: the GPU's kernels on CUDA, the CPU's operators otherwise
            timed = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
            # On CUDA each kernel's time shows twice: in the operator that launched it and in the kernel's own row.
            ops = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
            total = sum(getattr(e, timed) for e in ops)
            share = 100 * sum(getattr(e, timed) for e in ops if e.key in MATMULS) / max(total, 1)
            print(f"\nprofile, {name} {dname}, {len(profiled)} steps: {share:.1f}% of {timed} in matmuls")
            print(events.table(sort_by=timed, row_limit=14))


def toolkits(args) -> None:
    """--peers: this project and each toolkit in its own process and virtual environment
    (benchmarks/peers/peer_steps.py), alternating in rounds (the order reversed every other round) so that drift
    in the machine's speed hits all."""
    pythons = {"this project": sys.executable}
    for peer in args.peers.split(","):
        if peer not in SYSTEMS or peer == "this project":
            sys.exit(f"error: --peers: unknown toolkit {peer!r}; known: {', '.join(list(SYSTEMS)[1:])}")
        python = ROOT / "benchmarks" / "peers" / peer / ".venv" / "bin" / "python"
        if python.exists():
            pythons[peer] = str(python)
        else:
            print(f"{peer}: skipped ({python} is missing: bash benchmarks/peers/{peer}/run.sh installs it)")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    results: dict[str, dict] = {}
    for r in range(args.rounds):
        for name, python in list(pythons.items())[:: 1 if r % 2 == 0 else -1]:
            steps = ROOT / "benchmarks" / "peers" / "peer_steps.py"
            cmd = [python, str(steps), "--system", name, "--shape", args.shape]
            cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--tokens", str(args.tokens)]
            run = subprocess.run(cmd + ["--threads", str(args.threads)], capture_output=True, text=True, env=env)
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["no output"])[-1]
                sys.exit(f"error: {name} (round {r + 1}): benchmarks/peers/peer_steps.py failed: {last}")
            out = json.loads(run.stdout.strip().splitlines()[-1])
            entry = results.setdefault(name, dict(out, rates=[]))
            entry["rates"] += out["rates"]
    ours_median = statistics.median(results["this project"]["rates"])
    print(
        f"shape {args.shape} {SHAPES[args.shape]}, vocab {V} tied, fp32, batches of ~{args.tokens} target tokens "
        f"(lengths 10-30), {args.rounds} rounds x {args.steps} timed steps, {args.threads} threads per system"
    )
    print(
        f"{'system':<14}{'params':>12}{'first loss':>12}{'target tok/s median [min..max]':>34}{'this project vs':>17}"
    )
    for name, res in results.items():
        med, rates = statistics.median(res["rates"]), res["rates"]
        ratio = "" if name == "this project" else f"{ours_median / med:.2f}x"
        print(
            f"{name:<14}{res['params']:>12,}{res['first_loss']:>12.2f}{med:>16.0f} [{min(rates):.0f}..{max(rates):.0f}]"
            f"{ratio:>17}"
        )


if __name__ == "__main__":
    main()
