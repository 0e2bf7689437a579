"""Teacher-forced training (5.3-5.4): the update step, the train/validate loop and its stops.

The decoder reads <s> y and predicts y </s> (teacher forcing). One update sums the label-smoothed loss over
`train.accumulate` batches and divides by their total number of target tokens (over all ranks under DDP), so
the gradient does not depend on how a batch is split into micro-batches or ranks. The parts live beside this
(mt/train/): schedules (schedules.py), ranks (distributed.py), checkpoints (checkpoint.py), metrics (metrics.py),
the end of a run (finish.py); device and precision in mt/runtime.py, the corpus and its batches in
mt/data/corpus.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import signal
import sys
import time
from itertools import islice
from pathlib import Path

import datasets
import torch
import torch.distributed as dist
from tqdm import tqdm

import mt.model.loss as fused_loss
from mt import runtime
from mt.config import Config, DecodeConfig, TrainConfig
from mt.data.batching import Batch
from mt.data.corpus import Corpus, training_batches
from mt.errors import TrainingError
from mt.evaluate.scoring import validation_bleu, validation_loss
from mt.model.transformer import Transformer
from mt.train import checkpoint, distributed, finetune, regularize
from mt.train.ema import WeightEMA
from mt.train.metrics import MetricsLog, RunningSums
from mt.train.schedules import Budget, lr_at

log = logging.getLogger(__name__)


class TrainingLoss(torch.nn.Module):
    """The model's teacher-forced `loss` as a module's forward, which is what DDP and torch.compile wrap; with
    `rdrop_alpha` or `tgt_word_dropout`, their loss while the model trains (mt/train/regularize.py)."""

    def __init__(self, model: Transformer, label_smoothing: float, rdrop_alpha: float = 0.0,
                 tgt_word_dropout: float = 0.0):  # fmt: skip
        super().__init__()
        self.model, self.label_smoothing = model, label_smoothing
        self.rdrop_alpha, self.tgt_word_dropout = rdrop_alpha, tgt_word_dropout

    def forward(self, src, src_pad_mask, tgt_in, tgt_out) -> tuple[torch.Tensor, torch.Tensor]:
        if self.model.training and self.tgt_word_dropout:
            tgt_in = regularize.drop_target_words(tgt_in, self.tgt_word_dropout, self.model.specials)
        if self.model.training and self.rdrop_alpha:
            return regularize.rdrop_loss(self.model, src, src_pad_mask, tgt_in, tgt_out, self.label_smoothing,
                                         self.rdrop_alpha)  # fmt: skip
        return self.model.loss(src, src_pad_mask, tgt_in, tgt_out, self.label_smoothing)


def build_optimizer(model: Transformer, tc: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam(W) with base lr 1, so that the schedule's value is the learning rate itself (5.3)."""
    cls = torch.optim.AdamW if tc.optimizer == "adamw" else torch.optim.Adam
    betas, kernel = tuple(tc.betas), runtime.optimizer_kernel(device)
    return cls(model.parameters(), lr=1.0, betas=betas, eps=tc.adam_eps, weight_decay=tc.weight_decay, **kernel)


def wrap_for_training(model: Transformer, tc: TrainConfig, world: int, device: torch.device) -> torch.nn.Module:
    """The module whose forward is the training loss: wrapped in DDP under torchrun, then compiled with
    `train.compile`. Compiling the DDP module (not DDP over a compiled one) lets dynamo split the graph at DDP's
    gradient buckets, so their all_reduce overlaps the backward; dynamic shapes, since batches differ in rows and
    length: one graph serves them all instead of a recompile per new shape."""
    wrapped = TrainingLoss(model, tc.label_smoothing, tc.rdrop_alpha, tc.tgt_word_dropout)
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None  # a device API argument, not a code path
        # No buffers change during training (positions are fixed), and gradients can live in DDP's buckets.
        wrapped = torch.nn.parallel.DistributedDataParallel(
            wrapped, device_ids=ids, gradient_as_bucket_view=True, **no_buffer_sync_before_forward()
        )
    if tc.compile:
        fused_loss.run_eagerly_under_compile()
        wrapped = torch.compile(wrapped, dynamic=True)
    return wrapped


def no_buffer_sync_before_forward() -> dict[str, bool]:
    """DDP's keyword that skips broadcasting buffers before each forward: `forward_sync_buffers` from torch 2.13,
    which deprecates `broadcast_buffers` with a FutureWarning in every torchrun log (the new one still syncs them
    once at the start, where they are equal on every rank anyway)."""
    ddp = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in ddp else {"broadcast_buffers": False}


@dataclasses.dataclass
class StepCheck:
    """What every rank must agree on at an update, read from the device at once: the update's one host read and,
    under DDP, its one all_reduce (of their largest values)."""

    loss_finite: bool
    grads_finite: bool  # False: fp16 gradients overflowed (the GradScaler's check), the step is skipped
    stop_code: int  # the strongest stop any rank asks for (mt.train.distributed.stop_code)
    seconds: float  # the budget's clock: the latest of the ranks'


class Trainer:
    """Owns the model, optimizer, schedule and batches of one run; `fit` trains, `validate` scores."""

    def __init__(self, cfg: Config, corpus: Corpus, run_dir: Path):
        self.cfg, self.tc, self.corpus, self.run_dir = cfg, cfg.train, corpus, run_dir
        self.world, self.rank = distributed.world_and_rank()
        self.device = runtime.training_device(self.tc.device, cfg.decode.quantize)
        self.amp = runtime.pick_autocast(self.tc.precision, self.device, cfg.model.d_model)
        runtime.use_tf32(self.device)
        if self.tc.deterministic:
            runtime.use_deterministic_algorithms()
        torch.manual_seed(self.tc.seed)
        self.model = Transformer(cfg.model, len(corpus.vocabs.src), len(corpus.vocabs.tgt)).to(self.device)
        finetune.freeze(self.model, self.tc.freeze)  # before the optimizer: frozen parts get no state
        if self.rank:  # every rank starts from the same weights, but draws its own dropout masks
            torch.manual_seed(self.tc.seed + 1_000_003 * self.rank)
        self.optimizer = build_optimizer(self.model, self.tc, self.device)
        self.ema = WeightEMA(self.model, self.tc.ema_decay) if self.tc.ema_decay else None
        self.update, self.epochs_done = 0, 0
        self.budget, self.budget_used = Budget(self.tc.max_updates, self.tc.max_time), 0.0
        schedule = functools.partial(lr_at, cfg=self.tc, d_model=cfg.model.d_model)
        # LambdaLR's own counter is the update number (0 = before the first update).
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: schedule(s + 1, budget_used=self.budget_used)
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == torch.float16)
        self.train_model = wrap_for_training(self.model, self.tc, self.world, self.device)
        self.sampler, self.loader, self.segments = training_batches(
            corpus, cfg, self.world, self.rank, cuda=runtime.on_cuda(self.device)
        )
        self.best, self.bad_validations, self.nan_in_a_row = -math.inf, 0, 0
        self.stop_reason: str | None = None
        self.check = StepCheck(True, True, 0, 0.0)  # of the last update
        self.saved_at: tuple | None = None  # (update, epoch, position) of the last checkpoint_last.pt written
        self.saved_seconds = 0.0  # and the budget's clock then (or at the start of this stretch)
        self.metrics = MetricsLog(run_dir, enabled=self.rank == 0, tensorboard=self.tc.tensorboard)
        if self.rank == 0:
            checkpoint.remove_orphans(run_dir)

    def backward(self, batches: list[Batch]) -> dict:
        """Forward/backward over `batches`, accumulating gradients normalised by their total target tokens. The
        loss sums stay on the device (read every `log_every` updates)."""
        self.model.train()
        tokens = sum(b.n_tgt_tokens for b in batches)
        if self.world > 1:  # DDP averages gradients over ranks: world / all tokens makes that a sum over tokens
            n_tokens = torch.tensor(float(tokens)).to(self.device, non_blocking=True)  # no wait for the GPU
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
        return {"loss": loss_sum, "nll": nll_sum, "tokens": tokens}

    def agree(self, loss_sum: torch.Tensor) -> StepCheck:
        """The update's StepCheck: whether the loss and the (unscaled) gradients are finite on every rank (one
        rank's NaN skips the update on every rank, or their counters would diverge), any rank's stop request, and
        the budget's clock, packed into one tensor: one all_reduce, one read."""
        overflow = torch.zeros(1, dtype=torch.float64, device=loss_sum.device)
        if self.scaler.is_enabled():  # unscale_ has recorded, on the device, whether the gradients overflowed
            overflow += sum(f.double() for f in self.scaler._found_inf_per_device(self.optimizer).values())
        host = torch.tensor([distributed.stop_code(self.stop_reason), self.budget.seconds()], dtype=torch.float64)
        packed = torch.cat([(~torch.isfinite(loss_sum)).double().view(1), overflow.clamp(max=1),
                            host.to(loss_sum.device, non_blocking=True)])  # fmt: skip
        nonfinite, overflowed, code, seconds = distributed.max_over_ranks(packed).tolist()
        return StepCheck(not nonfinite, not overflowed, int(code), seconds)

    def train_step(self, batches: list[Batch]) -> dict:
        """One update: accumulate gradients over `batches`, clip, step the optimizer and the LR schedule; then
        whether to stop, as all ranks agree (`self.stop_reason`). A non-finite loss or an fp16 overflow skips the
        step, which then is no update: the schedule and the counters stay."""
        stats = self.backward(batches)
        self.scaler.unscale_(self.optimizer)  # fp16: gradients at their true scale, their overflow checked
        self.check = check = self.agree(stats["loss"])
        stats["finite"] = check.loss_finite
        if not check.loss_finite:
            self._skip_update(float(stats["loss"]) / stats["tokens"])
        elif not check.grads_finite:  # the GradScaler's overflow: no step, a lower scale
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            stats["skipped"] = True
            log.warning("update %d: fp16 gradients overflowed; step skipped, loss scale now %g", self.update + 1,
                        self.scaler.get_scale())  # fmt: skip
        else:
            self.nan_in_a_row = 0
            if self.tc.clip_norm > 0:
                stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.clip_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.update += 1
            if self.ema is not None:
                self.ema.update(self.model)
            self.budget_used = self.budget.used(self.update, check.seconds)  # the same on every rank
            self.scheduler.step()
        reason = distributed.agreed_reason(self.stop_reason, check.stop_code)
        self.stop_reason = reason or self.budget.reached(self.update, check.seconds)
        return stats

    def _skip_update(self, loss: float) -> None:
        if self.scaler.is_enabled():  # unscale_ ran: the scaler expects an update before the next one
            self.scaler.update()
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
        result = validation_loss(
            model, valid, tc.max_tokens, tc.label_smoothing, self.device, self.amp, self.corpus.framing
        )
        if tc.valid_bleu and self.corpus.directions:  # each direction's own, and their mean (what selects)
            for d in self.corpus.directions:
                k = (tc.valid_bleu_subset if bleu_subset is None else bleu_subset) or len(d.valid)
                scores = self.bleu(d.valid.select(range(min(k, len(d.valid)))), self.cfg.decode, model)
                result.update({f"{key}_{d.name}": value for key, value in scores.items()})
            for key in ("valid_bleu", "valid_chrf", "valid_decode_s"):
                values = [result[f"{key}_{d.name}"] for d in self.corpus.directions]
                result[key] = sum(values) if key == "valid_decode_s" else sum(values) / len(values)
        elif tc.valid_bleu:
            k = (tc.valid_bleu_subset if bleu_subset is None else bleu_subset) or len(valid)
            result.update(self.bleu(valid.select(range(min(k, len(valid)))), self.cfg.decode, model))
        return result

    def bleu(self, ds: datasets.Dataset, decode_cfg: DecodeConfig, model: Transformer | None = None) -> dict:
        model = self.kept_model if model is None else model
        return validation_bleu(model, ds, self.corpus.vocabs, decode_cfg, self.device, self.amp, self.corpus.framing)

    def _validate_and_keep_best(self) -> None:
        if self.rank == 0:
            start = time.perf_counter()
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
            result["valid_s"] = time.perf_counter() - start  # all of it, the best checkpoint's save included
            self.metrics.write({"kind": "valid", "update": self.update, "epoch": self.epochs_done, **result})
            figures = ", ".join(f"{k}={v:.3f}" for k, v in result.items())
            log.info("validation at update %d: %s%s", self.update, figures, " (best)" if improved else "")
            if self.tc.patience and self.bad_validations >= self.tc.patience:
                self.stop_reason = f"no improvement in {self.tc.patience} validations (patience)"
        distributed.wait_for_rank0()

    def state(self, full: bool) -> dict:
        return checkpoint.trainer_state(self, full)

    def save(self, name: str, full: bool = True) -> Path:
        path = checkpoint.save_trainer(self, name, full)
        if name == "checkpoint_last.pt":
            self.saved_at, self.saved_seconds = self._place(), self.check.seconds
        return path

    def _place(self) -> tuple[int, int, int]:
        return self.update, self.sampler.epoch, self.sampler.position

    def _save_due(self) -> bool:
        """Whether `train.save_every` minutes have passed since checkpoint_last.pt was written (by the clock all
        ranks agreed on at the last update, so that they save together)."""
        return self.check.seconds - self.saved_seconds >= self.tc.save_every * 60

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
        self.check.seconds = self.saved_seconds = self.budget.seconds()
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
        if self.sampler.position and distributed.stop_code(reason) == distributed.BUDGET and not self.tc.valid_every:
            self._validate_and_keep_best()  # the partial epoch's training may still give the best model
        if self.saved_at != self._place():  # every stop keeps its place to resume
            self.save("checkpoint_last.pt")
        return reason

    def budget_left(self) -> str:
        """What is left of the budget, as the progress bar shows it: minutes and/or updates."""
        parts = []
        if self.budget.max_seconds:
            parts.append(f"{max(0.0, self.budget.max_seconds - self.budget.seconds()) / 60:.1f} min")
        if self.budget.max_updates:
            parts.append(f"{max(0, self.budget.max_updates - self.update):,} updates")
        return " / ".join(parts) or "no budget"

    def _train_epoch(self, epoch: int) -> None:
        """Updates from the sampler's position to the end of `epoch`, or until a stop."""
        tc, it, sums = self.tc, iter(self.loader), RunningSums()
        steps, done = max(1, len(self.sampler) // tc.accumulate), self.sampler.position // tc.accumulate
        # A bar for a terminal only: in a log file its frames would be `\r`-joined noise (the log's records stay).
        shown = self.rank == 0 and tc.progress and sys.stderr.isatty()
        bar = tqdm(total=steps, initial=done, desc=f"epoch {epoch + 1}", disable=not shown, dynamic_ncols=True,
                   leave=False)  # fmt: skip
        while batches := list(islice(it, tc.accumulate)):
            before = self.update
            stats = self.train_step(batches)
            sums.add(stats["loss"], stats["nll"], stats["tokens"])
            bar.update(1)
            if self.update == before:  # a skipped update: nothing new to log, validate or save
                if self.stop_reason:
                    break
                continue
            if self.update % tc.log_every == 0:
                record = {"kind": "train", "update": self.update, "epoch": epoch, **sums.read()}
                record.update(lr=self.scheduler.get_last_lr()[0], elapsed=self.budget.seconds())
                if "grad_norm" in stats:  # of this update (a device tensor, read here)
                    record["grad_norm"] = float(stats["grad_norm"])
                bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}", left=self.budget_left())
                self.metrics.write(record)
            if tc.valid_every and self.update % tc.valid_every == 0:
                self._validate_and_keep_best()
                if self._should_stop():  # patience, decided on rank 0, stops every rank now
                    break
            if self.stop_reason:  # agreed by the ranks in train_step
                break
            if tc.save_every and self.sampler.position < len(self.sampler) and self._save_due():  # (_end_epoch's)
                self.save("checkpoint_last.pt")
        bar.close()

    def _end_epoch(self, epoch: int) -> None:
        self.epochs_done = epoch + 1
        if not self.tc.valid_every:
            self._validate_and_keep_best()
        self.budget.bank()
        kept = max(self.tc.keep_last, self.tc.average_last)
        if kept:  # weights only, for averaging and for going back to an epoch
            self.save(f"checkpoint{self.epochs_done}.pt", full=False)
        if not self.tc.save_every or self._save_due():
            self.save("checkpoint_last.pt")
        if self.rank == 0:
            checkpoint.prune(self.run_dir, kept)


def restore_signal_handlers() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
