"""sacreBLEU's BLEU (cased and lowercased) and chrF of translations against references, and the report
(report.json / report.md) written beside them.

Apart from the validation scores (scoring.py), which read tokenized `datasets` splits, so that translate.py's
report does not import `datasets`.
"""

from __future__ import annotations

import json
from pathlib import Path

import sacrebleu


def score(hyps: list[str], refs: list[str]) -> dict:
    """Corpus BLEU (cased and lowercased), chrF, with sacreBLEU signatures."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    bleu, bleu_lc, chrf = sacrebleu.BLEU(), sacrebleu.BLEU(lowercase=True), sacrebleu.CHRF()
    b, blc, c = bleu.corpus_score(hyps, [refs]), bleu_lc.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {
        "bleu": round(b.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_lowercase": round(blc.score, 2),
        "bleu_lowercase_signature": str(bleu_lc.get_signature()),
        "chrf": round(c.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "length_ratio": round(b.sys_len / max(b.ref_len, 1), 4),
        "bleu_detail": str(b),
    }


def sentence_examples(srcs: list[str], hyps: list[str], refs: list[str], k: int = 5) -> dict:
    """The k best and worst sentences by sentence BLEU (sentences of 5+ reference words, to skip trivia)."""
    scored = [
        (sacrebleu.sentence_bleu(h, [r]).score, s, h, r) for s, h, r in zip(srcs, hyps, refs) if len(r.split()) >= 5
    ]
    scored.sort(key=lambda x: x[0])
    row = lambda x: {"sentence_bleu": round(x[0], 1), "source": x[1], "hypothesis": x[2], "reference": x[3]}  # noqa: E731
    return {"best": [row(x) for x in scored[::-1][:k]], "worst": [row(x) for x in scored[:k]]}


def write_report(
    out_dir: Path, name: str, srcs: list[str], hyps: list[str], refs: list[str], extra: dict, lowercased: bool = False
) -> dict:
    """Score and write `report.json` and `report.md` (named `{name}.report.*` when name is given). `lowercased`: the
    model translates into lowercase (its tokenizer lowercases), which the report says beside its cased scores."""
    report = {"name": name, "sentences": len(hyps), **score(hyps, refs), **extra}
    if lowercased:
        report["lowercased_model"] = True
    report["examples"] = sentence_examples(srcs, hyps, refs)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{name}.report" if name else "report"
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out_dir / f"{stem}.md").write_text(report_markdown(report))
    return report


def report_markdown(r: dict) -> str:
    lines = [
        f"# Translation report: {r['name'] or 'hypotheses'}",
        "",
        "| metric | value | sacreBLEU signature |",
        "|---|---|---|",
        f"| BLEU | {r['bleu']:.2f} | `{r['bleu_signature']}` |",
        f"| BLEU (lowercased) | {r['bleu_lowercase']:.2f} | `{r['bleu_lowercase_signature']}` |",
        f"| chrF | {r['chrf']:.2f} | `{r['chrf_signature']}` |",
        f"| length ratio (hyp/ref) | {r['length_ratio']:.3f} | |",
        "",
        f"`{r['bleu_detail']}`",
        "",
    ]
    if r.get("lowercased_model"):
        lines += ["The model lowercases (`tokenizer.normalization`): its lowercased BLEU is its score; the cased",
                  "BLEU and chrF also count the capitals it cannot produce.", ""]  # fmt: skip
    for key in ("sentences", "sentences_per_s", "tokens_per_s", "decode", "precision", "checkpoint", "recipe"):
        if key in r:
            val = f"{r[key]:.1f}" if isinstance(r[key], float) else r[key]
            lines.append(f"- {key.replace('_', ' ')}: {val}")
    for which in ("best", "worst"):
        lines += ["", f"## {which.capitalize()} sentences by sentence BLEU", ""]
        for ex in r["examples"][which]:
            lines += [
                f"- **{ex['sentence_bleu']}** SRC: {ex['source']}",
                f"  HYP: {ex['hypothesis']}",
                f"  REF: {ex['reference']}",
            ]
    return "\n".join(lines) + "\n"
