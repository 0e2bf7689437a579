"""BLEU and speed of a trained model's decoders side by side: this project's search (fp32, int8), its CTranslate2
export (float32, int8) and its Hugging Face transformers export (fp32), greedy and beam 5, on real text.

    pip install -e ".[ctranslate2,transformers]"
    python benchmarks/speed/export_speed.py RUN_DIR [--split test_2016_flickr] [--threads 2] [--repeats 2]

The model is exported to CTranslate2 into a temporary directory (`mt.export.formats.write_ctranslate2`, as
`python -m mt.export ctranslate2` does). Every decoder translates the same source ids (the run's BPE) from the
split of the run's data config, the configurations interleaved in each repeat; sentences/s is ids in, hypotheses
out (median of the repeats), BLEU is sacreBLEU of the detokenized output against the raw references.

Beam search: CTranslate2's length penalty divides a score by length^alpha (`length_penalty_type=average` here),
not by GNMT's ((5 + length) / 6)^alpha, so beam 5 is measured twice for this project: with the run's own settings
(GNMT alpha) and with CTranslate2's penalty at the same alpha (the like-for-like pair; "identical" counts the
lines on which the export's output equals this project's under the same settings). transformers' beam search divides
by length^alpha too (</s> counted, as here) and stops a sentence at its fifth finished hypothesis
(`early_stopping=True` in the export's generation_config.json), so it is compared under the same pair of settings.

CTranslate2 is timed twice: through this project's wrapper (`checkpoint=` an export: one `translate_batch` over
every line at the longest line's limit, then the lines that reached their own limit again under it, so that each
line gets what it would alone) and as its users call it ("one translate_batch": every line at the longest line's
limit, CTranslate2's own batching). On a trained model whose lines end with </s> the two take the same time.

The transformers rows load the export from disk (`python -m mt.export transformers` into the temporary directory,
then `AutoModelForSeq2SeqLM.from_pretrained`), as a user would; `generate` gets this project's per-line length
limit as `max_new_tokens` (`mt.export.hugging_face.generate_ids`, lines grouped by limit, 64 a batch). The last
line compares the export with the run's own test report: the same weights, decoded with the run's settings by
each.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import datasets
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mt.config import DataConfig, DecodeConfig  # noqa: E402
from mt.data import read  # noqa: E402
from mt.decode.batched import translate_ids  # noqa: E402
from mt.decode.ct2 import CTranslate2Model  # noqa: E402
from mt.decode.search import output_cap  # noqa: E402
from mt.evaluate.report import score  # noqa: E402
from mt.export.formats import write_ctranslate2  # noqa: E402
from mt.export.hugging_face import export_transformers, generate_ids  # noqa: E402
from mt.model import saved  # noqa: E402
from mt.model.quantize import quantize_int8  # noqa: E402
from mt.runtime import keep_freed_memory_in_the_heap  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a run dir or .pt")
    ap.add_argument("--split", default="test_2016_flickr", help="a split of the run's data config")
    ap.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    keep_freed_memory_in_the_heap()  # as translate.py does
    ckpt = saved.load(args.checkpoint)
    model, vocabs = saved.build_model(ckpt)
    model.eval()
    split = read.drop_empty(read.load_split(DataConfig(**ckpt["config"]["data"]), args.split), args.split)
    if args.limit:
        split = split.select(range(min(args.limit, len(split))))
    src, refs = list(split["src"]), list(split["tgt"])
    src_ids = vocabs.src.encode_batch(src)
    run_decode = DecodeConfig(**ckpt["config"]["decode"])
    tmp = Path(tempfile.mkdtemp(prefix="export_speed-"))
    ct2 = {}
    for q in ("float32", "int8"):
        write_ctranslate2(model, vocabs, tmp / q, None if q == "float32" else q, ckpt["config"], args.checkpoint)
        ct2[q] = CTranslate2Model(tmp / q, torch.device("cpu"), threads=args.threads)

    export_transformers(args.checkpoint, tmp / "transformers")
    import transformers

    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp / "transformers").eval()
    architecture = type(hf).__name__

    greedy = replace(run_decode, beam_size=1, nbest=1)
    beam = replace(run_decode, beam_size=5, nbest=1)
    ct2_beam = replace(beam, length_penalty_type="average")  # the penalty CTranslate2 applies
    gnmt = f"GNMT alpha {beam.length_penalty:g}, the run's"
    avg = f"length^{beam.length_penalty:g}, CTranslate2's"
    cpu = torch.device("cpu")
    model8 = quantize_int8(model)  # what decode.quantize=int8 decodes with, made once outside the timings

    def ours(m):
        return lambda c: translate_ids(m, src_ids, c, cpu, None)

    def export(q):
        return lambda c: ct2[q].translate_ids(src_ids, c)

    def native(q):  # CTranslate2 as its users call it: one translate_batch, the longest line's limit for all
        sources, _, lead = ct2[q].framed(src_ids, None, None)
        cap = output_cap(model, run_decode)
        limit = max(min(math.floor((len(s) + 1) * run_decode.max_len_a + run_decode.max_len_b), cap) for s in src_ids)
        return lambda c: ct2[q]._decode(list(range(len(sources))), sources, None, lead, limit, c)

    def hugging_face(c):
        hf.generation_config.length_penalty = c.length_penalty  # what the export writes for this alpha
        return [[SimpleNamespace(tokens=t)] for t in generate_ids(hf, src_ids, c)]

    runs = {  # name: (decode function, decode config, search, length penalty)
        "this project fp32, greedy": (ours(model), greedy, "greedy", "-"),
        "this project int8, greedy": (ours(model8), greedy, "greedy", "-"),
        "CTranslate2 float32, greedy": (export("float32"), greedy, "greedy", "-"),
        "CTranslate2 int8, greedy": (export("int8"), greedy, "greedy", "-"),
        f"transformers {architecture} fp32, greedy": (hugging_face, greedy, "greedy", "-"),
        "this project fp32, beam 5 (GNMT)": (ours(model), beam, "beam 5", gnmt),
        "this project int8, beam 5 (GNMT)": (ours(model8), beam, "beam 5", gnmt),
        "this project fp32, beam 5": (ours(model), ct2_beam, "beam 5", avg),
        "this project int8, beam 5": (ours(model8), ct2_beam, "beam 5", avg),
        "CTranslate2 float32, beam 5": (export("float32"), ct2_beam, "beam 5", avg),
        "CTranslate2 int8, beam 5": (export("int8"), ct2_beam, "beam 5", avg),
        "CTranslate2 float32, beam 5, one translate_batch": (native("float32"), ct2_beam, "beam 5", avg),
        "CTranslate2 int8, beam 5, one translate_batch": (native("int8"), ct2_beam, "beam 5", avg),
        f"transformers {architecture} fp32, beam 5": (hugging_face, ct2_beam, "beam 5", avg),
    }
    for decode, cfg, _, _ in runs.values():  # untimed: first-call set-up (thread pools, allocations)
        decode(replace(cfg, max_len_a=0.0, max_len_b=5))
    seconds = {name: [] for name in runs}
    outputs = {}
    for _ in range(args.repeats):
        for name, (decode, cfg, _, _) in runs.items():
            start = time.perf_counter()
            hyps = decode(cfg)
            seconds[name].append(time.perf_counter() - start)
            outputs[name] = [h[0].tokens for h in hyps]

    print(f"{args.checkpoint}: {model.cfg.name}, {len(src)} sentences of {args.split}, {args.threads} threads, "
          f"{args.repeats} repeats, torch {torch.__version__}")  # fmt: skip
    print("| decoder | search | length penalty | BLEU (lowercased) | BLEU | chrF | sentences/s, median [min..max] "
          "| identical to this project fp32 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, (_, _, search, penalty) in runs.items():
        texts = vocabs.tgt.decode_batch(outputs[name])
        s = score(texts, refs)
        rates = [len(src) / t for t in seconds[name]]
        peer = "this project fp32, greedy" if search == "greedy" else "this project fp32, beam 5"
        if penalty == gnmt:
            peer = "this project fp32, beam 5 (GNMT)"
        same = sum(a == b for a, b in zip(outputs[name], outputs[peer]))
        print(f"| {name} | {search} | {penalty} | {s['bleu_lowercase']:.2f} | {s['bleu']:.2f} | {s['chrf']:.2f} | "
              f"{statistics.median(rates):.1f} [{min(rates):.1f}..{max(rates):.1f}] | {same}/{len(src)} |")  # fmt: skip
    round_trip(ckpt, args.split, hf, run_decode, src_ids, vocabs, refs)


def round_trip(ckpt: dict, split: str, hf, run_decode: DecodeConfig, src_ids, vocabs, refs) -> None:
    """The run's test report against the transformers export decoded with the run's settings (its generation config,
    so transformers' length penalty at the run's alpha)."""
    report = Path(ckpt["path"]).parent / f"{split}.report.json"
    if not report.is_file():
        print(f"(no {report.name} beside the checkpoint: no round-trip line)")
        return
    ours = json.loads(report.read_text())
    hf.generation_config.length_penalty = run_decode.length_penalty
    texts = vocabs.tgt.decode_batch(generate_ids(hf, src_ids, run_decode))
    s = score(texts, refs)
    print(f"\nround trip, {split}: the run's report BLEU {ours['bleu']:.2f} (lc {ours['bleu_lowercase']:.2f}, "
          f"chrF {ours['chrf']:.2f}, {json.dumps(ours.get('decode', {}).get('length_penalty_type'))} penalty); the "
          f"transformers export with its generation_config.json: BLEU {s['bleu']:.2f} (lc {s['bleu_lowercase']:.2f}, "
          f"chrF {s['chrf']:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
