"""Teacher-forced training (5.3-5.4): the update step, the train/validate loop and its stops.

The decoder reads <s> y and predicts y </s> (teacher forcing). One update sums the label-smoothed loss over
`train.accumulate` batches and divides by their total number of target tokens (over all ranks under DDP), so
the gradient does not depend on how a batch is split into micro-batches or ranks. The parts live beside this:
schedules (mt/schedules.py), device and precision (mt/runtime.py), ranks (mt/distributed.py), the corpus and its
batches (mt/corpus.py), checkpoints (mt/checkpoint.py), metrics (mt/metrics.py), the end of a run (mt/finish.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import signal
from itertools import islice
from pathlib import Path

import datasets
import torch
import torch.distributed as dist
from tqdm import tqdm

from mt import checkpoint, distributed, runtime
from mt.batching import Batch
from mt.config import Config, DecodeConfig, TrainConfig
from mt.corpus import Corpus, training_batches
from mt.ema import WeightEMA
from mt.evaluation import validation_bleu, validation_loss
from mt.metrics import MetricsLog, RunningSums
from mt.model import Transformer
from mt.schedules import Budget, lr_at

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. repeated non-finite losses); the message says what to do."""


class TrainingLoss(torch.nn.Module):
    """The model's teacher-forced `loss` as a module's forward, which is what DDP and torch.compile wrap."""

    def __init__(self, model: Transformer, label_smoothing: float):
        super().__init__()
        self.model, self.label_smoothing = model, label_smoothing

    def forward(self, src, src_pad_mask, tgt_in, tgt_out) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.loss(src, src_pad_mask, tgt_in, tgt_out, self.label_smoothing)


def build_optimizer(model: Transformer, tc: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam(W) with base lr 1, so that the schedule's value is the learning rate itself (5.3)."""
    cls = torch.optim.AdamW if tc.optimizer == "adamw" else torch.optim.Adam
    # One kernel for all parameters on CUDA (fused), one per group of tensors on the CPU (foreach).
    kernel = dict(fused=True) if device.type == "cuda" else dict(foreach=True)
    betas = tuple(tc.betas)
    return cls(model.parameters(), lr=1.0, betas=betas, eps=tc.adam_eps, weight_decay=tc.weight_decay, **kernel)


def wrap_for_training(model: Transformer, tc: TrainConfig, world: int, device: torch.device) -> torch.nn.Module:
    """The module whose forward is the training loss: compiled with `train.compile`, wrapped in DDP under torchrun."""
    wrapped = TrainingLoss(model, tc.label_smoothing)
    if tc.compile:
        wrapped = torch.compile(wrapped)
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None
        # No buffers change during training (positions are fixed), and gradients can live in DDP's buckets.
        wrapped = torch.nn.parallel.DistributedDataParallel(
            wrapped, device_ids=ids, broadcast_buffers=False, gradient_as_bucket_view=True
        )
    return wrapped


def step_optimizer(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, update: int) -> bool:
    """Step through the GradScaler; False when fp16 gradients overflowed and it skipped the step (which then is no
    update: the schedule and the counters stay)."""
    scale = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if scale is not None and scaler.get_scale() < scale:
        log.warning("update %d: fp16 gradients overflowed; step skipped, loss scale now %g", update, scaler.get_scale())
        return False
    return True


class Trainer:
    """Owns the model, optimizer, schedule and batches of one run; `fit` trains, `validate` scores."""

    def __init__(self, cfg: Config, corpus: Corpus, run_dir: Path):
        self.cfg, self.tc, self.corpus, self.run_dir = cfg, cfg.train, corpus, run_dir
        self.world, self.rank = distributed.world_and_rank()
        self.device = runtime.training_device(self.tc.device, cfg.decode.quantize)
        self.amp = runtime.pick_autocast(self.tc.precision, self.device)
        runtime.use_tf32(self.device)
        torch.manual_seed(self.tc.seed)
        self.model = Transformer(cfg.model, len(corpus.vocabs.src), len(corpus.vocabs.tgt)).to(self.device)
        self.optimizer = build_optimizer(self.model, self.tc, self.device)
        self.ema = WeightEMA(self.model, self.tc.ema_decay) if self.tc.ema_decay else None
        self.update, self.epochs_done = 0, 0
        self.budget, self.budget_used = Budget(self.tc.max_updates, self.tc.max_time), 0.0
        schedule = functools.partial(lr_at, cfg=self.tc, d_model=cfg.model.d_model)
        # LambdaLR's own counter is the update number (0 = before the first update).
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: schedule(s + 1, budget_used=self.budget_used)
        )
        self.scaler = torch.amp.GradScaler(enabled=self.amp == torch.float16)
        self.train_model = wrap_for_training(self.model, self.tc, self.world, self.device)
        self.sampler, self.loader, self.segments = training_batches(
            corpus, cfg, self.world, self.rank, cuda=self.device.type == "cuda"
        )
        self.best, self.bad_validations, self.nan_in_a_row = -math.inf, 0, 0
        self.stop_reason: str | None = None
        self.metrics = MetricsLog(run_dir, enabled=self.rank == 0, tensorboard=self.tc.tensorboard)
        if self.rank == 0:
            checkpoint.remove_orphans(run_dir)

    def backward(self, batches: list[Batch]) -> dict:
        """Forward/backward over `batches`, accumulating gradients normalised by their total target tokens. The
        loss sums stay on the device (read every `log_every` updates); "finite" is read now, agreed by all ranks."""
        self.model.train()
        tokens = sum(b.n_tgt_tokens for b in batches)
        if self.world > 1:  # DDP averages gradients over ranks: world / all tokens makes that a sum over tokens
            n_tokens = torch.tensor(float(tokens), device=self.device)
            dist.all_reduce(n_tokens)
            norm = self.world / n_tokens
        else:
            norm = 1.0 / tokens
        loss_sum = nll_sum = torch.zeros((), device=self.device)
        for i, b in enumerate(batches):
            b = b.to(self.device)
            last = i == len(batches) - 1
            with self.train_model.no_sync() if self.world > 1 and not last else contextlib.nullcontext():
                with runtime.autocast(self.device, self.amp):
                    loss, nll = self.train_model(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)
                self.scaler.scale(loss * norm).backward()
            loss_sum, nll_sum = loss_sum + loss.detach().float(), nll_sum + nll.float()
        finite = torch.isfinite(loss_sum).float()
        if self.world > 1:  # one rank's NaN skips the update on every rank, or their counters would diverge
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        return {"loss": loss_sum, "nll": nll_sum, "tokens": tokens, "finite": bool(finite.item())}

    def train_step(self, batches: list[Batch]) -> dict:
        """One update: accumulate gradients over `batches`, clip, step the optimizer and the LR schedule."""
        stats = self.backward(batches)
        if not stats["finite"]:
            self._skip_update(float(stats["loss"]) / stats["tokens"])
            return stats
        self.nan_in_a_row = 0
        self.scaler.unscale_(self.optimizer)
        if self.tc.clip_norm > 0:
            stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.clip_norm)
        if not step_optimizer(self.optimizer, self.scaler, self.update + 1):
            stats["skipped"] = True
            return stats
        self.update += 1
        if self.ema is not None:
            self.ema.update(self.model)
        if self.tc.schedule == "linear" or self.tc.cooldown:  # only these read it (under DDP it costs an all_reduce)
            self.budget_used = distributed.all_max(self.budget.used(self.update), self.device)
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

    @property
    def kept_model(self) -> Transformer:
        """The model the run keeps, validates and decodes: the weight average with `train.ema_decay`, else the
        trained weights themselves."""
        return self.ema.model if self.ema is not None else self.model

    def validate(self, bleu_subset: int | None = None, model: Transformer | None = None) -> dict:
        """Validation loss/perplexity, and BLEU of the decode config's search on (a subset of) the val split, of
        `model` (default: the kept model).

        `bleu_subset`: sentences decoded for BLEU, 0 = all; default `train.valid_bleu_subset`."""
        valid, tc, model = self.corpus.valid, self.tc, self.kept_model if model is None else model
        result = validation_loss(model, valid, tc.max_tokens, tc.label_smoothing, self.device, self.amp)
        if tc.valid_bleu:
            k = (tc.valid_bleu_subset if bleu_subset is None else bleu_subset) or len(valid)
            result.update(self.bleu(valid.select(range(min(k, len(valid)))), self.cfg.decode, model))
        return result

    def bleu(self, ds: datasets.Dataset, decode_cfg: DecodeConfig, model: Transformer | None = None) -> dict:
        model = self.kept_model if model is None else model
        return validation_bleu(model, ds, self.corpus.vocabs, decode_cfg, self.device, self.amp)

    def _validate_and_keep_best(self) -> None:
        if self.rank == 0:
            result = self.validate()
            if self.ema is not None and self.tc.ema_validate_raw:  # the average's gain, at every validation
                result.update({f"raw_{k}": v for k, v in self.validate(model=self.model).items()})
            metric = result.get("valid_bleu", -result["valid_loss"])  # of the kept model
            improved = metric > self.best
            if improved:
                self.best, self.bad_validations = metric, 0
                self.save("checkpoint_best.pt", full=False)
            else:
                self.bad_validations += 1
            self.metrics.write({"kind": "valid", "update": self.update, "epoch": self.epochs_done, **result})
            figures = ", ".join(f"{k}={v:.3f}" for k, v in result.items())
            log.info("validation at update %d: %s%s", self.update, figures, " (best)" if improved else "")
            if self.tc.patience and self.bad_validations >= self.tc.patience:
                self.stop_reason = f"no improvement in {self.tc.patience} validations (patience)"
        distributed.wait_for_rank0()

    def state(self, full: bool) -> dict:
        return checkpoint.trainer_state(self, full)

    def save(self, name: str, full: bool = True) -> Path:
        return checkpoint.save_trainer(self, name, full)

    def resume(self) -> bool:
        """Continue from `train.resume` (a path) or, with `auto`, the run dir's last checkpoint if there is one."""
        return checkpoint.resume_trainer(self)

    def _on_signal(self, signum, frame) -> None:
        self.stop_reason = signal.Signals(signum).name
        log.warning("%s received: stopping after this update and saving a checkpoint", self.stop_reason)

    def _should_stop(self) -> bool:
        """Whether to stop now; under DDP every rank stops at the same update, for the same kind of reason."""
        self.stop_reason = self.stop_reason or self.budget.reached(self.update)
        self.stop_reason = distributed.agree_on_stop(self.stop_reason, self.device)
        return self.stop_reason is not None

    def fit(self, job_start: float, resume: bool = True) -> str:
        """Train until max_epochs/max_updates/max_time/patience or a signal. Returns why it stopped.
        `resume=False` when the caller has already called `resume()`."""
        if resume:
            self.resume()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.budget.clock_start = job_start
        drawn_for = self.sampler.epoch  # BPE-dropout: the epoch whose segmentation the sampler batches by
        if self.segments is not None:
            self.sampler.set_lengths(*self.segments.resegment())
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info("model: %d parameters; %d batches per epoch (rank 0), padding efficiency %.3f; autocast %s",
                 n_params, len(self.sampler), self.sampler.padding_efficiency(), self.amp)  # fmt: skip
        while self.sampler.epoch < self.tc.max_epochs and not self._should_stop():
            epoch = self.sampler.epoch
            if self.segments is not None and epoch != drawn_for:  # a new segmentation before the epoch's batches
                self.sampler.set_lengths(*self.segments.resegment())
                drawn_for = epoch
            self._train_epoch(epoch)
            if self.sampler.position >= len(self.sampler):  # a stop on the epoch's last batch still ends the epoch
                self.sampler.set_epoch(epoch + 1)
            if self.sampler.epoch != epoch:  # the epoch ran to its end
                self._end_epoch(epoch)
        self.budget.bank()
        reason = self.stop_reason or "max_epochs"
        if self.sampler.position:  # stopped inside an epoch: keep the place so that the run can resume
            if distributed.stop_code(reason) == distributed.BUDGET and not self.tc.valid_every:
                self._validate_and_keep_best()  # the partial epoch's training may still give the best model
            self.save("checkpoint_last.pt")
        return reason

    def _train_epoch(self, epoch: int) -> None:
        """Updates from the sampler's position to the end of `epoch`, or until a stop."""
        tc, it, sums = self.tc, iter(self.loader), RunningSums()
        steps, done = max(1, len(self.sampler) // tc.accumulate), self.sampler.position // tc.accumulate
        bar = tqdm(total=steps, initial=done, desc=f"epoch {epoch + 1}", disable=self.rank != 0 or not tc.progress,
                   dynamic_ncols=True, leave=False)  # fmt: skip
        while batches := list(islice(it, tc.accumulate)):
            stats = self.train_step(batches)
            sums.add(stats["loss"], stats["nll"], stats["tokens"])
            bar.update(1)
            if self.update % tc.log_every == 0:
                record = {"kind": "train", "update": self.update, "epoch": epoch, **sums.read()}
                record.update(lr=self.scheduler.get_last_lr()[0], elapsed=self.budget.seconds())
                if "grad_norm" in stats:  # of this update (a device tensor, read here)
                    record["grad_norm"] = float(stats["grad_norm"])
                bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}")
                self.metrics.write(record)
            if tc.valid_every and self.update % tc.valid_every == 0:
                self._validate_and_keep_best()
            if self._should_stop():
                break
        bar.close()

    def _end_epoch(self, epoch: int) -> None:
        self.epochs_done = epoch + 1
        if not self.tc.valid_every:
            self._validate_and_keep_best()
        self.budget.bank()
        self.save(f"checkpoint{self.epochs_done}.pt", full=False)
        self.save("checkpoint_last.pt")
        if self.rank == 0:
            checkpoint.prune(self.run_dir, max(self.tc.keep_last, self.tc.average_last))


def restore_signal_handlers() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
