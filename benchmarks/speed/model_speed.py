"""Training and beam-search speed of model presets side by side, on real Multi30k batches.

    python benchmarks/speed/model_speed.py                       # transformer_compact vs the deep/shallow one
    python benchmarks/speed/model_speed.py --models transformer_compact,transformer_small --steps 40

Each preset is the En->De recipe (`+experiment=multi30k_en_de`) with `model=NAME`: the same 8k BPE, the same
length-bucketed batches of the recipe's `max_tokens` (the first `--steps` of epoch 1, in order), fp32, the
recipe's dropout. Training: one `Trainer.train_step` per batch (forward, loss, backward, clip, Adam), the presets
interleaved batch by batch so that machine noise hits them alike; target tokens/s, median over the steps after
`--warmup`. Decoding: beam 5 over the first `--sentences` val sentences in the recipe's decoding batches, each
output forced to the source's length + 1 (`max_len_a=1, max_len_b=1`, `min_len` beyond it), so that untrained
models decode as many tokens as each other and as a trained one roughly does; sentences/s, median of
`--repeats`, interleaved. Prints both side by side with ratios to the first preset.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402

from mt.config import register_configs  # noqa: E402
from mt.config_checks import to_dataclass  # noqa: E402
from mt.data.corpus import prepare_data  # noqa: E402
from mt.decode.batched import translate_ids  # noqa: E402
from mt.train.trainer import Trainer  # noqa: E402


def recipe(model: str, run_dir: Path):
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        overrides = ["+experiment=multi30k_en_de", f"model={model}", "train.precision=fp32", "train.device=cpu",
                     "train.progress=false", "train.tensorboard=false", f"run_dir={run_dir}"]  # fmt: skip
        return to_dataclass(compose("config", overrides=overrides))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="transformer_compact,transformer_compact_deep_shallow")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    names = args.models.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="model_speed-"))
    trainers = {}
    for name in names:
        cfg = recipe(name, tmp / name)
        (tmp / name).mkdir(parents=True)
        trainers[name] = Trainer(cfg, prepare_data(cfg, tmp / name, cfg.model.max_positions), tmp / name)
    first = trainers[names[0]]
    batches = [b for _, b in zip(range(args.steps), iter(first.loader))]
    n_params = {n: sum(p.numel() for p in t.model.parameters()) for n, t in trainers.items()}

    speed = {n: [] for n in names}
    for i, batch in enumerate(batches):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            trainer.train_step([batch])
            if i >= args.warmup:
                speed[name].append(batch.n_tgt_tokens / (time.perf_counter() - start))

    valid = first.corpus.valid.select(range(min(args.sentences, len(first.corpus.valid))))
    src_ids = [list(s) for s in valid["src_ids"]]
    decode = replace(first.cfg.decode, beam_size=5, max_len_a=1.0, max_len_b=1, min_len=10_000)
    sent_s = {n: [] for n in names}
    for _ in range(args.repeats):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            translate_ids(trainer.model, src_ids, decode, trainer.device, None)
            sent_s[name].append(len(src_ids) / (time.perf_counter() - start))

    base_train, base_dec = statistics.median(speed[names[0]]), statistics.median(sent_s[names[0]])
    print(
        f"{torch.get_num_threads()} threads; {len(speed[names[0]])} training steps of real batches "
        f"(recipe max_tokens {first.tc.max_tokens}); beam 5 over {len(src_ids)} val sentences, forced lengths"
    )
    print("| model | layers enc+dec | parameters | train target tokens/s, median [min..max] | ratio | "
          "beam-5 sentences/s, median [min..max] | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, t in trainers.items():
        tr, dec, m = speed[name], sent_s[name], t.cfg.model
        train = f"{statistics.median(tr):,.0f} [{min(tr):,.0f}..{max(tr):,.0f}]"
        beam = f"{statistics.median(dec):.1f} [{min(dec):.1f}..{max(dec):.1f}]"
        ratios = statistics.median(tr) / base_train, statistics.median(dec) / base_dec
        print(f"| {name} | {m.encoder_layers}+{m.decoder_layers} | {n_params[name] / 1e6:.2f}M | {train} | "
              f"{ratios[0]:.2f}x | {beam} | {ratios[1]:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
