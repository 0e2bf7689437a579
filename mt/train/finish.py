"""The end of a run (rank 0): choose the final weights on the whole val split, save them, plot the curves, and
translate and score the test splits."""

from __future__ import annotations

import json
import logging
import math
import shlex
import time
from dataclasses import asdict
from pathlib import Path

from mt.data import read
from mt.decode.batched import encode_within_positions, translate_ids
from mt.evaluate.plots import plot_curves
from mt.evaluate.report import write_report
from mt.model import saved
from mt.train import checkpoint, finetune

log = logging.getLogger(__name__)


def finish(trainer) -> dict:
    """Average the last epoch checkpoints (`train.average_last`), keep whichever of the average, the best
    checkpoint and the weights training ended with scores highest on the whole val split as checkpoint_final.pt,
    then score the test splits with it.

    The best checkpoint was picked on `valid_bleu_subset` sentences at the validations; the final choice scores
    every candidate on all of val, so a lucky subset score does not decide it, and a schedule that decays to zero
    at the budget's end keeps its last updates, which no validation may have seen."""
    run_dir, tc, start = trainer.run_dir, trainer.tc, time.perf_counter()
    last = {k: v.detach().clone() for k, v in trainer.kept_model.state_dict().items()}
    candidates = final_candidates(run_dir, tc.average_last, (trainer.update, last))
    tests = ", ".join(trainer.cfg.data.test_splits) or "no test split"
    if len(candidates) > 1:  # (train.max_time is the training's: this part comes on top)
        log.info("the end of the run: %d candidate weights (%s) scored on the whole val split, then %s",
                 len(candidates), ", ".join(candidates), tests)  # fmt: skip
    tag = "final weights (no validation ran)"
    if len(candidates) == 1:
        tag = next(iter(candidates))
    elif candidates:
        best_metric = -math.inf
        for i, (name, weights) in enumerate(candidates.items()):
            trainer.kept_model.load_state_dict(weights)
            result = trainer.validate(bleu_subset=0)
            metric = result.get("valid_bleu", -result["valid_loss"])
            trainer.metrics.write({"kind": "final_choice", "candidate": name, "update": trainer.update, **result})
            log.info("[%d/%d] %s on the whole val split: %s (%.0f s into the end)", i + 1, len(candidates), name,
                     ", ".join(f"{k}={v:.3f}" for k, v in result.items()), time.perf_counter() - start)  # fmt: skip
            if metric > best_metric:
                best_metric, tag = metric, name
    if candidates:
        trainer.kept_model.load_state_dict(candidates[tag])
    final = trainer.state(full=False)
    final["chosen"] = tag
    checkpoint.save_atomic(final, run_dir / "checkpoint_final.pt")  # what `translate.py checkpoint=RUN_DIR` loads
    if trainer.metrics.path.is_file():
        plot_curves(trainer.metrics.path, run_dir / "training_curves.png")
    reports = evaluate_splits(trainer, trainer.cfg.data.test_splits, tag)
    if trainer.tc.init_from and trainer.tc.test_parent:
        # The parent on this run's test splits (what fine-tuning gained), and this run on the parent's (what it kept).
        parent = saved.build_model(saved.load(trainer.tc.init_from))[0].to(trainer.device).eval()
        reports += evaluate_splits(
            trainer, trainer.cfg.data.test_splits, "the parent, before fine-tuning", model=parent, suffix=".before"
        )
        reports += evaluate_splits(trainer, [], tag, extra=finetune.parent_test_splits(trainer.run_dir))
    log.info("the end of the run took %.0f s after training", time.perf_counter() - start)
    for line in where_it_went(run_dir, reports, lambda: first_source(trainer.cfg)):
        log.info("%s", line)
    return {"checkpoint": tag, "reports": reports}


def auto_recipe(run_dir: Path) -> dict:
    """{"recipe": "+experiment=auto: key=value, ..."} for a run whose settings `+experiment=auto` chose (its
    auto.json, mt/train/auto_setup.py), else {}."""
    path = run_dir / "auto.json"
    try:  # the reports must not fail for a record cut short
        record = json.loads(path.read_text())
        chosen = {c["key"]: c["value"] for c in record["choices"] if c["key"] in record["applied"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {"recipe": "+experiment=auto (auto.json): " + ", ".join(f"{k}={v}" for k, v in chosen.items())}


def first_source(cfg) -> str:
    """The first source sentence of the training split (the example of a run without a test split)."""
    try:
        return next(s for s, _ in read.TextPairs.of_split(cfg.data, cfg.data.train_split) if s.strip())
    except (StopIteration, read.DataError, OSError):
        return ""


def where_it_went(run_dir: Path, reports: list[dict], fallback=lambda: "") -> list[str]:
    """The run's last lines: where the model is, its test scores, and the command that translates with it (a
    sentence of its first test split as the example; without one, `fallback()`, a sentence in the source
    language)."""
    here = Path.cwd().resolve()
    shown = run_dir.resolve()
    shown = shown.relative_to(here) if shown.is_relative_to(here) else shown
    lines = [f"the model: {shown / 'checkpoint_final.pt'} (translate.py, the server and exports take the run dir "
             f"{shown})"]  # fmt: skip
    lines += [f"test {r['name']}: BLEU {r['bleu']:.2f}, lowercased BLEU {r['bleu_lowercase']:.2f}, chrF "
              f"{r['chrf']:.2f} ({r['name']}.report.md)" for r in reports]  # fmt: skip
    example = next((x["source"] for r in reports for x in r["examples"]["best"]), None) or fallback() or "Hello."
    lines.append(
        f"translate with it: echo {shlex.quote(example)} | python translate.py checkpoint={shlex.quote(str(shown))}"
    )
    return lines


def final_candidates(run_dir, average_last: int, last: tuple[int, dict] | None = None) -> dict[str, dict]:
    """{tag: model weights}: the best checkpoint; with average_last >= 2, the average of the last epochs'; and
    `last` (update, weights), the weights training ended with, where a validation ran but not on them. Measured
    (KDE4 De->En in 20 minutes with `+experiment=auto`'s cooldown to zero, docs/experiments/auto.md): the last
    weights scored above the best checkpoint on all of val in three runs of four, by 0.08 to 1.53 BLEU (1.53 where
    200 sentences had picked it at update 2,655 of 6,219)."""
    candidates, best_update = {}, None
    if (run_dir / "checkpoint_best.pt").is_file():
        best = saved.load(run_dir / "checkpoint_best.pt")
        candidates["checkpoint_best.pt"], best_update = best["model"], best.get("update")
    if last is not None and candidates and last[0] != best_update:
        candidates[f"the last weights (update {last[0]})"] = last[1]
    paths = checkpoint.epoch_checkpoints(run_dir)[-average_last:] if average_last >= 2 else []
    if len(paths) >= 2:
        averaged = checkpoint.average(paths)
        checkpoint.save_atomic(averaged, run_dir / "checkpoint_averaged.pt")
        candidates[f"checkpoint_averaged.pt (last {len(paths)})"] = averaged["model"]
    return candidates


def evaluate_splits(trainer, splits: list[str], tag: str, extra: list | None = None, model=None,
                    suffix: str = "") -> list[dict]:  # fmt: skip
    """Translate each test split with the decode config and write `{split}.hyp` and its report in the run dir
    (multilingual: `{split}.{direction}.hyp` for each direction, the target-language token first in the source;
    `extra`: (data config, split) of other corpora, a fine-tuning run's parent's, named `parent.{split}`; `model`:
    another model than the run's, its reports named `{split}{suffix}`).
    In fp32 whatever the training's autocast, as translate.py decodes by default: the report's BLEU is what
    `translate.py checkpoint=RUN_DIR` reproduces."""
    cfg, vocabs, reports = trainer.cfg, trainer.corpus.vocabs, []
    directions = [(d.config, d.tag, f".{d.name}") for d in trainer.corpus.directions or []]
    items = [(dc, s, first, s + where + suffix) for s in splits
             for dc, first, where in directions or [(cfg.data, None, "")]]  # fmt: skip
    parents = [(dc, s, None, f"parent.{s}") for dc, s in extra or []]
    for dc, split, first, name in items + parents:
        try:
            ds = read.drop_empty(read.load_split(dc, split), f"{dc.name}/{split}")
        except read.DataError as e:
            if not name.startswith("parent."):
                raise
            log.warning("the parent's test split %s is not scored: %s", split, e)  # its corpus is elsewhere
            continue
        log.info("translating %s (%s sentences, %s)...", name, f"{len(ds):,}", tag)
        start = time.perf_counter()
        model = trainer.kept_model if model is None else model
        framing = trainer.corpus.framing
        limit = model.cfg.max_positions - 1 - (first is not None) - len(framing.src_lead)
        src_ids = encode_within_positions(vocabs, list(ds["src"]), limit)
        if first is not None:  # the target-language token
            src_ids = [[first, *s] for s in src_ids]
        split = name  # the report's name
        hyps = translate_ids(model, src_ids, cfg.decode, trainer.device, None, framing=framing)
        seconds = time.perf_counter() - start
        texts = vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
        (trainer.run_dir / f"{split}.hyp").write_text("".join(t + "\n" for t in texts))
        n_tokens = sum(len(h[0].tokens) for h in hyps)
        speed = {"sentences_per_s": len(texts) / seconds, "tokens_per_s": n_tokens / seconds}
        about = {**speed, "decode": asdict(cfg.decode), "precision": "fp32", "checkpoint": tag}
        about |= auto_recipe(trainer.run_dir)
        report = write_report(
            trainer.run_dir, split, list(ds["src"]), texts, list(ds["tgt"]), about, vocabs.tgt.lowercases
        )
        log.info(
            "%s (%s): BLEU %.2f, lowercased BLEU %.2f, chrF %.2f, %.1f sentences/s",
            split,
            tag,
            report["bleu"],
            report["bleu_lowercase"],
            report["chrf"],
            speed["sentences_per_s"],
        )
        reports.append(report)
    return reports
