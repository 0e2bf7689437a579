"""Fine-tuning and decoding an OPUS-MT-shaped model (MarianMTModel: d 512, 6+6 layers, 8 heads, FFN 2,048, swish,
a 58,101-type shared vocabulary; random weights, built by transformers itself) with this project and with its peers,
side by side on the same inputs, in one process; and the peak memory of fine-tuning it and NLLB-200-distilled-600M's
shape (M2M100: d 1,024, 12+12 layers, 256,206 types).

    pip install -e ".[dev]"
    python benchmarks/speed/hub_speed.py train  [--updates 12] [--max-tokens 4096]
    python benchmarks/speed/hub_speed.py decode [--lines 200]
    python benchmarks/speed/hub_speed.py memory [--shape opus|nllb] [--max-tokens 2048] [--updates 3]

`train`: the same batches (EMEA de-en's training pairs, tokenized by the checkpoint's tokenizer and cut by this
project's batcher at --max-tokens) through this project's trainer (`Trainer.train_step`: the fused loss, Adam, the
lr schedule) and through transformers' `Seq2SeqTrainer` (AdamW, label smoothing 0.1, the same learning rate), the
two interleaved in rounds; target tokens per second of each update after the first two (allocation) of a round.
This project is timed in fp32 and in the precision its trainer picks on this CPU (train.precision=auto).
`decode`: beam 4 with the checkpoint's generation settings over EMEA test lines: this project's search and
transformers' `generate()` (this project's per-line length limit as max_length); random weights write every line to
its limit, so each decoder does the same steps. CTranslate2 is not timed here: called as its users call it (one
`translate_batch`, one length limit) it would decode every line of random weights to the longest line's limit;
benchmarks/speed/export_speed.py times it on a trained model, whose lines end with </s>.
`memory`: a child process fine-tunes --updates updates at --max-tokens and
reports its peak resident memory (ru_maxrss), the model, gradients and Adam's moments included.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DATA = ROOT.parent / "shared" / "data" / "opus_emea_de_en"
HUB_CONFIGS = ROOT.parent / "shared" / "reference" / "hub-configs"


def lines(split: str, lang: str, n: int | None = None) -> list[str]:
    with gzip.open(DATA / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for i, line in enumerate(f) if n is None or i < n]


def build_opus(out: Path) -> Path:
    """An OPUS-MT-shaped MarianMTModel with random weights, its config the published opus-mt-de-en's
    (../shared/reference/hub-configs), and a SentencePiece tokenizer trained on EMEA whose vocab.json is filled to
    the published 58,101 types."""
    import sentencepiece as spm
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    out.mkdir(parents=True)
    text = out / "text.txt"
    text.write_text("\n".join(lines("train", "de") + lines("train", "en")), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(out / "spm"), vocab_size=8000,
                                   character_coverage=1.0, minloglevel=2, num_threads=2)  # fmt: skip
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    config = json.loads((HUB_CONFIGS / "opus-mt-de-en.config.json").read_text())
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    while len(vocab) < config["vocab_size"] - 1:  # the published size: types no EMEA line needs
        vocab[f"\u2581unused{len(vocab)}"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    for name in ("source.spm", "target.spm"):
        shutil.copy(out / "spm.model", out / name)
    for f in ("spm.model", "spm.vocab", "text.txt"):
        (out / f).unlink()
    keys = set(MarianConfig.__dataclass_fields__) if hasattr(MarianConfig, "__dataclass_fields__") else None
    cfg = MarianConfig(**{k: v for k, v in config.items() if keys is None or k in keys})
    torch.manual_seed(0)
    model = MarianMTModel(cfg)
    model.generation_config = GenerationConfig(**json.loads((HUB_CONFIGS / "opus-mt-de-en.generation_config.json")
                                                            .read_text()))  # fmt: skip
    model.save_pretrained(out)
    (out / "tokenizer_config.json").write_text((HUB_CONFIGS / "opus-mt-de-en.tokenizer_config.json").read_text())
    return out


def fine_tuning_batches(path: Path, max_tokens: int, n: int, run_dir: Path):
    """A Trainer over the checkpoint, the run's first `n` batches (this project's batcher over EMEA, the parent's
    tokenizer), and those batches' ids (what transformers is given)."""
    from hydra import compose, initialize_config_dir

    from mt.config import register_configs
    from mt.config_checks import to_dataclass
    from mt.data.corpus import prepare_data, training_batches
    from mt.train import finetune

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        over = ["data=local", f"data.dir={DATA}", "data.src_lang=de", "data.tgt_lang=en", "data.test_splits=[]",
                "data.valid_from_train=100", f"train.init_from={path}", f"train.max_tokens={max_tokens}",
                "train.lr=5e-5", "train.schedule=constant", "train.warmup=0", "train.progress=false",
                "train.tensorboard=false", f"run_dir={run_dir}"]  # fmt: skip
        cfg = to_dataclass(compose(config_name="config", overrides=over))
    parent = finetune.load_parent(cfg, run_dir)
    cfg = finetune.adopt(cfg, parent, over)
    corpus = prepare_data(cfg, run_dir, cfg.model.max_positions, parent.vocabs)
    _, loader, _ = training_batches(corpus, cfg, 1, 0)
    batches = [b for _, b in zip(range(n), loader)]
    return cfg, corpus, parent, batches


def hf_trainer_rates(path: Path, batches, rounds: int, warm: int, pad: int, bf16: bool = False) -> list[float]:
    """Target tokens per second of Seq2SeqTrainer's updates over `batches` (each given whole, as one item)."""
    from transformers import AutoModelForSeq2SeqLM, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

    items = []
    for b in batches:
        labels = b.tgt_out.masked_fill(b.tgt_out.eq(pad), -100)  # transformers' "no target" label
        items.append({"input_ids": b.src, "attention_mask": (~b.src_pad_mask).long(), "labels": labels,
                      "decoder_input_ids": b.tgt_in, "_tokens": int(b.n_tgt_tokens)})  # fmt: skip
    seconds: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            seconds.append(time.perf_counter() - self.start)

    model = AutoModelForSeq2SeqLM.from_pretrained(path)
    with tempfile.TemporaryDirectory() as tmp:
        args = Seq2SeqTrainingArguments(output_dir=tmp, max_steps=len(items) * rounds, per_device_train_batch_size=1,
                                        learning_rate=5e-5, lr_scheduler_type="constant", label_smoothing_factor=0.1,
                                        logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
                                        remove_unused_columns=False, dataloader_num_workers=0,
                                        disable_tqdm=True, bf16=bf16)  # fmt: skip

        def collate(xs):
            return {k: v for k, v in xs[0].items() if k != "_tokens"}

        trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=items * rounds, data_collator=collate,
                                 callbacks=[Clock()])  # fmt: skip
        trainer.train()
    tokens = [it["_tokens"] for it in items] * rounds
    return [t / s for i, (t, s) in enumerate(zip(tokens, seconds)) if i % len(items) >= warm]


def ours_rates(cfg, corpus, parent, batches, rounds: int, warm: int, precision: str, run_dir: Path) -> list[float]:
    from dataclasses import replace

    from mt.train import finetune
    from mt.train.trainer import Trainer

    cfg = replace(cfg, train=replace(cfg.train, precision=precision))
    run_dir.mkdir(parents=True)
    trainer = Trainer(cfg, corpus, run_dir)
    finetune.start(trainer, parent)
    rates = []
    for _ in range(rounds):
        for i, b in enumerate(batches):
            start = time.perf_counter()
            trainer.train_step([b])
            if i >= warm:
                rates.append(b.n_tgt_tokens / (time.perf_counter() - start))
    return rates, trainer.amp


def cmd_train(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = build_opus(Path(tmp) / "opus")
        cfg, corpus, parent, batches = fine_tuning_batches(path, args.max_tokens, args.updates, Path(tmp) / "run")
        tokens = sum(b.n_tgt_tokens for b in batches)
        print(f"{len(batches)} batches of {args.max_tokens} padded tokens, {tokens / len(batches):.0f} target tokens "
              f"each on average; {args.rounds} rounds, the first {args.warm} updates of a round untimed")  # fmt: skip
        pad = parent.model.specials.pad
        rows: dict[str, list[float]] = {}
        for r in range(args.rounds):  # the three interleaved, each round a fresh start from the parent
            fp32 = ours_rates(cfg, corpus, parent, batches, 1, args.warm, "fp32", Path(tmp) / f"r{r}a")[0]
            rows.setdefault("this project, fp32", []).extend(fp32)
            rows.setdefault("transformers Seq2SeqTrainer, fp32", []).extend(
                hf_trainer_rates(path, batches, 1, args.warm, pad)
            )
            auto, amp = ours_rates(cfg, corpus, parent, batches, 1, args.warm, "auto", Path(tmp) / f"r{r}b")
            rows.setdefault(f"this project, train.precision=auto ({amp or 'fp32'})", []).extend(auto)
            if amp == torch.bfloat16:  # the same autocast for transformers (Trainer's bf16=True)
                rows.setdefault("transformers Seq2SeqTrainer, bf16=True", []).extend(
                    hf_trainer_rates(path, batches, 1, args.warm, pad, bf16=True)
                )
        ref = statistics.median(rows["transformers Seq2SeqTrainer, fp32"])
        print("| trainer | target tokens/s, median [min..max] | x transformers |\n|---|---|---|")
        for name, rates in rows.items():
            med = statistics.median(rates)
            print(f"| {name} | {med:,.0f} [{min(rates):,.0f}..{max(rates):,.0f}] | {med / ref:.2f} |")


def cmd_decode(args) -> None:
    from transformers import AutoModelForSeq2SeqLM

    from mt.decode.translator import Translator
    from mt.export.hugging_face import generate_ids

    with tempfile.TemporaryDirectory() as tmp:
        path = build_opus(Path(tmp) / "opus")
        translator = Translator.load(path)
        decode = translator.settings(beam_size=4, max_len_a=1.0, max_len_b=5)
        hf = AutoModelForSeq2SeqLM.from_pretrained(path).eval()
        src = translator.encode_sources(lines("test", "de", args.lines))
        framing = translator.framing()
        systems = {"this project, beam 4": lambda: [h[0].tokens for h in translator.hypotheses(
                       lines("test", "de", args.lines), decode)[1]],
                   "transformers generate(), beam 4": lambda: generate_ids(hf, src, decode,
                                                                           framing=framing)}  # fmt: skip
        times: dict[str, list[float]] = {n: [] for n in systems}
        out_tokens = {}
        for _ in range(args.repeats):
            for name, run in systems.items():
                start = time.perf_counter()
                with torch.inference_mode():
                    out = run()
                times[name].append(time.perf_counter() - start)
                out_tokens[name] = sum(map(len, out))
        ref = statistics.median(times["transformers generate(), beam 4"])
        print(f"{args.lines} EMEA test lines, beam 4, length limit 1.0 x source + 5, random weights (every line "
              "to its limit)")  # fmt: skip
        print("| decoder | sentences/s | output tokens/s | x transformers |\n|---|---|---|---|")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"| {name} | {args.lines / med:.1f} | {out_tokens[name] / med:,.0f} | {ref / med:.2f} |")


def cmd_memory(args) -> None:
    if args.child:
        return memory_child(args)
    for max_tokens in args.max_tokens:
        child = ["memory", "--child", "--shape", args.shape, "--max-tokens", str(max_tokens), "--updates",
                 str(args.updates)]  # fmt: skip
        p = subprocess.run([sys.executable, __file__, *child], capture_output=True, text=True)
        print(p.stdout.strip() or p.stderr[-2000:])


def memory_child(args) -> None:
    """Fine-tune `--updates` updates of the shape at one batch size and print the peak RSS."""
    from mt.config import TrainConfig
    from mt.data.batching import collate
    from mt.data.tokenizer import Framing, Specials
    from mt.model.hf_format import model_config
    from mt.model.transformer import Transformer
    from mt.train.trainer import build_optimizer

    name = {"opus": "opus-mt-de-en", "nllb": "nllb-200-distilled-600M"}[args.shape]
    config = json.loads((HUB_CONFIGS / f"{name}.config.json").read_text())
    cfg, src_vocab, tgt_vocab = model_config(config, name)
    cfg.unk_id = 3 if args.shape == "nllb" else 1
    torch.manual_seed(0)
    model = Transformer(cfg, src_vocab, tgt_vocab).train()
    params = sum(p.numel() for p in model.parameters())
    opt = build_optimizer(model, TrainConfig(), torch.device("cpu"))
    framing = Framing(Specials.of(cfg))
    pairs = list(zip(lines("train", "de", 4000), lines("train", "en", 4000)))
    g = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(args.updates):  # batches of sentences of EMEA's word counts x 1.5 tokens, random ids
        longest, src, tgt = 0, [], []
        for s, t in pairs[int(torch.randint(len(pairs) - 200, (1,), generator=g)) :]:
            n, m = int(len(s.split()) * 1.5) + 1, int(len(t.split()) * 1.5) + 1
            if max(longest, n, m) * (len(src) + 1) > args.max_tokens:
                break
            longest = max(longest, n, m)
            src.append(torch.randint(10, src_vocab - 10, (n,), generator=g).tolist())
            tgt.append(torch.randint(10, tgt_vocab - 10, (m,), generator=g).tolist())
        b = collate(src, tgt, list(range(len(src))), framing)
        loss, _ = model.loss(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, 0.1)
        (loss / b.n_tgt_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(
        f"| {name} shape, {params / 1e6:.0f}M parameters | {args.max_tokens:,} | {peak:.1f} GiB | "
        f"{(time.perf_counter() - start) / args.updates:.1f} s |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--updates", type=int, default=8)
    t.add_argument("--max-tokens", type=int, default=4096)
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--warm", type=int, default=2)
    d = sub.add_parser("decode")
    d.add_argument("--lines", type=int, default=200)
    d.add_argument("--repeats", type=int, default=2)
    m = sub.add_parser("memory")
    m.add_argument("--shape", choices=("opus", "nllb"), default="opus")
    m.add_argument("--max-tokens", type=int, nargs="+", default=[2048])
    m.add_argument("--updates", type=int, default=3)
    m.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.cmd == "memory" and args.child:
        args.max_tokens = args.max_tokens[0]
    {"train": cmd_train, "decode": cmd_decode, "memory": cmd_memory}[args.cmd](args)


if __name__ == "__main__":
    main()
