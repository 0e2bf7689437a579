"""Decoding speed side by side: this project (fp32, int8) vs Hugging Face `generate` vs CTranslate2 (fp32, int8).

    pip install -e ".[bench]"
    python benchmarks/peers/decode_peers.py --shape small [--repeats 3]
    python benchmarks/peers/decode_peers.py --shape base [--profile]

64 random source sentences (15-25 tokens), every output forced to exactly 30 decoder steps (no early </s>), so
all systems do the same work whatever their random weights predict. Beam 5 and greedy, batch 64. HF
`MarianMTModel` is built from a `MarianConfig` with random weights and converted to CTranslate2 (with a dummy
vocabulary); this project's model has the same shape (its own random weights), decoded in fp32 and with
`decode.quantize=int8` (dynamic int8 linears, as CTranslate2 int8). Systems are interleaved in each repeat; the
table gives sentences/s median [min..max] and the ratio of this project's fp32 and int8 to each system.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.speed.shapes import SHAPES, VOCAB  # noqa: E402
from mt.config import DecodeConfig, ModelConfig  # noqa: E402
from mt.decode.search import search  # noqa: E402
from mt.model.quantize import quantize_int8  # noqa: E402
from mt.model.transformer import Transformer  # noqa: E402
from mt.runtime import keep_freed_memory_in_the_heap  # noqa: E402

V, STEPS, N_SENT = VOCAB, 30, 64


def build_hf(shape: dict, out: Path):
    """A random MarianMTModel plus the tokenizer files CTranslate2's converter reads (dummy vocabulary)."""
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(300)]
    text = out / "text.txt"
    text.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(out / "spm"), vocab_size=60, minloglevel=2)
    shutil.copy(out / "spm.model", out / "source.spm")
    shutil.copy(out / "spm.model", out / "target.spm")
    vocab = {"</s>": 0, "<unk>": 1, "<s>": 2, "<pad>": V - 1} | {f"w{i}": i for i in range(3, V - 1)}
    (out / "vocab.json").write_text(json.dumps(vocab))
    cfg = MarianConfig(
        vocab_size=V,
        d_model=shape["d_model"],
        encoder_layers=shape["layers"],
        decoder_layers=shape["layers"],
        encoder_attention_heads=shape["n_heads"],
        decoder_attention_heads=shape["n_heads"],
        encoder_ffn_dim=shape["d_ff"],
        decoder_ffn_dim=shape["d_ff"],
        activation_function="relu",
        max_position_embeddings=512,
        pad_token_id=V - 1,
        eos_token_id=0,
        decoder_start_token_id=V - 1,
        forced_eos_token_id=None,
    )
    torch.manual_seed(0)
    model = MarianMTModel(cfg).eval()
    model.save_pretrained(out)
    MarianTokenizer(
        source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"), vocab=str(out / "vocab.json")
    ).save_pretrained(out)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--profile",
        action="store_true",
        help="then profile this project's runs (torch.profiler, top operators by self CPU time)",
    )
    args = ap.parse_args()
    keep_freed_memory_in_the_heap()  # as translate.py does (it applies to every system in this process)
    shape = SHAPES[args.shape]
    import ctranslate2

    work = Path(tempfile.mkdtemp())
    hf = build_hf(shape, work / "hf")
    translators = {}
    for q in ("float32", "int8"):
        ctranslate2.converters.TransformersConverter(str(work / "hf")).convert(str(work / q), quantization=q)
        translators[q] = ctranslate2.Translator(
            str(work / q), device="cpu", inter_threads=1, intra_threads=torch.get_num_threads()
        )
    ours = Transformer(
        ModelConfig(
            name="bench",
            d_model=shape["d_model"],
            n_heads=shape["n_heads"],
            d_ff=shape["d_ff"],
            encoder_layers=shape["layers"],
            decoder_layers=shape["layers"],
            norm="post",
            max_positions=512,
        ),
        V,
        V,
    ).eval()
    models = {"fp32": ours, "int8": quantize_int8(ours)}

    g = torch.Generator().manual_seed(1)
    lens = torch.randint(15, 26, (N_SENT,), generator=g)
    ids = [torch.randint(4, V - 1, (int(n),), generator=g).tolist() for n in lens]
    S = int(lens.max()) + 1
    # Ours: ids + </s>(3), pad 0. HF/CT2 vocabulary: </s> is 0, pad V-1.
    src = torch.zeros(N_SENT, S, dtype=torch.long)
    hf_src = torch.full((N_SENT, S), V - 1, dtype=torch.long)
    for i, s in enumerate(ids):
        src[i, : len(s) + 1] = torch.tensor(s + [3])
        hf_src[i, : len(s) + 1] = torch.tensor(s + [0])
    ct2_src = [[f"w{t}" for t in s] + ["</s>"] for s in ids]

    def run_ours(dtype: str, k: int):
        # STEPS decoder steps: STEPS - 1 tokens, then </s> forced at the limit.
        cfg = DecodeConfig(beam_size=k, min_len=STEPS - 1, max_len_a=0.0, max_len_b=STEPS, length_penalty=1.0)
        with torch.inference_mode():
            out = search(models[dtype], src, src.eq(0), cfg)
        assert all(len(h[0].tokens) == STEPS - 1 for h in out)

    def run_hf(k: int):
        with torch.inference_mode():
            out = hf.generate(
                input_ids=hf_src,
                attention_mask=hf_src.ne(V - 1).long(),
                num_beams=k,
                do_sample=False,
                max_new_tokens=STEPS,
                min_new_tokens=STEPS,
                early_stopping=False,
            )
        assert out.shape[1] == STEPS + 1  # + the decoder start token

    def run_ct2(q: str, k: int):
        out = translators[q].translate_batch(
            ct2_src, beam_size=k, max_batch_size=N_SENT, max_decoding_length=STEPS, min_decoding_length=STEPS
        )
        assert all(len(r.hypotheses[0]) == STEPS for r in out)

    systems = {}
    for k, name in ((5, "beam 5"), (1, "greedy")):
        systems[(name, "this project fp32")] = lambda k=k: run_ours("fp32", k)
        systems[(name, "this project int8")] = lambda k=k: run_ours("int8", k)
        systems[(name, "HF generate fp32")] = lambda k=k: run_hf(k)
        systems[(name, "CTranslate2 fp32")] = lambda k=k: run_ct2("float32", k)
        systems[(name, "CTranslate2 int8")] = lambda k=k: run_ct2("int8", k)
    times: dict = {key: [] for key in systems}
    for fn in systems.values():  # warm-up
        fn()
    for _ in range(args.repeats):
        for key, fn in systems.items():
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    print(
        f"shape {args.shape} {shape}, vocab {V}, {N_SENT} sentences (source 15-25 tokens), {STEPS} forced "
        f"decoder steps, batch {N_SENT}, {args.repeats} repeats, {torch.get_num_threads()} threads, "
        f"ctranslate2 {ctranslate2.__version__}"
    )
    for search_name in ("beam 5", "greedy"):
        print(
            f"\n{search_name}: {'system':<22}{'sentences/s median [min..max]':>34}{'ours fp32 vs it':>18}"
            f"{'ours int8 vs it':>18}"
        )
        ours = {d: statistics.median(N_SENT / t for t in times[(search_name, f"this project {d}")]) for d in models}
        for (s, name), ts in times.items():
            if s != search_name:
                continue
            rates = [N_SENT / t for t in ts]
            med = statistics.median(rates)
            print(
                f"{'':8}{name:<22}{med:>16.1f} [{min(rates):.1f}..{max(rates):.1f}]"
                f"{ours['fp32'] / med:>17.2f}x{ours['int8'] / med:>17.2f}x"
            )
    if args.profile:
        for (search_name, name), fn in systems.items():
            if name.startswith("this project"):
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    fn()
                print(f"\nprofile, {search_name}, {name}:")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
