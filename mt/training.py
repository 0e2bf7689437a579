"""Teacher-forced training: loss, optimizer and LR schedule, the train/validate loop, checkpoints, resume.

The decoder reads <s> y and predicts y </s> (teacher forcing). One update sums the label-smoothed loss over
`train.accumulate` batches and divides by their total number of target tokens (over all ranks under DDP), so
the gradient does not depend on how a batch is split into micro-batches or ranks.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import math
import platform
import signal
import sys
import time
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

import datasets
import torch
import torch.distributed as dist
from tqdm import tqdm

from mt import checkpoint, data
from mt.batching import Batch, BatchLoader, TokenBucketSampler
from mt.config import Config, ConfigError, DecodeConfig, TrainConfig
from mt.evaluation import score, translate_ids, write_report
from mt.model import Transformer
from mt.tokenizer import Vocabs, build_vocabs, tokenize, with_bpe_dropout

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. repeated non-finite losses); the message says what to do."""


# ------------------------------------------------------------------------------------ pure pieces (tested)


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """5.3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for step >= 1."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt_lr(step: int, peak: float, warmup: int, init: float = 1e-7) -> float:
    """fairseq's inverse_sqrt: linear warmup from `init` to `peak`, then peak * sqrt(warmup / step)."""
    step = max(step, 1)
    if step < warmup:
        return init + (peak - init) * step / warmup
    return peak * math.sqrt(warmup / step)


def linear_lr(step: int, peak: float, warmup: int, budget_used: float) -> float:
    """Linear warmup to `peak` over `warmup` updates, times a linear decay to 0 when the budget is used up.

    `budget_used` is the fraction (0..1) of the run's budget spent so far: of max_updates, or of max_time when the
    budget is wall-clock, so that a time-limited run ends at lr 0 whatever speed the machine has.
    """
    return peak * min(1.0, max(step, 1) / warmup) * max(0.0, 1.0 - budget_used)


def constant_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warmup to `peak` over `warmup` updates (none if 0), then `peak` (fairseq's "fixed" with warmup). With
    `train.cooldown` this is warmup-stable-decay."""
    return peak * min(1.0, max(step, 1) / warmup) if warmup > 0 else peak


def cooldown_factor(budget_used: float, cooldown: float) -> float:
    """1 until the last `cooldown` fraction of the budget, then linear down to 0 at its end ("warmup-stable-decay")."""
    if cooldown <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - budget_used) / cooldown))


def lr_at(step: int, cfg: TrainConfig, d_model: int, budget_used: float = 0.0) -> float:
    if cfg.schedule == "noam":
        lr = noam_lr(step, d_model, cfg.warmup, cfg.noam_scale)
    elif cfg.schedule == "inverse_sqrt":
        lr = inverse_sqrt_lr(step, cfg.lr, cfg.warmup, cfg.warmup_init_lr)
    elif cfg.schedule == "linear":
        lr = linear_lr(step, cfg.lr, cfg.warmup, budget_used)
    else:
        lr = constant_lr(step, cfg.lr, cfg.warmup)
    return lr * cooldown_factor(budget_used, cfg.cooldown)


# ------------------------------------------------------------------------------------ device, precision


def keep_freed_memory_in_the_heap() -> bool:
    """Stop glibc malloc from handing each step's large tensors back to the kernel (Linux/glibc only); train.py
    and translate.py call it first thing.

    By default glibc serves blocks above a dynamic threshold with mmap and unmaps them on free, so every training
    step page-faults (and the kernel zeroes) its activations anew: ~12% system time in a Multi30k recipe run.
    Raising the mmap and trim thresholds keeps freed memory in the heap for the next step: on the recipe model the
    kernel's share of CPU time drops from 14-17% to 10-12% and training runs 1.07x / 1.18x as fast (two runs of
    `benchmarks/allocator.py`). Returns whether the settings took.
    """
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # from <malloc.h>
    return all(
        libc.mallopt(option, value) == 1
        for option, value in ((m_mmap_threshold, 32 << 20), (m_trim_threshold, 1 << 30), (m_top_pad, 64 << 20))
    )  # 32 MiB is the largest mmap threshold glibc accepts on 64-bit


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TrainingError(f"device={name} but CUDA is not available; use device=cpu or device=auto")
    return torch.device(name)


def pick_autocast(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for fp32. auto = bf16 where the hardware runs it fast (AMX CPUs, Ampere+ GPUs)."""
    if precision == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        # Without AMX, CPU bf16 matmuls are slower than fp32 (measured 2.5x slower per training step on an
        # AVX-512 Xeon without AMX/AVX512-BF16), so fp32 is the fast choice there.
        amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        return torch.bfloat16 if amx else None
    if precision == "fp16" and device.type != "cuda":
        raise TrainingError("train.precision=fp16 needs CUDA (no fp16 GradScaler on CPU); use bf16 or fp32")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


# ------------------------------------------------------------------------------------ data


@dataclass
class Corpus:
    vocabs: Vocabs
    train: datasets.Dataset  # tokenized and filtered
    valid: datasets.Dataset  # tokenized; `src`/`tgt` raw for BLEU


def prepare_data(cfg: Config, run_dir: Path, max_positions: int) -> Corpus:
    """Load the training and validation splits, train (or reuse) the BPE, tokenize (cached) and filter."""
    dc = cfg.data
    log.info("data: %s", data.describe(dc))
    train = data.drop_empty(data.load_split(dc, dc.train_split), f"{dc.name}/{dc.train_split}")
    vocabs = build_vocabs(cfg.tokenizer, train, run_dir)
    max_len = min(dc.max_len, max_positions - 1)  # -1: room for </s> or <s>
    train = data.filter_lengths(tokenize(train, vocabs), max_len, dc.max_ratio, f"{dc.name}/{dc.train_split}")
    valid = data.drop_empty(data.load_split(dc, dc.valid_split), f"{dc.name}/{dc.valid_split}")
    valid = tokenize(valid, vocabs)
    too_long = valid.filter(
        lambda b: [max(len(s), len(t)) > max_len for s, t in zip(b["src_ids"], b["tgt_ids"])], batched=True
    )
    if len(too_long):
        log.warning(
            "%s: %d pairs longer than %d tokens are truncated for validation", dc.valid_split, len(too_long), max_len
        )
        valid = valid.map(
            lambda b: {
                **{k: [x[:max_len] for x in b[k]] for k in ("src_ids", "tgt_ids")},
                **{k: [min(n, max_len) for n in b[k]] for k in ("src_len", "tgt_len")},
            },
            batched=True,
        )
    return Corpus(vocabs, train, valid)


def make_sampler(ds: datasets.Dataset, max_tokens: int, seed: int, shuffle: bool, world: int = 1, rank: int = 0):
    lengths = ds.select_columns(["src_len", "tgt_len"]).with_format("numpy")[:]  # two int arrays, not the ids
    src_lens = lengths["src_len"] + 1  # + </s>
    tgt_lens = lengths["tgt_len"] + 1  # + <s> (input) or </s> (output)
    return TokenBucketSampler(src_lens, tgt_lens, max_tokens, seed, shuffle, num_replicas=world, rank=rank)


class BPEDropoutSegments:
    """The training pairs segmented afresh for every epoch with BPE-dropout (Provilkov et al., 2020).

    Each BPE merge is skipped with probability p, so a word reaches the model in several segmentations. Indexing
    it like a `datasets.Dataset` (`segments[indices]`) gives this epoch's ids, so a BatchLoader reads from it.
    A segmentation longer than `max_len` falls back to the deterministic one. `tokenizers` draws from an RNG that
    cannot be seeded: a resumed run sees other segmentations than an uninterrupted one would, and under DDP rank 0
    segments and broadcasts so that every rank cuts the same batches.
    """

    def __init__(self, train: datasets.Dataset, vocabs: Vocabs, p: float, max_len: int, world: int, rank: int):
        cols = train.select_columns(["src", "tgt", "src_ids", "tgt_ids"])[:]
        self.texts = {"src_ids": cols["src"], "tgt_ids": cols["tgt"]}
        self.fallback = {"src_ids": cols["src_ids"], "tgt_ids": cols["tgt_ids"]}
        self.ids = dict(self.fallback)
        src = with_bpe_dropout(vocabs.src, p)
        self.tokenizers = {"src_ids": src, "tgt_ids": src if vocabs.joint else with_bpe_dropout(vocabs.tgt, p)}
        self.max_len, self.world, self.rank = max_len, world, rank

    def resegment(self) -> tuple[list[int], list[int]]:
        """Draw this epoch's segmentation; returns the source and target lengths the sampler batches by."""
        if self.rank == 0:
            for side, tok in self.tokenizers.items():
                drawn = (e.ids for e in tok.encode_batch(self.texts[side], add_special_tokens=False))
                self.ids[side] = [d if len(d) <= self.max_len else f for d, f in zip(drawn, self.fallback[side])]
        if self.world > 1:
            shared = [self.ids]
            dist.broadcast_object_list(shared, src=0)
            self.ids = shared[0]
        return [len(x) + 1 for x in self.ids["src_ids"]], [len(x) + 1 for x in self.ids["tgt_ids"]]  # + </s>, <s>

    def __getitem__(self, indices: list[int]) -> dict:
        return {side: [ids[i] for i in indices] for side, ids in self.ids.items()}


# ------------------------------------------------------------------------------------ the trainer


def _distributed() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


# Why training stopped, as a code that ranks agree on with an all_reduce(MAX): they must all take the same path
# after the loop (a budget stop validates the partial epoch, which has collectives; a signal exits to resume).
BUDGET, OTHER, SIGNAL = 1, 2, 3
STOP_ON_ANOTHER_RANK = {BUDGET: "max_time", OTHER: "stopped by another rank", SIGNAL: "SIGTERM"}


def stop_code(reason: str | None) -> int:
    if reason is None:
        return 0
    if reason in ("max_time", "max_updates"):
        return BUDGET
    return SIGNAL if reason in ("SIGINT", "SIGTERM") else OTHER


class TrainingLoss(torch.nn.Module):
    """The model's teacher-forced `loss` as a module's forward, which is what DDP and torch.compile wrap."""

    def __init__(self, model: Transformer, label_smoothing: float):
        super().__init__()
        self.model, self.label_smoothing = model, label_smoothing

    def forward(self, src, src_pad_mask, tgt_in, tgt_out) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.loss(src, src_pad_mask, tgt_in, tgt_out, self.label_smoothing)


class Trainer:
    def __init__(self, cfg: Config, corpus: Corpus, run_dir: Path):
        self.cfg, self.tc, self.corpus, self.run_dir = cfg, cfg.train, corpus, run_dir
        self.world, self.rank = _distributed()
        self.device = pick_device(self.tc.device)
        if self.world > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
        if cfg.decode.quantize == "int8" and self.device.type != "cpu":  # fail now, not after training
            raise ConfigError(f"decode.quantize=int8 runs on the CPU only (device: {self.device}); "
                              "set decode.quantize=none")  # fmt: skip
        self.amp = pick_autocast(self.tc.precision, self.device)
        torch.manual_seed(self.tc.seed)
        vocabs = corpus.vocabs
        self.model = Transformer(cfg.model, len(vocabs.src), len(vocabs.tgt)).to(self.device)
        self.optimizer = self._optimizer()
        self.update, self.epochs_done, self.elapsed = 0, 0, 0.0
        self.clock_start = time.time()  # start of the current stretch of wall-clock not yet added to `elapsed`
        self.budget = 0.0  # fraction of max_updates/max_time spent, as of the last update (linear lr, cooldown)
        schedule = functools.partial(lr_at, cfg=self.tc, d_model=cfg.model.d_model)
        # The optimizer's base lr is 1, so the lambda's value is the learning rate itself. LambdaLR's own
        # counter is the update number (step 0 = before the first update).
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: schedule(s + 1, budget_used=self.budget)
        )
        self.scaler = torch.amp.GradScaler(enabled=self.amp == torch.float16)
        self.train_model = TrainingLoss(self.model, self.tc.label_smoothing)
        if self.tc.compile:
            self.train_model = torch.compile(self.train_model)
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = torch.nn.parallel.DistributedDataParallel(self.train_model, device_ids=ids)
        self.sampler = make_sampler(corpus.train, self.tc.max_tokens, self.tc.seed, True, self.world, self.rank)
        self.loader = BatchLoader(corpus.train.select_columns(["src_ids", "tgt_ids"]), self.sampler)
        self.segments = None
        if self.tc.bpe_dropout:
            max_len = min(cfg.data.max_len, cfg.model.max_positions - 1)
            self.segments = BPEDropoutSegments(corpus.train, corpus.vocabs, self.tc.bpe_dropout, max_len,
                                               self.world, self.rank)  # fmt: skip
            self.loader = BatchLoader(self.segments, self.sampler)
        self.best, self.bad_validations, self.nan_in_a_row = -math.inf, 0, 0
        self.stop_reason: str | None = None
        self.metrics_path = run_dir / "metrics.jsonl"

    def _optimizer(self) -> torch.optim.Optimizer:
        tc = self.tc
        cls = torch.optim.AdamW if tc.optimizer == "adamw" else torch.optim.Adam
        # foreach: one kernel per group of tensors instead of one per parameter (many small tensors here).
        return cls(self.model.parameters(), lr=1.0, betas=tuple(tc.betas), eps=tc.adam_eps,
                   weight_decay=tc.weight_decay, foreach=True)  # fmt: skip

    # ---------------------------------------------------------------------------- one update

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None)

    def backward(self, batches: list[Batch]) -> dict:
        """Forward/backward over `batches`, accumulating gradients normalised by their total target tokens."""
        self.model.train()
        n_tokens = torch.tensor(float(sum(b.n_tgt_tokens for b in batches)), device=self.device)
        if self.world > 1:
            dist.all_reduce(n_tokens)
        # DDP averages gradients over ranks; multiplying by world size turns that into a sum over all tokens.
        norm = self.world / n_tokens.item()
        loss_sum = nll_sum = 0.0
        for i, b in enumerate(batches):
            b = b.to(self.device)
            last = i == len(batches) - 1
            with self.train_model.no_sync() if self.world > 1 and not last else contextlib.nullcontext():
                with self._autocast():
                    loss, nll = self.train_model(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)
                self.scaler.scale(loss * norm).backward()
            loss_sum, nll_sum = loss_sum + loss.item(), nll_sum + nll.item()
        # Per-token figures of this rank's share (all ranks together under DDP would need another all_reduce).
        local = sum(b.n_tgt_tokens for b in batches)
        return {"loss": loss_sum / local, "nll": nll_sum / local, "tokens": local, "finite": math.isfinite(loss_sum)}

    def train_step(self, batches: list[Batch]) -> dict:
        """One update: accumulate gradients over `batches`, clip, step the optimizer and the LR schedule."""
        stats = self.backward(batches)
        if not stats["finite"]:
            self._skip_update(stats["loss"])
            return stats
        self.nan_in_a_row = 0
        self.scaler.unscale_(self.optimizer)
        if self.tc.clip_norm > 0:
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.clip_norm))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.update += 1
        if self.tc.schedule == "linear" or self.tc.cooldown:  # only these read it (under DDP it costs an all_reduce)
            self.budget = self.budget_used()
        self.scheduler.step()
        return stats

    def _skip_update(self, loss: float) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.nan_in_a_row += 1
        log.warning("update %d: loss is %s; update skipped (%d in a row)", self.update + 1, loss, self.nan_in_a_row)
        if self.nan_in_a_row >= self.tc.max_nan_updates:
            raise TrainingError(
                f"{self.nan_in_a_row} non-finite losses in a row at update {self.update}; lower the learning "
                "rate (train.lr / train.noam_scale), set train.clip_norm, or try train.precision=fp32"
            )

    # ---------------------------------------------------------------------------- validation

    @torch.no_grad()
    def validate(self, bleu_subset: int | None = None) -> dict:
        """Validation loss/perplexity, and BLEU of the decode config's search on (a subset of) the val split.

        `bleu_subset`: sentences decoded for BLEU, 0 = all; default `train.valid_bleu_subset`."""
        self.model.eval()
        valid = self.corpus.valid
        sampler = make_sampler(valid, self.tc.max_tokens, 0, False)
        loss_sum = nll_sum = n = 0.0
        for b in BatchLoader(valid.select_columns(["src_ids", "tgt_ids"]), sampler):
            b = b.to(self.device)
            with self._autocast():
                loss, nll = self.model.loss(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, self.tc.label_smoothing)
            loss_sum, nll_sum, n = loss_sum + loss.item(), nll_sum + nll.item(), n + b.n_tgt_tokens
        result = {"valid_loss": loss_sum / n, "valid_nll": nll_sum / n, "valid_ppl": math.exp(min(nll_sum / n, 50))}
        if self.tc.valid_bleu:
            k = (self.tc.valid_bleu_subset if bleu_subset is None else bleu_subset) or len(valid)
            result.update(self.bleu(valid.select(range(min(k, len(valid)))), self.cfg.decode))
        return result

    def bleu(self, ds: datasets.Dataset, decode_cfg: DecodeConfig) -> dict:
        start = time.perf_counter()
        hyps = translate_ids(self.model, list(ds["src_ids"]), decode_cfg, self.device, self.amp)
        texts = self.corpus.vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
        s = score(texts, list(ds["tgt"]))
        return {"valid_bleu": s["bleu"], "valid_chrf": s["chrf"], "valid_decode_s": time.perf_counter() - start}

    # ---------------------------------------------------------------------------- checkpoints

    def state(self, full: bool) -> dict:
        state = {
            "format": checkpoint.FORMAT_VERSION,
            "model_args": self.model.config_dict(),
            "model": self.model.state_dict(),
            "tokenizer": self.corpus.vocabs.to_json(),
            "tokenizer_digest": [self.corpus.vocabs.src.digest(), self.corpus.vocabs.tgt.digest()],
            "config": asdict(self.cfg),
            "update": self.update,
            "epochs_done": self.epochs_done,
            "best": self.best,
        }
        if full:
            state.update(
                optimizer=self.optimizer.state_dict(),
                scheduler=self.scheduler.state_dict(),
                scaler=self.scaler.state_dict(),
                rng=checkpoint.rng_state(),
                sampler=self.sampler.state_dict(),
                elapsed=self.elapsed,
                bad_validations=self.bad_validations,
            )
        return state

    def save(self, name: str, full: bool = True) -> Path:
        path = self.run_dir / name
        if self.rank == 0:
            checkpoint.save_atomic(self.state(full), path)
        return path

    def resume(self) -> bool:
        """Continue from `train.resume` (a path) or, with `auto`, the run dir's last checkpoint if there is one."""
        if self.tc.resume == "never":
            return False
        path = self.run_dir / "checkpoint_last.pt" if self.tc.resume == "auto" else Path(self.tc.resume)
        if self.tc.resume == "auto" and not path.is_file():
            return False
        ckpt = checkpoint.load(path)
        if ckpt["model_args"] != self.model.config_dict():
            raise checkpoint.CheckpointError(
                f"{path}: was trained with a different model or vocabulary; use a new run_dir or train.resume=never"
            )
        if "optimizer" not in ckpt:
            raise checkpoint.CheckpointError(f"{path}: holds weights only (no optimizer state); it cannot be resumed")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        checkpoint.set_rng_state(ckpt["rng"])
        self.sampler.load_state_dict(ckpt["sampler"])
        self.update, self.epochs_done, self.best = ckpt["update"], ckpt["epochs_done"], ckpt["best"]
        self.elapsed, self.bad_validations = ckpt["elapsed"], ckpt["bad_validations"]
        log.info("resumed from %s at update %d (epoch %d, batch %d)", path, self.update,
                 self.sampler.epoch + 1, self.sampler.position)  # fmt: skip
        return True

    # ---------------------------------------------------------------------------- the loop

    def log_metrics(self, record: dict) -> None:
        if self.rank == 0:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def _install_signal_handlers(self) -> None:
        def handler(signum, frame):
            self.stop_reason = signal.Signals(signum).name
            log.warning("%s received: stopping after this update and saving a checkpoint", self.stop_reason)

        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, handler)

    def elapsed_now(self) -> float:
        """Seconds of wall-clock this run has spent, over all its resumed stretches."""
        return self.elapsed + time.time() - self.clock_start

    def budget_used(self) -> float:
        """Fraction of the run's budget spent: of max_updates or of max_time, whichever is further along."""
        tc, used = self.tc, 0.0
        if tc.max_updates:
            used = self.update / tc.max_updates
        if tc.max_time:
            used = max(used, self.elapsed_now() / (tc.max_time * 60))
        if self.world > 1 and tc.max_time:  # ranks' clocks differ a little; they must agree on the lr
            used_t = torch.tensor([used], device=self.device)
            dist.all_reduce(used_t, op=dist.ReduceOp.MAX)
            used = used_t.item()
        return min(used, 1.0)

    def _should_stop(self) -> bool:
        tc = self.tc
        if tc.max_updates and self.update >= tc.max_updates:
            self.stop_reason = self.stop_reason or "max_updates"
        if tc.max_time and self.elapsed_now() >= tc.max_time * 60:
            self.stop_reason = self.stop_reason or "max_time"
        code = stop_code(self.stop_reason)
        if self.world > 1:  # every rank stops at the same update, for the same kind of reason
            flag = torch.tensor([float(code)], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if int(flag.item()) > code:  # ranks' clocks differ: one may reach max_time an update before the others
                code, self.stop_reason = int(flag.item()), STOP_ON_ANOTHER_RANK[int(flag.item())]
        return code > 0

    def _validate_and_keep_best(self) -> dict:
        result = self.validate() if self.rank == 0 else {}
        if self.rank == 0:
            metric = result.get("valid_bleu", -result["valid_loss"])
            improved = metric > self.best
            if improved:
                self.best, self.bad_validations = metric, 0
                self.save("checkpoint_best.pt", full=False)
            else:
                self.bad_validations += 1
            self.log_metrics({"kind": "valid", "update": self.update, "epoch": self.epochs_done, **result})
            log.info("validation at update %d: %s%s", self.update,
                     ", ".join(f"{k}={v:.3f}" for k, v in result.items()), " (best)" if improved else "")  # fmt: skip
            if self.tc.patience and self.bad_validations >= self.tc.patience:
                self.stop_reason = f"no improvement in {self.tc.patience} validations (patience)"
        if self.world > 1:
            dist.barrier()
        return result

    def fit(self, job_start: float) -> str:
        """Train until max_epochs/max_updates/max_time/patience or a signal. Returns why it stopped."""
        self.resume()
        self._install_signal_handlers()
        self.clock_start, tc = job_start, self.tc
        drawn_for = self.sampler.epoch  # BPE-dropout: the epoch whose segmentation the sampler batches
        if self.segments is not None:
            self.sampler.set_lengths(*self.segments.resegment())
        steps_per_epoch = max(1, len(self.sampler) // tc.accumulate)
        if self.rank == 0:
            log.info("model: %d parameters; %d batches per epoch (rank 0), padding efficiency %.3f; autocast %s",
                     sum(p.numel() for p in self.model.parameters()), len(self.sampler),
                     self.sampler.padding_efficiency(), self.amp)  # fmt: skip
        while self.sampler.epoch < tc.max_epochs and not self._should_stop():
            epoch = self.sampler.epoch
            if self.segments is not None and epoch != drawn_for:
                self.sampler.set_lengths(*self.segments.resegment())
                drawn_for = epoch
            it = iter(self.loader)
            bar = tqdm(total=steps_per_epoch, initial=self.sampler.position // tc.accumulate, desc=f"epoch {epoch + 1}",
                       disable=self.rank != 0 or not tc.progress, dynamic_ncols=True, leave=False)  # fmt: skip
            tick, tick_tokens, tick_loss, tick_nll = time.perf_counter(), 0, 0.0, 0.0
            while batches := list(islice(it, tc.accumulate)):
                stats = self.train_step(batches)
                tick_tokens += stats["tokens"]
                tick_loss, tick_nll = (
                    tick_loss + stats["loss"] * stats["tokens"],
                    tick_nll + stats["nll"] * stats["tokens"],
                )
                bar.update(1)
                if self.update % tc.log_every == 0:
                    tps = tick_tokens / (time.perf_counter() - tick)
                    lr = self.scheduler.get_last_lr()[0]
                    # Loss per target token over the updates since the last log line, not one noisy batch.
                    loss, nll = tick_loss / max(tick_tokens, 1), tick_nll / max(tick_tokens, 1)
                    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:.0f}")
                    self.log_metrics({"kind": "train", "update": self.update, "epoch": epoch, "loss": loss,
                                      "nll": nll, "lr": lr, "tgt_tokens_per_s": tps,
                                      "elapsed": self.elapsed_now()})  # fmt: skip
                    tick, tick_tokens, tick_loss, tick_nll = time.perf_counter(), 0, 0.0, 0.0
                if tc.valid_every and self.update % tc.valid_every == 0:
                    self._validate_and_keep_best()
                if self._should_stop():
                    break
            bar.close()
            if self.sampler.epoch != epoch:  # the epoch ran to its end
                self.epochs_done = epoch + 1
                if not tc.valid_every:
                    self._validate_and_keep_best()
                self.elapsed, self.clock_start = self.elapsed_now(), time.time()
                self.save(f"checkpoint{self.epochs_done}.pt", full=False)
                self.save("checkpoint_last.pt")
                if self.rank == 0:
                    checkpoint.prune(self.run_dir, max(tc.keep_last, tc.average_last))
        self.elapsed, self.clock_start = self.elapsed_now(), time.time()
        reason = self.stop_reason or "max_epochs"
        if self.sampler.position:  # stopped inside an epoch: keep the place so that the run can resume
            if stop_code(reason) == BUDGET and not tc.valid_every:
                self._validate_and_keep_best()  # the partial epoch's training may still give the best model
            self.save("checkpoint_last.pt")
        return reason


def restore_signal_handlers() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def evaluate_splits(trainer: Trainer, model: Transformer, splits: list[str], tag: str) -> list[dict]:
    """Translate each test split with the decode config and write `{split}.hyp` and its report in the run dir."""
    cfg, reports = trainer.cfg, []
    vocabs = trainer.corpus.vocabs
    for split in splits:
        ds = data.drop_empty(data.load_split(cfg.data, split), f"{cfg.data.name}/{split}")
        start = time.perf_counter()
        hyps = translate_ids(model, vocabs.src.encode_batch(list(ds["src"])), cfg.decode, trainer.device, trainer.amp)
        seconds = time.perf_counter() - start
        texts = vocabs.tgt.decode_batch([h[0].tokens for h in hyps])
        (trainer.run_dir / f"{split}.hyp").write_text("".join(t + "\n" for t in texts))
        speed = {"sentences_per_s": len(texts) / seconds,
                 "tokens_per_s": sum(len(h[0].tokens) for h in hyps) / seconds}  # fmt: skip
        extra = {**speed, "decode": asdict(cfg.decode), "checkpoint": tag}
        report = write_report(trainer.run_dir, split, list(ds["src"]), texts, list(ds["tgt"]), extra)
        log.info("%s (%s): BLEU %.2f, lowercased BLEU %.2f, chrF %.2f, %.1f sentences/s", split, tag,
                 report["bleu"], report["bleu_lowercase"], report["chrf"], speed["sentences_per_s"])  # fmt: skip
        reports.append(report)
    return reports


def plot_curves(metrics_path: Path, png_path: Path) -> None:
    """Training loss, validation loss and validation BLEU against updates, from metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot([r["update"] for r in train], [r["loss"] for r in train], label="train loss (label-smoothed)")
    ax1.plot([r["update"] for r in valid], [r["valid_loss"] for r in valid], "o-", label="valid loss")
    ax1.set_xlabel("update")
    ax1.set_ylabel("loss per target token")
    ax1.legend()
    if any("valid_bleu" in r for r in valid):
        ax2.plot([r["update"] for r in valid], [r.get("valid_bleu", float("nan")) for r in valid], "o-")
        ax2.set_ylabel("valid BLEU")
    ax2.set_xlabel("update")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def finish(trainer: Trainer) -> dict:
    """End of training (rank 0): optionally average the last epoch checkpoints, keep whichever of the averaged
    and the best checkpoint scores higher on validation (as checkpoint_final.pt), then translate and score the
    test splits with it.

    The best epoch was picked on `valid_bleu_subset` sentences; the final choice scores both candidates on the
    whole val split, so a lucky subset score (+-1 BLEU between epochs on 500 Multi30k sentences) does not decide it.
    """
    run_dir, tc = trainer.run_dir, trainer.tc
    candidates: dict[str, dict] = {}  # tag -> model weights
    if (run_dir / "checkpoint_best.pt").is_file():
        candidates["checkpoint_best.pt"] = checkpoint.load(run_dir / "checkpoint_best.pt")["model"]
    paths = checkpoint.epoch_checkpoints(run_dir)[-tc.average_last :] if tc.average_last >= 2 else []
    if len(paths) >= 2:
        averaged = checkpoint.average(paths)
        checkpoint.save_atomic(averaged, run_dir / "checkpoint_averaged.pt")
        candidates[f"checkpoint_averaged.pt (last {len(paths)})"] = averaged["model"]
    tag = "final weights (no validation ran)"
    if len(candidates) == 1:
        tag = next(iter(candidates))
    elif candidates:
        best_metric = -math.inf
        for name, weights in candidates.items():
            trainer.model.load_state_dict(weights)
            result = trainer.validate(bleu_subset=0)
            metric = result.get("valid_bleu", -result["valid_loss"])
            trainer.log_metrics({"kind": "final_choice", "candidate": name, "update": trainer.update, **result})
            log.info("%s on the whole val split: %s", name, ", ".join(f"{k}={v:.3f}" for k, v in result.items()))
            if metric > best_metric:
                best_metric, tag = metric, name
    if candidates:
        trainer.model.load_state_dict(candidates[tag])
    final = trainer.state(full=False)
    final["chosen"] = tag
    checkpoint.save_atomic(final, run_dir / "checkpoint_final.pt")  # what `translate.py checkpoint=RUN_DIR` loads
    if trainer.metrics_path.is_file():
        plot_curves(trainer.metrics_path, run_dir / "training_curves.png")
    reports = evaluate_splits(trainer, trainer.model, trainer.cfg.data.test_splits, tag)
    return {"checkpoint": tag, "reports": reports}
