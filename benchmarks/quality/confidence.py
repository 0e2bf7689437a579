"""How well does a translation's confidence say how good it is? Each signal's correlation with sentence chrF
(and sentence BLEU) against the references, the stand-in for human judgement here; the triage that flags the
lowest-confidence 10%; and what the signals cost in time.

    D=../shared/data
    python benchmarks/quality/confidence.py RUN_DIR \\
        --set Multi30k $D/multi30k/test_2016_flickr.en.gz $D/multi30k/test_2016_flickr.de.gz \\
        --set EMEA $D/opus_emea_de_en/test.en.gz $D/opus_emea_de_en/test.de.gz [--passes 10] [--json out.json]

Signals (each oriented so that higher means better: its sign is the one a user would read it with):
- score: the mean token log-probability of the output (translate.py's `output_format=jsonl` score)
- mc_mean, -mc_var: the mean and (negated) variance over `--passes` MC-dropout passes of each pass's sentence
  probability (`confidence=mc_dropout`, Fomicheva et al. 2020's D-TP and D-Var)
- baselines: -source length (words), -abs(log(output/source length))
Triage: of the 10% of lines with the lowest score, the share that are among the 10% with the lowest chrF (a random
pick: 10%). Timing: the same lines decoded as plain text, with scores and flags, and the MC-dropout passes, each
timed once on this machine in this run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mt import Translator  # noqa: E402
from mt.data.files import read_lines  # noqa: E402
from mt.decode.confidence import records  # noqa: E402


def signals(src: list[str], found: list[dict]) -> dict[str, np.ndarray]:
    out = {"score": np.array([r["score"] for r in found])}
    if "mc_mean" in found[0]:
        out["mc_mean"] = np.array([r["mc_mean"] for r in found])
        out["-mc_var"] = -np.array([r["mc_var"] for r in found])
    src_len = np.array([max(1, len(s.split())) for s in src])
    out_len = np.array([max(1, len(r["text"].split())) for r in found])
    out["-source length"] = -src_len.astype(float)
    out["-abs log length ratio"] = -np.abs(np.log(out_len / src_len))
    return out


def triage(score: np.ndarray, quality: np.ndarray, share: float = 0.1) -> float:
    """Of the `share` lowest-scored lines, the fraction that are among the `share` lowest in quality."""
    k = max(1, round(share * len(score)))
    flagged = set(np.argsort(score, kind="stable")[:k].tolist())
    worst = set(np.argsort(quality, kind="stable")[:k].tolist())
    return len(flagged & worst) / k


def scored(t: Translator, src: list[str]) -> tuple[list, list, list[str], list[dict]]:
    """What translate.py's output_format=jsonl does: the search, the texts, each line's score and flags."""
    src_ids, hyps = t.hypotheses(src)
    best = [h[0] for h in hyps]
    texts = t.vocabs.tgt.decode_batch([h.tokens for h in best])
    return src_ids, best, texts, records(t, src, src_ids, best, texts, t.decode)


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def measure(t: Translator, name: str, src: list[str], refs: list[str], passes: int) -> dict:
    t.translate(src[:50])  # warm-up
    # Plain and scored decoding alternate, twice each; the faster of each pair is kept.
    (plain, a), (_, b) = timed(t.translate, src), timed(scored, t, src)
    (_, c), ((src_ids, best, texts, found), d) = timed(t.translate, src), timed(scored, t, src)
    t_plain, t_scored = min(a, c), min(b, d)
    assert texts == plain, "scoring changed a translation"
    with_mc, t_mc = timed(records, t, src, src_ids, best, texts, t.decode, None, None, None, passes)
    _, t_records = timed(records, t, src, src_ids, best, texts, t.decode)
    chrf = np.array([CHRF().sentence_score(h, [r]).score for h, r in zip(texts, refs)])
    bleu = np.array([BLEU(effective_order=True).sentence_score(h, [r]).score for h, r in zip(texts, refs)])
    rows = {}
    for signal, values in signals(src, with_mc).items():
        rows[signal] = {
            "pearson_chrf": float(stats.pearsonr(values, chrf)[0]),
            "spearman_chrf": float(stats.spearmanr(values, chrf)[0]),
            "spearman_bleu": float(stats.spearmanr(values, bleu)[0]),
        }
    flags: dict[str, int] = {}
    for r in found:
        for f in r["flags"]:
            flags[f] = flags.get(f, 0) + 1
    return {
        "set": name,
        "lines": len(src),
        "corpus_chrf": float(CHRF().corpus_score(texts, [refs]).score),
        "signals": rows,
        "triage_score": triage(np.array([r["score"] for r in found]), chrf),
        "triage_mc_mean": triage(np.array([r["mc_mean"] for r in with_mc]), chrf),
        "flags": flags,
        "seconds": {"plain": t_plain, "scored": t_scored, "mc_dropout": t_mc - t_records},
        "passes": passes,
    }


def table(results: list[dict]) -> str:
    names = list(results[0]["signals"])
    head = "| signal | " + " | ".join(f"{r['set']}: Pearson / Spearman (chrF)" for r in results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]
    for s in names:
        cells = [f"{r['signals'][s]['pearson_chrf']:.3f} / {r['signals'][s]['spearman_chrf']:.3f}" for r in results]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| set | lines | corpus chrF | triage (score) | triage (mc_mean) | flags | s plain / scored / MC |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in results:
        sec = r["seconds"]
        flags = ", ".join(f"{k} {v}" for k, v in sorted(r["flags"].items())) or "none"
        lines.append(f"| {r['set']} | {r['lines']} | {r['corpus_chrf']:.2f} | {r['triage_score']:.0%} | "
                     f"{r['triage_mc_mean']:.0%} | {flags} | {sec['plain']:.1f} / {sec['scored']:.1f} / "
                     f"{sec['mc_dropout']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--set", action="append", nargs=3, required=True, metavar=("NAME", "SOURCE", "REFERENCES"))
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    t = Translator.load(args.checkpoint, device="cpu")
    results = []
    for name, src_path, ref_path in args.set:
        src = [line.strip() for line in read_lines(Path(src_path))]
        refs = [line.strip() for line in read_lines(Path(ref_path))]
        results.append(measure(t, name, src, refs, args.passes))
        print(f"{name}: done", file=sys.stderr)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
