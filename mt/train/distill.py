"""`+experiment=distill`: a small student trained on a teacher's translations (sequence-level knowledge distillation,
Kim & Rush 2016), in one command within one budget.

Stage 1 (`prepare`, before the corpus is read): the teacher (anything `checkpoint=` takes, an ensemble too) is
loaded and checked against the corpus's direction, timed on the first chunk of the training sources, and the plan
is logged: how many lines it translates in its share of `train.max_time` (`distill.teacher_share`), how long the
student then trains. A teacher too slow for the training sources is refused in one line. It then translates the
training sources (less the pairs held out for validation) and as much of `distill.source_text` as fits, into
caches that outlive the run (mt/decode/teacher.py). Stage 2 is the ordinary trainer: the data config gets the
teacher's translations as training corpora (`data.corpora`, with the original pairs for `distill.mix=both`), so
the student's BPE learns from the sources and the teacher's output, and validation and test stay the real
references. Stage 3 (`score_teacher`, after the test report): the teacher on the same test splits, beside the
student, in the student's report.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, replace
from itertools import islice
from pathlib import Path

from mt.config import Config, ConfigError, CorpusConfig, checkpoint_list
from mt.data import read
from mt.data.files import read_lines
from mt.data.holdout import Without, hold_out
from mt.data.hub_vocab import same_language
from mt.decode.teacher import TeacherText, cache_key, count_text_lines, minutes
from mt.decode.translator import Translator, decode_settings
from mt.errors import USER_ERRORS, DataError
from mt.model import saved
from mt.runtime import pick_device
from mt.train.checkpoint import resume_path
from mt.train.distill_probe import SAMPLE, SHAPE_KEYS, STUDENT_SHAPES, SpeedProbe, StudentTimer, choose_student

log = logging.getLogger(__name__)
RECORD = "distill.json"  # the run dir's record of stage 1: the teacher, the caches, the lines, the speed


def load_teacher(cfg: Config, decode: dict | None = None) -> Translator:
    """The teacher as a Translator with its own decoding settings (`decode` on top: stage 1's
    `distill.teacher_decode`), checked against the corpus's direction: a
    bilingual model trained in another direction, or a multilingual one without the corpus's languages, is a
    one-line error naming distill.teacher."""
    try:
        return _load_teacher(cfg, decode or {})
    except USER_ERRORS as e:
        if str(e).startswith("distill.teacher"):
            raise
        raise type(e)(f"distill.teacher: {e}") from None


def _load_teacher(cfg: Config, decode: dict) -> Translator:
    ckpts = [saved.load(p) for p in checkpoint_list(cfg.distill.teacher)]
    dc = cfg.data
    try:
        settings = decode_settings((ckpts[0].get("config") or {}).get("decode"), decode)
    except ConfigError as e:  # (the teacher's saved settings with distill.teacher_decode's on top)
        raise ConfigError(f"distill.teacher_decode: {e}") from None
    teacher = Translator.open(ckpts, settings, pick_device(cfg.train.device), "fp32", src_lang=dc.src_lang)
    teacher.checkpoints = ckpts  # an ensemble's every model: the cache is keyed by all of them
    if teacher.targets or getattr(teacher.vocabs, "languages", None):  # multilingual: the corpus's pair, any it knows
        teacher.framing(dc.tgt_lang)  # (a language it has no token for fails here)
        teacher.target_id(dc.tgt_lang)
        teacher.tgt_lang = dc.tgt_lang
        return teacher
    for ckpt in ckpts:
        data = (ckpt.get("config") or {}).get("data") or {}
        pair = (data.get("src_lang"), data.get("tgt_lang"))  # an imported model's: what its tokenizer says
        if all(a is None or same_language(a, b) for a, b in zip(pair, (dc.src_lang, dc.tgt_lang))):
            continue
        raise ConfigError(f"distill.teacher={ckpt['path']} translates {pair[0] or '?'}->{pair[1] or '?'}, not the "
                          f"corpus's {dc.src_lang}->{dc.tgt_lang}; give a teacher of this direction")  # fmt: skip
    return teacher


def training_sources(cfg: Config) -> read.TextPairs:
    """The main corpus's training pairs the student may learn from: without those held out for validation."""
    text = read.TextPairs.of_split(cfg.data, cfg.data.train_split)
    if cfg.data.valid_from_train:
        return Without(text, hold_out(text, cfg.data.valid_from_train, cfg.train.seed))
    return text


class SourceText:
    """`distill.source_text`: a file of source-language sentences, counted (and checked as UTF-8) at once."""

    def __init__(self, path: Path):
        self.path, self.lines = path, count_text_lines(path)
        stat = path.stat()
        self.fingerprint = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"

    def __iter__(self):
        return (line.strip() for line in read_lines(self.path))


def prepare(cfg: Config, run_dir: Path, job_start: float, overrides: list[str] = ()) -> Config:
    """Stage 1 and the plan; returns `cfg` with the teacher's translations as its training corpora and the
    student's shape (`overrides`: the command line, whose shape wins)."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    d = cfg.distill
    extra = SourceText(Path(d.source_text).expanduser()) if d.source_text else None  # a bad file fails first
    teacher = load_teacher(cfg, dict(d.teacher_decode))
    pairs = training_sources(cfg)
    n_train = sum(1 for _ in pairs)
    texts = [("the training sources", pairs.fingerprint, lambda: (s for s, _ in pairs), n_train)]
    if extra is not None:
        texts.append((f"distill.source_text={d.source_text}", extra.fingerprint, lambda: iter(extra), extra.lines))
    caches = [TeacherText(Path(d.cache_dir), *cache_key(teacher_ckpts(teacher), fp, teacher.decode),
                          cfg.data.src_lang, cfg.data.tgt_lang) for _, fp, _, _ in texts]  # fmt: skip
    started = resume_path(cfg.train.resume, run_dir) is not None  # the student has checkpoints here
    resuming = started and (run_dir / RECORD).is_file()
    translate = lambda lines: teacher.texts(lines, teacher.decode)[0]  # noqa: E731
    # The plan: the teacher's speed from its cache, else from the first chunk of the training sources.
    rate = next((r for c in caches if (r := c.progress().lines_per_s)), None)
    if rate is None:
        first = caches[0].fill(translate, texts[0][2], min(d.chunk_lines, 200), n_train, d.chunk_lines)
        rate = first.lines_per_s
    wanted = plan(cfg, texts, caches, rate, job_start, resuming)
    timed = d.min_speedup and not resuming and not d.translate_only  # (no student: no shape to choose)
    probe = check_speed(cfg, teacher, texts[0][2], given) if timed else None
    if resuming:  # the shape the student started with
        shape = json.loads((run_dir / RECORD).read_text()).get("student_model") or {}
        cfg.model = replace(cfg.model, **{k: v for k, v in shape.items() if k in SHAPE_KEYS or k == "name"})
    if started and not resuming:
        raise ConfigError(f"run_dir={run_dir} holds the checkpoints of a run that is not a distillation (it has no "
                          f"{RECORD}); give another run_dir")  # fmt: skip
    record = {"teacher": [c["path"] for c in teacher_ckpts(teacher)], "decode": asdict(teacher.decode),
              "lines_per_s": rate, "texts": []}  # fmt: skip
    if probe is not None:
        record["student_speedup"] = asdict(probe)
    record["student_model"] = {"name": cfg.model.name, **{k: getattr(cfg.model, k) for k in SHAPE_KEYS}}
    for (what, _, lines, total), cache, n in zip(texts, caches, wanted):
        start = time.perf_counter()
        done = cache.fill(translate, lines, n, total, d.chunk_lines)
        log.info("teacher: %s: %s of %s lines translated (%s, this run %s)", what, f"{done.lines:,}", f"{total:,}",
                 cache.dir, minutes(time.perf_counter() - start))  # fmt: skip
        record["texts"].append({"text": what, "cache": str(cache.dir), "lines": done.lines, "total": total})
    if not resuming:  # a resumed run trains on what the record says
        (run_dir / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    corpora = [CorpusConfig(name=f"teacher{i}", format="parallel", dir=str(c.dir), src_lang=cfg.data.src_lang,
                            tgt_lang=cfg.data.tgt_lang, train_split="train")
               for i, c in enumerate(caches) if c.progress().lines]  # fmt: skip
    if d.mix == "both":  # the main corpus first: data.valid_from_train holds its pairs out
        corpora.insert(0, CorpusConfig(name=cfg.data.name))
    cfg.data.corpora = corpora
    if not d.translate_only:
        log.info("distill: the student trains on %s", " + ".join(c.name for c in corpora))
    return cfg


def check_speed(cfg: Config, teacher: Translator, lines, given: set[str]) -> SpeedProbe:
    """The student's shape timed against the teacher (mt/train/distill_probe.py) and logged: the command line's
    shape (model=... or a model.* shape key), under `distill.min_speedup` with a warning naming what makes it
    faster; else the largest of STUDENT_SHAPES that decodes `distill.min_speedup` times the teacher's speed, set in
    `cfg.model`."""
    timer = StudentTimer(teacher, list(islice(lines(), SAMPLE)))
    vocab = cfg.tokenizer.vocab_size
    if "model" not in given and not given & {f"model.{k}" for k in SHAPE_KEYS}:
        probes = {name: timer.ratio(replace(cfg.model, name=name, **shape), vocab)
                  for name, shape in STUDENT_SHAPES.items()}  # fmt: skip
        for name, probe in probes.items():
            log.info("distill plan: %s", probe.describe(name))
        name, why = choose_student(probes, cfg.distill.min_speedup)
        (log.warning if why.startswith("WARNING") else log.info)(
            "distill plan: the student's shape: %s (%s); model=... or model.* keys set another", name, why
        )
        cfg.model = replace(cfg.model, name=name, **STUDENT_SHAPES[name])
        return probes[name]
    probe = timer.ratio(cfg.model, vocab)
    log.info("distill plan: %s", probe.describe(cfg.model.name))
    if probe.ratio < cfg.distill.min_speedup:
        log.warning("distill: the student is not %gx faster than its teacher here (%.1fx): a smaller student "
                    "(model.d_model, model.decoder_layers, tokenizer.vocab_size) or a larger teacher is what "
                    "distillation is for; distill.min_speedup=0 stops this check", cfg.distill.min_speedup,
                    probe.ratio)  # fmt: skip
    return probe


def teacher_ckpts(teacher: Translator) -> list[dict]:
    """The teacher's checkpoints (an ensemble's every model)."""
    return teacher.checkpoints


def plan(cfg: Config, texts: list, caches: list[TeacherText], rate: float, job_start: float,
         resuming: bool) -> list[int]:  # fmt: skip
    """The lines of each text to translate now, logged with the time they take; a teacher that cannot translate the
    training sources within its share of the budget is refused (naming the budget that would fit)."""
    done = [c.progress().lines for c in caches]
    if resuming:  # the student's corpus stays what it started with (an exact resume)
        if done[0] < texts[0][3]:
            raise DataError(f"{caches[0].dir}: the teacher's translations of the training sources are incomplete "
                            "but this run has started training; delete the run dir to start again")  # fmt: skip
        return done
    budget = cfg.train.max_time * 60
    if not budget:  # a budget of updates: the teacher translates everything
        need = sum(t[3] - n for t, n in zip(texts, done)) / rate
        log.info("distill plan: no train.max_time, so the teacher translates every line (%s at %.1f lines/s here), "
                 "then the student trains its updates", minutes(need), rate)  # fmt: skip
        return [t[3] for t in texts]
    fraction = 1.0 if cfg.distill.translate_only else cfg.distill.teacher_share  # (no student: all of it)
    share = fraction * budget - (time.time() - job_start)
    need = (texts[0][3] - done[0]) / rate
    log.info("distill plan: the teacher translates %.1f lines/s here; its share is %s of train.max_time=%g min",
             rate, minutes(max(share, 0)), cfg.train.max_time)  # fmt: skip
    if need > share:
        fits = math.ceil((need + time.time() - job_start) / fraction / 60)
        of = "train.max_time" if cfg.distill.translate_only else f"{fraction:g} of train.max_time"
        raise ConfigError(f"distill: the teacher translates {rate:.1f} lines/s here, so the {texts[0][3]:,} training "
                          f"sources need {minutes(need)}, over its share ({of}={cfg.train.max_time:g}); give "
                          f"train.max_time={fits} or more, a faster teacher (fewer models, "
                          "+distill.teacher_decode.beam_size=1)" + ("" if cfg.distill.translate_only else
                          ", or a larger distill.teacher_share"))  # fmt: skip
    wanted = [texts[0][3]]
    left = share - need
    for (what, _, _, total), n in zip(texts[1:], done[1:]):
        fit = min(total, n + int(left * rate))
        if fit < total:
            log.warning("distill: %s: %s of its %s lines fit the teacher's share (the rest is left; a longer "
                        "train.max_time translates more, the cache keeps what is done)", what, f"{fit:,}",
                        f"{total:,}")  # fmt: skip
        left -= (fit - n) / rate
        wanted.append(fit)
    student = budget - (time.time() - job_start) - (share - left)
    then = "" if cfg.distill.translate_only else f", then the student trains {minutes(max(student, 0))}"
    log.info("distill plan: the teacher %s (%s lines)%s", minutes(share - left),
             f"{sum(w - n for w, n in zip(wanted, done)):,}", then)  # fmt: skip
    return wanted
