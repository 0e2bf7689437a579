"""Self-describing checkpoints, written atomically: the trainer's state for an exact resume, epoch checkpoints,
pruning and averaging (`python -m mt.checkpoint RUN --average-last K`).

A checkpoint holds what is needed to rebuild the model without the run's config files (model config,
vocabulary sizes and the tokenizers themselves), and, for resuming, the optimizer, scheduler, scaler, sampler
and every RNG state. Reading one is mt/model/saved.py's."""

from __future__ import annotations

import logging
import os
import random
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from mt import runtime
from mt.config import ModelConfig
from mt.data.tokenizer import Vocabs
from mt.decode.flags import ratio_range
from mt.errors import CheckpointError
from mt.model.saved import FORMAT_VERSION, load
from mt.model.transformer import Transformer
from mt.run_dir import previous, resume_path

log = logging.getLogger(__name__)


def save_atomic(obj: dict, path: Path, keep_previous: bool = False) -> None:
    """Write to a temporary file in the same directory, fsync, then rename (and fsync the directory): a kill or a
    full disk mid-save leaves the old file as it was. `keep_previous` first moves the old file to PREVIOUS_SUFFIX,
    a fallback should the new one later be unreadable. A failed write removes its temporary file and raises a
    CheckpointError naming the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.is_file():
            os.replace(path, previous(path))
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(
            f"{path}: could not be written ({e.strerror or e}); free disk space or fix the directory, then run the "
            "same command to resume from the previous checkpoint"
        ) from None


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable: fsync the directory entry (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_orphans(run_dir: Path) -> list[Path]:
    """Delete (and name in a warning) temporary files of saves that a killed process never finished."""
    orphans = [p for p in run_dir.glob(".*.pt.tmp*") if p.is_file()]
    for p in orphans:
        p.unlink(missing_ok=True)
    if orphans:
        log.warning("removed %d unfinished checkpoint writes of a killed run: %s", len(orphans),
                    ", ".join(p.name for p in orphans))  # fmt: skip
    return orphans


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        # The devices visible now: a run saved on a machine with more GPUs resumes on one with fewer.
        for i, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, device=i)


RESUMABLE = ("optimizer", "scheduler", "scaler", "sampler")  # objects with state_dict() / load_state_dict()


# What a resumed run must share with the run that wrote its checkpoint: what decides its batches and its updates.
# The budget, validation, logging, device, precision and decoding may change between stretches of a run.
RESUME_KEYS = {
    "data": ("name", "dir", "format", "src_lang", "tgt_lang", "columns", "train_split", "max_len", "max_ratio",
             "corpora", "directions", "valid_from_train", "batching"),
    "tokenizer": ("vocab_size", "joint", "min_frequency", "normalization", "sample_pairs", "pretokenize",
                  "case_markup"),
    "train": ("seed", "max_tokens", "accumulate", "optimizer", "lr", "schedule", "noam_scale", "warmup",
              "warmup_init_lr", "betas", "adam_eps", "weight_decay", "clip_norm", "label_smoothing", "bpe_dropout",
              "init_from", "freeze"),
}  # fmt: skip


# Of those, what makes another task rather than another setting: a run dir holds one corpus and one direction.
TASK_KEYS = ("data.name", "data.dir", "data.format", "data.src_lang", "data.tgt_lang", "data.columns",
             "data.train_split", "data.corpora", "data.directions")  # fmt: skip


def run_fingerprint(config: dict, world: int) -> dict:
    """{"train.lr": 0.002, ..., "world_size": 2}: the RESUME_KEYS of a run's config, and its number of ranks."""
    keys = {f"{group}.{key}": config[group][key] for group, names in RESUME_KEYS.items() for key in names}
    return {**keys, "world_size": world}


def training_state(
    model: Transformer, vocabs: Vocabs, config: dict, progress: dict, resumable: dict | None, rngs: list | None = None
) -> dict:
    """A checkpoint's contents: the model and what describes it, the run's `progress` counters, and for resuming
    (`resumable`: the RESUMABLE objects by name) their states, the run's fingerprint and every rank's RNG states
    (`rngs`, one per rank; this process's alone when None)."""
    state = {
        "format": FORMAT_VERSION,
        "model_args": model.config_dict(),
        "model": model.state_dict(),
        "tokenizer": vocabs.to_json(),
        "tokenizer_digest": [vocabs.src.digest(), vocabs.tgt.digest()],
        "config": config,
        **progress,
    }
    if resumable is not None:
        rngs = rngs or [rng_state()]
        state.update({name: obj.state_dict() for name, obj in resumable.items()}, rng=rngs[0], rng_per_rank=rngs)
        state["fingerprint"] = run_fingerprint(config, len(rngs))
    return state


def _same(key: str, a, b) -> bool:
    if key == "data.dir" and a and b:  # one folder however the command spells it, or moved (by its name)
        return Path(a).resolve() == Path(b).resolve() or Path(a).resolve().name == Path(b).resolve().name
    return a == b


def check_fingerprint(path: Path, saved: dict | None, now: dict, anyway: bool) -> None:
    """Refuse to continue a run whose batches or updates this command would change (or warn, with `anyway`); a
    change of corpus or direction (TASK_KEYS) is refused whatever `anyway` says."""
    changed = [k for k in now if saved is not None and k in saved and not _same(k, saved[k], now[k])]
    if not changed:
        return
    task = [k for k in changed if k in TASK_KEYS]
    first = (task or changed)[0]
    what = f"{first}={saved[first]!r}, this command {first}={now[first]!r}"
    if task:
        raise CheckpointError(f"{path}: was trained with {what}; a run dir holds one corpus and one direction: "
                              "give this run its own run_dir (or train.resume=never to start over here)")  # fmt: skip
    more = f" (and {', '.join(changed[1:])})" if len(changed) > 1 else ""
    if anyway:
        log.warning("%s: was trained with %s%s; continuing as train.resume_anyway=true asks", path, what, more)
        return
    raise CheckpointError(
        f"{path}: was trained with {what}{more}; use a new run_dir, train.resume=never to start over, or "
        "train.resume_anyway=true to continue with the new settings"
    )


def check_run_dir(config, run_dir: Path) -> None:
    """Before any long work (the probe, a teacher's translations, the BPE): a checkpoint in the run dir that was
    trained on another corpus or in another direction is refused now rather than when the run resumes."""
    path = resume_path(config.train.resume, run_dir)
    if path is None or not path.is_file():
        return
    try:  # (memory-mapped: the weights are not read)
        saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True).get("fingerprint")
    except Exception:
        return  # an unreadable checkpoint: resuming names it (or falls back to the one it replaced)
    now = run_fingerprint(asdict(config), 1)
    derived = ("data.corpora",) if config.distill.enabled else ()  # the teacher's corpora, made after this check
    check_fingerprint(path, saved, {k: now[k] for k in TASK_KEYS if k not in derived}, anyway=False)


def restore_training(path: Path, model: Transformer, vocabs: Vocabs, resumable: dict) -> dict:
    """Load a resumable checkpoint into `model` and the RESUMABLE objects, restore the RNGs; returns the
    checkpoint (its progress counters). An unreadable checkpoint falls back to the one it replaced
    (`keep_previous`), with a warning naming both."""
    try:
        ckpt = load(path)
    except CheckpointError as e:
        if not previous(path).is_file():
            raise
        log.warning("%s; resuming from the checkpoint before it, %s", e, previous(path))
        ckpt = load(previous(path))
    saved = ckpt["model_args"]  # a key added to ModelConfig since it was written takes its default (model.init)
    if {**saved, "model": asdict(ModelConfig(**saved["model"]))} != model.config_dict():
        raise CheckpointError(
            f"{path}: was trained with a different model or vocabulary; use a new run_dir or train.resume=never"
        )
    if ckpt.get("tokenizer_digest", [vocabs.src.digest(), vocabs.tgt.digest()]) != [
        vocabs.src.digest(),
        vocabs.tgt.digest(),
    ]:
        raise CheckpointError(
            f"{path}: was trained with another tokenizer (same size, other merges); use a new run_dir or "
            "train.resume=never, or the tokenizer it was trained with"
        )
    if "optimizer" not in ckpt:
        raise CheckpointError(f"{path}: holds weights only (no optimizer state); it cannot be resumed")
    model.load_state_dict(ckpt.get("raw_model", ckpt["model"]))  # the trained weights, under a weight average
    for name, obj in resumable.items():
        if name == "scaler" and not ckpt[name]:  # saved without fp16: this run's GradScaler starts afresh
            continue
        obj.load_state_dict(ckpt[name])
    return ckpt


def _resumable(trainer) -> dict:
    return {"optimizer": trainer.optimizer, "scheduler": trainer.scheduler, "scaler": trainer.scaler,
            "sampler": trainer.sampler}  # fmt: skip


def trainer_state(trainer, full: bool, rngs: list | None = None) -> dict:
    """What `trainer` (an mt.train.trainer.Trainer) saves: weights and progress; with `full`, all it needs to resume.

    "model" is the kept model (the weight average with train.ema_decay), which translating, averaging and exporting
    read; a full checkpoint of a run with a weight average also holds the trained weights ("raw_model") and the
    number of updates averaged ("ema_updates")."""
    progress = {"update": trainer.update, "epochs_done": trainer.epochs_done, "best": trainer.best}
    # The output/source length range of the training pairs, which translations are flagged outside (flags.py).
    progress["length_ratio"] = ratio_range(*trainer.corpus.train_lengths)
    if full:
        progress.update(elapsed=trainer.budget.elapsed, bad_validations=trainer.bad_validations)
        if trainer.ema is not None:
            progress.update(raw_model=trainer.model.state_dict(), ema_updates=trainer.ema.updates)
    resumable = _resumable(trainer) if full else None
    return training_state(trainer.kept_model, trainer.corpus.vocabs, asdict(trainer.cfg), progress, resumable, rngs)


def save_trainer(trainer, name: str, full: bool = True) -> Path:
    """Write RUN_DIR/name (rank 0 writes; every rank calls it): a full one holds every rank's RNG states, so every
    rank resumes exactly, and `checkpoint_last.pt` keeps its predecessor as a fallback."""
    from mt.train import distributed

    path = trainer.run_dir / name
    rngs = distributed.all_gather(rng_state()) if full else None
    if trainer.rank == 0:
        save_atomic(trainer_state(trainer, full, rngs), path, keep_previous=name == "checkpoint_last.pt")
    return path


def resume_trainer(trainer) -> bool:
    """Restore `trainer` from the checkpoint `train.resume` names, if any; returns whether it resumed."""
    path = resume_path(trainer.tc.resume, trainer.run_dir)
    if path is None:
        return False
    ckpt = restore_training(path, trainer.model, trainer.corpus.vocabs, _resumable(trainer))
    runtime.use_optimizer_kernel(trainer.optimizer, trainer.device)  # the saving run's device may differ
    now = run_fingerprint(asdict(trainer.cfg), trainer.world)
    check_fingerprint(path, ckpt.get("fingerprint"), now, trainer.tc.resume_anyway)
    rngs = ckpt.get("rng_per_rank") or [ckpt["rng"]]
    set_rng_state(rngs[trainer.rank] if len(rngs) == trainer.world else ckpt["rng"])
    if trainer.ema is not None and "raw_model" in ckpt:
        trainer.ema.load(ckpt["model"], ckpt["ema_updates"])
    elif trainer.ema is not None:
        log.warning("%s: was trained without train.ema_decay; the weight average starts from here", path)
    elif "raw_model" in ckpt:
        log.warning("%s: was trained with a weight average (train.ema_decay), which this run drops", path)
    trainer.update, trainer.epochs_done, trainer.best = ckpt["update"], ckpt["epochs_done"], ckpt["best"]
    trainer.budget.elapsed, trainer.bad_validations = ckpt["elapsed"], ckpt["bad_validations"]
    where = f"epoch {trainer.sampler.epoch + 1}, batch {trainer.sampler.position}"
    log.info("resumed from %s at update %d (%s)", path, trainer.update, where)
    return True


def epoch_checkpoints(run_dir: Path) -> list[Path]:
    """`checkpoint{N}.pt` files, oldest first."""
    found = [(int(m.group(1)), p) for p in run_dir.glob("checkpoint*.pt")
             if (m := re.fullmatch(r"checkpoint(\d+)\.pt", p.name))]  # fmt: skip
    return [p for _, p in sorted(found)]


def prune(run_dir: Path, keep_last: int) -> None:
    for p in epoch_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        p.unlink(missing_ok=True)


def average(paths: list[Path]) -> dict:
    """Average the model weights of several checkpoints (paper 6.1); the first one's other fields are kept."""
    if not paths:
        raise CheckpointError("no checkpoints to average; train with train.keep_last >= 2 first")
    base = load(paths[0])
    total = {k: v.double() if v.is_floating_point() else v for k, v in base["model"].items()}
    for p in paths[1:]:
        state = load(p)["model"]
        if state.keys() != total.keys():
            raise CheckpointError(f"{p}: has different parameters from {paths[0]}; average checkpoints of one run")
        for k, v in state.items():
            if v.is_floating_point():
                total[k] += v.double()
    base["model"] = {
        k: (v / len(paths)).to(base["model"][k].dtype) if v.is_floating_point() else v for k, v in total.items()
    }
    base["averaged_from"] = [str(p) for p in paths]
    for key in (*RESUMABLE, "rng", "rng_per_rank", "raw_model", "ema_updates"):
        base.pop(key, None)
    base.pop("path", None)
    return base


def main(argv: list[str] | None = None) -> None:
    """`python -m mt.checkpoint RUN_DIR --average-last K [--output FILE]`: average a run's last K checkpoints."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m mt.checkpoint", description=main.__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--average-last", type=int, required=True, metavar="K")
    ap.add_argument("--output", type=Path, help="default: RUN_DIR/checkpoint_averaged.pt")
    args = ap.parse_args(argv)
    try:
        paths = epoch_checkpoints(args.run_dir)[-args.average_last :]
        if len(paths) < args.average_last:
            raise CheckpointError(
                f"{args.run_dir}: only {len(paths)} epoch checkpoints (checkpointN.pt) to average, asked for "
                f"{args.average_last}; train with train.keep_last >= {args.average_last}"
            )
        out = args.output or args.run_dir / "checkpoint_averaged.pt"
        save_atomic(average(paths), out)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"averaged {', '.join(p.name for p in paths)} -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
