"""Stage 3 of `+experiment=distill`: the teacher beside its student on the run's test splits.

For each test split the teacher translates the sources with its own decoding settings (`{split}.teacher.hyp`, its
report `{split}.teacher.report.*`), the two are compared with the paired bootstrap (mt/evaluate/compare.py), both
are timed in the same runtimes (this project's decoder and a CTranslate2 int8 export, beam 4, on the same sentences
and threads, in turn, twice, the faster round kept) and weighed on disk. The split's `report.json` gets a `teacher`
and a `student` entry and a `distill` one (the differences, their p-values, the share of the teacher's BLEU kept,
the speed-up); the run's last lines say the same.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mt.data import read
from mt.decode.teacher import model_identity
from mt.decode.translator import Translator
from mt.errors import USER_ERRORS
from mt.evaluate.compare import System, compare
from mt.evaluate.report import write_report
from mt.train.distill import load_teacher

log = logging.getLogger(__name__)
SPEED_BEAM = 4  # the beam both are timed with (Bergamot's and CTranslate2's usual CPU setting)
SPEED_SENTENCES = 500  # the first sentences of the test split they are timed on
SPEED_ROUNDS = 2  # each timed this many times, in turn, the fastest kept
MB = 1e6


def score_teacher(trainer, reports: list[dict], to_ct2: Callable | None = None) -> list[dict]:
    """The teacher on the test splits the student was scored on; returns the `distill` entries written. `to_ct2`:
    (model path, out dir, quantization) -> a CTranslate2 export's dir (mt/export, a layer above this one, which
    train.py passes in); None = timed in this project's decoder only."""
    cfg, run_dir = trainer.cfg, trainer.run_dir
    splits = [r for r in reports if r["name"] in cfg.data.test_splits]
    if not splits:
        return []
    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # its notes on each resampling
    teacher = load_teacher(cfg)
    student = Translator.load(str(run_dir), device=str(trainer.device))
    sizes = {"teacher": weights_mb(teacher.checkpoints), "student": weights_mb([student.checkpoint])}
    out = []
    for report in splits:
        split = report["name"]
        ds = read.drop_empty(read.load_split(cfg.data, split), f"{cfg.data.name}/{split}")
        srcs, refs = list(ds["src"]), list(ds["tgt"])
        start = time.perf_counter()
        hyps = teacher.texts(srcs, teacher.decode)[0]
        seconds = time.perf_counter() - start
        (run_dir / f"{split}.teacher.hyp").write_text("".join(h + "\n" for h in hyps))
        about = {"sentences_per_s": len(hyps) / seconds, "checkpoint": [c["path"] for c in teacher.checkpoints]}
        mine = write_report(run_dir, f"{split}.teacher", srcs, hyps, refs, about, teacher.vocabs.tgt.lowercases)
        student_hyps = (run_dir / f"{split}.hyp").read_text().splitlines()
        paired = compare([System("teacher", f"{split}.teacher.hyp", hyps),
                          System("student", f"{split}.hyp", student_hyps)], refs)  # fmt: skip
        speeds = timed(teacher, student, srcs[:SPEED_SENTENCES], trainer.run_dir, to_ct2)
        entries = {"teacher": mine, "student": report}
        for who, r in entries.items():
            entries[who] = {k: r[k] for k in ("bleu", "bleu_lowercase", "chrf")} | speeds[who] | sizes[who]
        entries["teacher"]["checkpoint"] = about["checkpoint"]
        metrics = paired["systems"][1]["metrics"]
        entries["distill"] = {
            **{f"delta_{k}": round(metrics[m]["delta"], 2) for k, m in METRIC_KEYS.items()},
            **{f"p_{k}": metrics[m]["p_bs"] for k, m in METRIC_KEYS.items()},
            "kept_bleu_lowercase": share(report["bleu_lowercase"], mine["bleu_lowercase"]),
            "speedup": share(speeds["student"]["sentences_per_s"], speeds["teacher"]["sentences_per_s"]),
            "speedup_ct2_int8": share(
                speeds["student"].get("ct2_int8_sentences_per_s"), speeds["teacher"].get("ct2_int8_sentences_per_s")
            ),  # fmt: skip
            "timed_on": f"the first {len(srcs[:SPEED_SENTENCES])} sentences, beam {SPEED_BEAM}, "
            f"{torch.get_num_threads()} threads, {trainer.device}",
        }
        path = run_dir / f"{split}.report.json"
        whole = json.loads(path.read_text()) | entries
        path.write_text(json.dumps(whole, indent=2, ensure_ascii=False) + "\n")
        with open(run_dir / f"{split}.report.md", "a") as f:
            f.write("\n" + markdown(entries))
        for line in summary(split, entries):
            log.info("%s", line)
        out.append(entries["distill"])
    return out


METRIC_KEYS = {"bleu": "BLEU", "bleu_lowercase": "BLEU lc", "chrf": "chrF"}


def share(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def weights_mb(ckpts: list[dict]) -> dict:
    """The models' weights on disk (every file `model_identity` counts), in MB."""
    return {"size_mb": round(sum(w[1] for c in ckpts for w in model_identity(c)["weights"]) / MB, 1)}


def sentences_per_s(translators: dict[str, Translator], lines: list[str], rounds: int = SPEED_ROUNDS) -> dict:
    """{name: sentences/s} of each translator on `lines`, beam SPEED_BEAM: each warmed up, then timed `rounds`
    times in turn (teacher, student, teacher, ...) and its fastest round kept, so that a busy moment of the machine
    does not land on one of them alone."""
    decode = {name: t.settings(beam_size=SPEED_BEAM, nbest=1) for name, t in translators.items()}
    for name, t in translators.items():
        t.texts(lines[:8], decode[name])  # warm-up: the first batch pays for allocations
    best = dict.fromkeys(translators, float("inf"))
    for _ in range(rounds):
        for name, t in translators.items():
            start = time.perf_counter()
            t.texts(lines, decode[name])
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: round(len(lines) / seconds, 2) for name, seconds in best.items()}


def timed(teacher: Translator, student: Translator, lines: list[str], run_dir: Path, to_ct2: Callable | None) -> dict:
    """{who: sentences/s in this project's decoder, and in a CTranslate2 int8 export with its size}, both on the
    same lines. An ensemble has no CTranslate2 form (it decodes one model), nor does a model it cannot convert:
    those are left out with the reason logged."""
    ours = sentences_per_s({"teacher": teacher, "student": student}, lines)
    speeds = {who: {"sentences_per_s": ours[who]} for who in ours}
    sources = {"teacher": teacher.checkpoints, "student": [student.checkpoint]} if to_ct2 else {}
    with tempfile.TemporaryDirectory(dir=run_dir) as tmp:
        exported = {}
        for who, ckpts in sources.items():
            if len(ckpts) > 1:
                log.info("distill: the teacher is an ensemble, which CTranslate2 cannot decode; it is timed in this "
                         "project's decoder only")  # fmt: skip
                continue
            try:
                out = to_ct2(str(ckpts[0]["path"]), Path(tmp) / who, "int8")
                exported[who] = Translator.load(str(out), device="cpu", length_penalty_type="average")
            except USER_ERRORS as e:
                log.warning("distill: the %s is not timed in CTranslate2 int8: %s", who, e)
                continue
            size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            speeds[who]["ct2_int8_size_mb"] = round(size / MB, 1)
        for who, rate in sentences_per_s(exported, lines).items():
            speeds[who]["ct2_int8_sentences_per_s"] = rate
    return speeds


def markdown(entries: dict) -> str:
    """Teacher and student side by side, for the split's report.md."""
    head = "| | BLEU | BLEU lc | chrF | sentences/s | CT2 int8 sentences/s | size MB | CT2 int8 MB |"
    rows = [head, "|" + "---|" * 8]
    for who in ("teacher", "student"):
        e = entries[who]
        cells = [e["bleu"], e["bleu_lowercase"], e["chrf"], e["sentences_per_s"], e.get("ct2_int8_sentences_per_s"),
                 e["size_mb"], e.get("ct2_int8_size_mb")]  # fmt: skip
        rows.append(f"| {who} | " + " | ".join("-" if c is None else f"{c}" for c in cells) + " |")
    d = entries["distill"]
    rows.append(f"\nStudent - teacher: BLEU {d['delta_bleu']:+.2f} (p {d['p_bleu']:.4f}), lowercased "
                f"{d['delta_bleu_lowercase']:+.2f} (p {d['p_bleu_lowercase']:.4f}), chrF {d['delta_chrf']:+.2f} "
                f"(p {d['p_chrf']:.4f}), paired bootstrap; speed timed on {d['timed_on']}.")  # fmt: skip
    return "## Distillation: teacher and student\n\n" + "\n".join(rows) + "\n"


def summary(split: str, entries: dict) -> list[str]:
    """The run's last lines: the two side by side."""
    t, s, d = entries["teacher"], entries["student"], entries["distill"]
    kept = f"{100 * d['kept_bleu_lowercase']:.1f}%" if d["kept_bleu_lowercase"] is not None else "-"
    lines = [
        f"{split}: teacher lowercased BLEU {t['bleu_lowercase']:.2f}, student {s['bleu_lowercase']:.2f} ({kept} of "
        f"the teacher's; difference {d['delta_bleu_lowercase']:+.2f}, p {d['p_bleu_lowercase']:.4f})",
        f"{split}: speed, {d['timed_on']}: teacher {t['sentences_per_s']:.1f} sentences/s, student "
        f"{s['sentences_per_s']:.1f} ({d['speedup']}x)",
    ]
    if d["speedup_ct2_int8"] is not None:
        lines.append(f"{split}: CTranslate2 int8: teacher {t['ct2_int8_sentences_per_s']:.1f} sentences/s, student "
                     f"{s['ct2_int8_sentences_per_s']:.1f} ({d['speedup_ct2_int8']}x), "
                     f"{s['ct2_int8_size_mb']} MB")  # fmt: skip
    lines.append(f"{split}: size on disk: teacher {t['size_mb']} MB, student {s['size_mb']} MB")
    return lines
