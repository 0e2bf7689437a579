"""Trainer pieces (schedule, loss, accumulation) and behaviour (exact resume, SIGTERM, averaging, NaN)."""

import json
import math
import os
import platform
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from mt import errors, run_dir
from mt.config import Config, DataConfig, DecodeConfig, TokenizerConfig, TrainConfig
from mt.data.corpus import prepare_data
from mt.model import saved
from mt.train import checkpoint
from mt.train.finish import finish
from mt.train.trainer import Trainer, TrainingError
from tests.conftest import tiny_model_config


def test_linear_schedule_reaches_zero_at_the_end_of_the_budget(toy_corpus, tmp_path):
    trainer = make_trainer(toy_corpus, tmp_path / "run", schedule="linear", warmup=2, max_updates=10)
    trainer.fit(job_start=0)
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    # logged after update 5 and 10: the lr of the next update, 3e-3 * (1 - 5/10), then 0
    assert lrs == pytest.approx([1.5e-3, 0.0])


def test_cooldown_anneals_inverse_sqrt_to_zero(toy_corpus, tmp_path):
    trainer = make_trainer(
        toy_corpus, tmp_path / "run", schedule="inverse_sqrt", warmup=2, max_updates=10, cooldown=0.5
    )
    trainer.fit(job_start=0)
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    # logged after update 5 and 10: the lr of the next update, 3e-3 * sqrt(2 / 6) (cooldown starts at 5), then 0
    assert lrs == pytest.approx([3e-3 * (2 / 6) ** 0.5, 0.0])


def test_time_budget_counts_resumed_time(toy_corpus, tmp_path):
    trainer = make_trainer(toy_corpus, tmp_path / "run", schedule="linear", max_time=2.0)
    trainer.budget.elapsed, trainer.budget.clock_start = 30.0, time.time() - 30.0  # 30 s before a resume, 30 s since
    assert trainer.budget.used(trainer.update) == pytest.approx(0.5, abs=0.01)  # of 120 s


def make_config(corpus_dir: Path, run_dir: Path, model: dict | None = None, **train) -> Config:
    tc = dict(
        device="cpu",
        precision="fp32",
        max_tokens=150,
        warmup=20,
        lr=3e-3,
        schedule="inverse_sqrt",
        max_epochs=3,
        valid_bleu=False,
        keep_last=3,
        progress=False,
        log_every=5,
        resume="auto",
    )
    tc.update(train)
    return Config(
        data=DataConfig(
            name="toy", dir=str(corpus_dir), src_lang="xx", tgt_lang="yy", valid_split="valid", test_splits=["test"]
        ),
        tokenizer=TokenizerConfig(vocab_size=60, min_frequency=1),
        model=tiny_model_config(**{"dropout": 0.1, **(model or {})}),
        train=TrainConfig(**tc),
        decode=DecodeConfig(beam_size=1, max_tokens=500),
        run_dir=str(run_dir),
    )


def make_trainer(corpus_dir, run_dir, model: dict | None = None, **train) -> Trainer:
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = make_config(corpus_dir, run_dir, model, **train)
    return Trainer(cfg, prepare_data(cfg, run_dir, cfg.model.max_positions), run_dir)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def record_batches(trainer: Trainer) -> list:
    seen = []
    step = trainer.train_step

    def wrapped(batches):
        seen.append([b.ids for b in batches])
        return step(batches)

    trainer.train_step = wrapped
    return seen


def test_accumulating_two_half_batches_equals_one_batch(toy_corpus, tmp_path):
    trainer = make_trainer(toy_corpus, tmp_path / "run")
    trainer.model.cfg.dropout = 0.0
    for m in trainer.model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    full = next(iter(trainer.loader))
    from mt.data.batching import collate

    rows = trainer.loader.dataset[full.ids]
    h = len(full.ids) // 2
    halves = [
        collate(rows["src_ids"][:h], rows["tgt_ids"][:h], full.ids[:h]),
        collate(rows["src_ids"][h:], rows["tgt_ids"][h:], full.ids[h:]),
    ]
    trainer.backward([full])
    one = [p.grad.clone() for p in trainer.model.parameters()]
    trainer.optimizer.zero_grad()
    trainer.backward(halves)
    two = [p.grad.clone() for p in trainer.model.parameters()]
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def params(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("how", ["max_updates", "SIGTERM"])
def test_exact_resume(toy_corpus, tmp_path, how):
    """N updates straight == k updates, stop, resume, N: bitwise equal parameters and the same batch order."""
    N, k = 14, 5
    straight = make_trainer(toy_corpus, tmp_path / "a", max_updates=N)
    order_a = record_batches(straight)
    straight.fit(job_start=0)

    if how == "max_updates":
        first = make_trainer(toy_corpus, tmp_path / "b", max_updates=k)
        order_b = record_batches(first)
        assert first.fit(job_start=0) == "max_updates"
    else:
        first = make_trainer(toy_corpus, tmp_path / "b", max_updates=N)
        order_b = record_batches(first)
        step = first.train_step

        def step_then_signal(batches):
            out = step(batches)
            if first.update == k:
                os.kill(os.getpid(), signal.SIGTERM)  # handled: stop after this update and save
            return out

        first.train_step = step_then_signal
        assert first.fit(job_start=0) == "SIGTERM"
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert first.update == k and (tmp_path / "b" / "checkpoint_last.pt").is_file()
    second = make_trainer(toy_corpus, tmp_path / "b", max_updates=N)
    order_b2 = record_batches(second)
    second.fit(job_start=0)
    assert second.update == N and order_a == order_b + order_b2
    a, b = params(straight), params(second)
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_fixed_batches_train_and_resume_exactly_across_epochs(toy_corpus, tmp_path):
    """data.batching=fixed (fairseq's batches): the trainer's epochs hold the same batches in new orders, and a run
    stopped mid-way resumes to the same batches and bitwise the same parameters."""
    from dataclasses import replace

    def trainer(run_dir, **train):
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg = make_config(toy_corpus, run_dir, **train)
        cfg = replace(cfg, data=replace(cfg.data, batching="fixed"))
        return Trainer(cfg, prepare_data(cfg, run_dir, cfg.model.max_positions), run_dir)

    straight = trainer(tmp_path / "a", max_updates=40, max_epochs=10)
    assert straight.sampler.formation == "fixed"
    per_epoch = len(straight.sampler)
    order_a = record_batches(straight)
    straight.fit(job_start=0)
    epochs = [order_a[i : i + per_epoch] for i in range(0, 2 * per_epoch, per_epoch)]
    assert sorted(map(str, epochs[0])) == sorted(map(str, epochs[1])) and epochs[0] != epochs[1]
    first = trainer(tmp_path / "b", max_updates=per_epoch + 3, max_epochs=10)
    order_b = record_batches(first)
    first.fit(job_start=0)
    second = trainer(tmp_path / "b", max_updates=40, max_epochs=10)
    order_b2 = record_batches(second)
    second.fit(job_start=0)
    assert order_a == order_b + order_b2
    a, b = params(straight), params(second)
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_interrupted_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint_last.pt"
    checkpoint.save_atomic({"format": 1, "model": {"w": torch.ones(2)}}, path)

    def boom(obj, f):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_atomic({"format": 1, "model": {"w": torch.zeros(2)}}, path)
    monkeypatch.undo()
    assert torch.equal(saved.load(path)["model"]["w"], torch.ones(2))


def test_nan_losses_skip_updates_then_stop(toy_corpus, tmp_path):
    trainer = make_trainer(toy_corpus, tmp_path / "run", max_nan_updates=3)
    batch = next(iter(trainer.loader))
    before = params(trainer)
    with torch.no_grad():
        trainer.model.output.weight[7, 0] = float("nan")
    for _ in range(2):
        trainer.train_step([batch])
    assert trainer.update == 0
    with pytest.raises(TrainingError, match="3 non-finite losses in a row"):
        trainer.train_step([batch])
    after = params(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before if "embed" not in k and k != "output.weight")


def test_checkpoints_kept_averaged_and_self_describing(toy_corpus, tmp_path):
    run = tmp_path / "run"
    trainer = make_trainer(toy_corpus, run, max_epochs=4, keep_last=2, average_last=2, valid_bleu=True)
    trainer.fit(job_start=0)
    assert [p.name for p in checkpoint.epoch_checkpoints(run)] == ["checkpoint3.pt", "checkpoint4.pt"]
    avg = checkpoint.average(checkpoint.epoch_checkpoints(run))
    a, b = (saved.load(run / f"checkpoint{i}.pt")["model"] for i in (3, 4))
    torch.testing.assert_close(avg["model"]["output.weight"], (a["output.weight"] + b["output.weight"]) / 2)
    model, vocabs = saved.build_model(saved.load(run))  # the run dir's best checkpoint
    assert model.cfg == trainer.cfg.model and len(vocabs.src) == len(trainer.corpus.vocabs.src)
    metrics = (run / "metrics.jsonl").read_text()
    assert '"kind": "valid"' in metrics and "valid_bleu" in metrics


def test_final_choice_scores_best_and_average_on_the_whole_val_split(toy_corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    trainer = make_trainer(
        toy_corpus, run, max_epochs=3, keep_last=2, average_last=2, valid_bleu=True, valid_bleu_subset=2
    )
    decoded = []  # sentences each BLEU validation decodes
    bleu = trainer.bleu
    monkeypatch.setattr(trainer, "bleu", lambda ds, cfg, model: decoded.append(len(ds)) or bleu(ds, cfg, model))
    trainer.fit(job_start=0)
    assert decoded == [2, 2, 2]  # per epoch: the subset
    last = {k: v.clone() for k, v in trainer.kept_model.state_dict().items()}
    finish(trainer)
    n_valid = len(trainer.corpus.valid)
    rows = {r["candidate"]: r for r in read_metrics(run) if r["kind"] == "final_choice"}
    assert decoded[3:] == [n_valid] * len(rows) and n_valid > 2  # every candidate on all of val
    # the last epoch's weights are a candidate of their own unless its validation made them the best checkpoint
    best_update = saved.load(run / "checkpoint_best.pt")["update"]
    last_tag = f"the last weights (update {trainer.update})"
    expected_tags = {"checkpoint_best.pt", "checkpoint_averaged.pt (last 2)"}
    assert set(rows) == expected_tags | ({last_tag} if best_update != trainer.update else set())
    winner = max(rows, key=lambda k: rows[k]["valid_bleu"])  # ties keep the best epoch (listed first)
    final = saved.load(run / "checkpoint_final.pt")
    assert final["chosen"] == winner
    sources = {"checkpoint_best.pt": run / "checkpoint_best.pt", last_tag: None}
    source = sources.get(winner, run / "checkpoint_averaged.pt")
    torch.testing.assert_close(final["model"], last if source is None else saved.load(source)["model"])


@pytest.mark.parametrize("max_updates", [5, 4])
def test_the_weights_training_ended_with_are_a_candidate_where_no_validation_saw_them(
    toy_corpus, tmp_path, monkeypatch, max_updates
):
    """Validations every 2 updates: a run stopped by its budget at update 5 ends on weights none of them scored
    (a schedule cooled to zero ends on its most refined ones); the final choice scores them on all of val beside
    the best checkpoint and keeps them when they score higher. Stopped at update 4, they were validated: a
    candidate only if that validation did not make them the best checkpoint."""
    run = tmp_path / "run"
    trainer = make_trainer(toy_corpus, run, max_updates=max_updates, max_epochs=100, valid_every=2, valid_bleu=True)
    trainer.fit(job_start=0)
    last = {k: v.clone() for k, v in trainer.kept_model.state_dict().items()}
    best_update = saved.load(run / "checkpoint_best.pt")["update"]
    assert best_update in (2, 4)
    scored = []  # the whole-val scores rise candidate by candidate: the last one listed wins
    monkeypatch.setattr(trainer, "validate", lambda bleu_subset=None, model=None: scored.append(1) or {
        "valid_loss": 1.0, "valid_bleu": float(len(scored))})  # fmt: skip
    finish(trainer)
    rows = [r["candidate"] for r in read_metrics(run) if r["kind"] == "final_choice"]
    ended_unseen = max_updates == 5 or best_update != max_updates
    # one candidate alone is kept without scoring it again
    assert rows == (["checkpoint_best.pt", f"the last weights (update {max_updates})"] if ended_unseen else [])
    final = saved.load(run / "checkpoint_final.pt")
    expected = last if ended_unseen else saved.load(run / "checkpoint_best.pt")["model"]
    torch.testing.assert_close(final["model"], expected)
    assert final["chosen"] == (rows[-1] if ended_unseen else "checkpoint_best.pt")


def test_resume_refuses_a_different_model(toy_corpus, tmp_path):
    make_trainer(toy_corpus, tmp_path / "run", max_updates=3).fit(job_start=0)
    cfg = make_config(toy_corpus, tmp_path / "run")
    cfg.model.d_model = 64
    trainer = Trainer(cfg, prepare_data(cfg, tmp_path / "run", 128), tmp_path / "run")
    with pytest.raises(errors.CheckpointError, match="different model"):
        trainer.resume()


def test_validation_loss_decreases(toy_corpus, tmp_path):
    trainer = make_trainer(toy_corpus, tmp_path / "run", max_epochs=1)
    before = trainer.validate()["valid_loss"]
    trainer.fit(job_start=0)
    assert trainer.validate()["valid_loss"] < before and math.isfinite(before)


def test_average_command(toy_corpus, tmp_path):
    run = tmp_path / "run"
    make_trainer(toy_corpus, run, max_epochs=3, keep_last=3).fit(job_start=0)
    checkpoint.main([str(run), "--average-last", "2", "--output", str(tmp_path / "avg.pt")])
    avg = saved.load(tmp_path / "avg.pt")
    assert avg["averaged_from"] == [str(run / "checkpoint2.pt"), str(run / "checkpoint3.pt")]
    saved.build_model(avg)  # loads for translation
    with pytest.raises(SystemExit):
        checkpoint.main([str(run), "--average-last", "9"])


def test_average_command_names_a_truncated_checkpoint_in_one_line(toy_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    make_trainer(toy_corpus, run, max_epochs=2, keep_last=2).fit(job_start=0)
    epoch2 = run / "checkpoint2.pt"
    epoch2.write_bytes(epoch2.read_bytes()[:2000])
    with pytest.raises(SystemExit) as exit_:
        checkpoint.main([str(run), "--average-last", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "checkpoint2.pt: not a readable checkpoint" in err[0]
    assert not (run / "checkpoint_averaged.pt").exists()


MMAPPED_BY_A_TENSOR = """
import ctypes, sys, torch
from mt.runtime import keep_freed_memory_in_the_heap
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2
if sys.argv[1] == "project":
    assert keep_freed_memory_in_the_heap()
before = libc.mallinfo2().hblkhd
x = torch.empty((6 << 20) // 4)  # a 6 MiB activation
print(libc.mallinfo2().hblkhd - before)  # bytes glibc mapped for it with mmap (unmapped again on free)
"""


def has_mallinfo2() -> bool:
    import ctypes

    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")  # glibc >= 2.33
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
@pytest.mark.skipif(not has_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")
def test_freed_activations_stay_in_the_heap():
    """With glibc's defaults a 6 MiB tensor is its own mmap, unmapped on free and faulted in (and zeroed) again by
    the next step; after `keep_freed_memory_in_the_heap()` it comes from the heap, where freed blocks are reused."""
    import subprocess

    def mmapped(mode: str) -> int:
        p = subprocess.run([sys.executable, "-c", MMAPPED_BY_A_TENSOR, mode], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return int(p.stdout)

    assert mmapped("glibc") >= 6 << 20
    assert mmapped("project") == 0


def on_two_ranks(target, *args) -> dict:
    """Run `target(rank, port, *args, out)` in two spawned processes joined by gloo; {rank: what it put in out}."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, port, *args, out)) for rank in (0, 1)]
    for p in procs:
        p.start()
    got = {rank: rest for rank, *rest in (out.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
    return got


def _wait_on_rank(rank: int, port: int, wait_minutes: float | None, out) -> None:
    """One rank of `test_ranks_outwait_rank0_beyond_the_group_timeout`: rank 0 works for 4 s alone, in a process
    group whose own timeout is 1.5 s."""
    from datetime import timedelta

    import torch.distributed as dist

    from mt.train import distributed

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=1.5))  # fmt: skip
    try:
        if wait_minutes is not None:
            distributed.init_waiting(wait_minutes)
        if rank == 0:
            time.sleep(4)  # preparing the corpus, or validating
        try:
            distributed.wait_for_rank0() if wait_minutes is not None else dist.barrier()
            out.put((rank, "went on"))
        except RuntimeError as e:  # gloo's timeout
            out.put((rank, f"timed out: {str(e).splitlines()[0][:80]}"))
    finally:
        dist.destroy_process_group()


def test_ranks_outwait_rank0_beyond_the_group_timeout():
    assert on_two_ranks(_wait_on_rank, 0.5) == {0: ["went on"], 1: ["went on"]}
    plain = on_two_ranks(_wait_on_rank, None)  # what train.py did: a barrier under the group's timeout
    assert plain[1][0].startswith("timed out")


def _should_stop_on_rank(rank: int, port: int, elapsed: list[float], other: list, out) -> None:
    """One rank of `test_ranks_agree_on_why_they_stop`: Trainer._should_stop with this rank's clock and reason."""
    import types

    import torch.distributed as dist

    from mt.train.schedules import Budget

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        budget = Budget(max_updates=0, max_time_min=1.0)
        budget.elapsed, budget.clock_start = elapsed[rank], time.time()
        fake = types.SimpleNamespace(budget=budget, update=7, device=torch.device("cpu"), stop_reason=other[rank])
        out.put((rank, Trainer._should_stop(fake), fake.stop_reason))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "elapsed, reasons, expected",
    [
        # rank 1's clock passes max_time one update before rank 0's: both stop on the budget, so both validate the
        # partial epoch (a collective) instead of rank 0 skipping it while rank 1 waits for it
        ([30.0, 61.0], [None, None], ["max_time", "max_time"]),
        # a signal on one rank and the budget on the other: both stop as interrupted (exit, resume later)
        ([61.0, 30.0], [None, "SIGTERM"], ["SIGTERM", "SIGTERM"]),
        # patience (decided on rank 0) wins over the other rank's budget: neither validates again
        (
            [30.0, 61.0],
            ["no improvement in 3 validations (patience)", None],
            ["no improvement in 3 validations (patience)", "stopped by another rank"],
        ),
    ],
)
def test_ranks_agree_on_why_they_stop(elapsed, reasons, expected):
    from mt.train.distributed import stop_code

    got = on_two_ranks(_should_stop_on_rank, elapsed, reasons)
    assert [got[r][0] for r in range(2)] == [True, True]
    assert [got[r][1] for r in range(2)] == expected
    assert stop_code(got[0][1]) == stop_code(got[1][1])


def test_bpe_dropout_resegments_every_epoch_and_keeps_the_text(toy_corpus, tmp_path):
    """Each epoch draws new segmentations of the same sentences (decoding back to them), within max_len, and the
    trainer batches by the drawn lengths; without bpe_dropout the ids are the deterministic ones."""
    trainer = make_trainer(toy_corpus, tmp_path / "run", max_epochs=2, bpe_dropout=0.3, max_tokens=200)
    segments, vocab = trainer.segments, trainer.corpus.vocabs.src
    train = trainer.corpus.train
    draws = []
    for _ in range(2):
        src_lens, tgt_lens = segments.resegment()
        ids = segments[list(range(len(train)))]
        assert [len(x) + 1 for x in ids["src_ids"]] == src_lens and [len(x) + 1 for x in ids["tgt_ids"]] == tgt_lens
        texts = list(trainer.corpus.train_text)  # the training table holds ids only
        assert vocab.decode_batch(ids["src_ids"]) == [texts[i][0] for i in trainer.corpus.train_rows]
        assert vocab.decode_batch(ids["tgt_ids"]) == [texts[i][1] for i in trainer.corpus.train_rows]
        draws.append(ids)
    assert draws[0] != draws[1]  # new segmentations each epoch
    assert sum(map(len, draws[0]["src_ids"])) > sum(train["src_len"])  # skipped merges: more, shorter pieces

    fed, step = [], trainer.train_step

    def checked_step(batches):  # the model is fed this epoch's draw, not the deterministic ids
        for b in batches:
            drawn = segments[b.ids]
            fed.append(len(b.ids))
            assert b.n_src_tokens == sum(len(x) + 1 for x in drawn["src_ids"])
            assert b.n_tgt_tokens == sum(len(x) + 1 for x in drawn["tgt_ids"])
        return step(batches)

    trainer.train_step = checked_step
    trainer.fit(time.time())
    assert trainer.epochs_done == 2
    assert sum(fed) == 2 * len(train)  # every pair once per epoch

    assert make_trainer(toy_corpus, tmp_path / "plain").segments is None


def test_bpe_dropout_falls_back_to_the_deterministic_segmentation_beyond_max_len(toy_corpus, tmp_path):
    trainer = make_trainer(toy_corpus, tmp_path / "run", bpe_dropout=0.9)
    segments = trainer.segments
    segments.max_len = max(trainer.corpus.train["src_len"])  # every deterministic segmentation fits, few drawn do
    segments.resegment()
    ids = segments[list(range(len(trainer.corpus.train)))]
    assert all(len(x) <= segments.max_len for x in ids["src_ids"] + ids["tgt_ids"])
    assert any(x == f for x, f in zip(ids["src_ids"], segments.fallback["src_ids"]) if len(f) > 3)


def _resegment_on_rank(rank: int, port: int, corpus_dir: Path, run_dir: Path, out) -> None:
    """One rank of `test_bpe_dropout_ranks_batch_the_same_segmentation`."""
    import torch.distributed as dist

    from mt.data.bpe_dropout import BPEDropoutSegments

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        cfg = make_config(corpus_dir, run_dir)
        corpus = prepare_data(cfg, run_dir, cfg.model.max_positions)
        segments = BPEDropoutSegments.of(corpus, 0.5, 127, world=2, rank=rank)
        out.put((rank, [segments.resegment() for _ in range(2)], segments.ids))
    finally:
        dist.destroy_process_group()


def test_bpe_dropout_ranks_batch_the_same_segmentation(toy_corpus, tmp_path):
    """tokenizers' BPE-dropout cannot be seeded: under DDP rank 0 draws and the other ranks receive its draw, so
    every rank cuts the same batches (different ones would give ranks different step counts and hang DDP)."""
    (tmp_path / "run").mkdir()
    prepare_data(make_config(toy_corpus, tmp_path / "run"), tmp_path / "run", 128)  # tokenizer and cache, once
    got = on_two_ranks(_resegment_on_rank, toy_corpus, tmp_path / "run")
    assert got[0] == got[1]
    assert got[0][0][0] != got[0][0][1]  # two epochs, two draws


def test_tensorboard_gets_the_metrics_scalars(toy_corpus, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    trainer = make_trainer(toy_corpus, run, max_epochs=2, valid_bleu=True, clip_norm=1.0, tensorboard=True)
    trainer.fit(job_start=0)
    trainer.metrics.close()
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"train/loss", "train/nll", "train/lr", "train/grad_norm", "train/tgt_tokens_per_s"}
    assert expected | {"valid/valid_loss", "valid/valid_bleu", "valid/valid_chrf"} <= tags
    # the same numbers as metrics.jsonl, at the same updates
    train = [r for r in read_metrics(run) if r["kind"] == "train"]
    logged = events.Scalars("train/loss")
    assert [e.step for e in logged] == [r["update"] for r in train]
    assert [e.value for e in logged] == pytest.approx([r["loss"] for r in train], rel=1e-6)
    valid = [r for r in read_metrics(run) if r["kind"] == "valid"]
    assert [e.value for e in events.Scalars("valid/valid_bleu")] == pytest.approx([r["valid_bleu"] for r in valid])


def test_each_validation_records_its_wall_time(toy_corpus, tmp_path):
    # what +experiment=auto's plan charges a validation (auto.VALIDATION_TOKENS) is measured from these
    run = tmp_path / "run"
    make_trainer(toy_corpus, run, max_epochs=2, valid_bleu=True).fit(job_start=0)
    valid = [r for r in read_metrics(run) if r["kind"] == "valid"]
    assert len(valid) == 2 and all(r["valid_s"] >= r["valid_decode_s"] > 0 for r in valid)


def test_tensorboard_off_writes_no_event_files(toy_corpus, tmp_path):
    run = tmp_path / "run"
    make_trainer(toy_corpus, run, max_epochs=1, tensorboard=False).fit(job_start=0)
    assert (run / "metrics.jsonl").is_file() and not (run / "tb").exists()


def test_failed_save_names_the_path_keeps_the_previous_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint_last.pt"
    checkpoint.save_atomic({"format": 1, "model": {"w": torch.ones(2)}}, path)

    def disk_full(obj, f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(errors.CheckpointError, match=r"checkpoint_last\.pt: could not be written \(No space left"):
        checkpoint.save_atomic({"format": 1, "model": {"w": torch.zeros(2)}}, path, keep_previous=True)
    monkeypatch.undo()
    assert torch.equal(saved.load(path)["model"]["w"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]


def test_resume_falls_back_to_the_checkpoint_before_an_unreadable_last(toy_corpus, tmp_path, caplog):
    run = tmp_path / "run"
    first = make_trainer(toy_corpus, run, max_epochs=2)
    first.fit(job_start=0)
    per_epoch = first.update // 2
    last = run / "checkpoint_last.pt"
    assert saved.load(run_dir.previous(last))["update"] == per_epoch  # the end of epoch 1, kept
    last.write_bytes(last.read_bytes()[:1000])  # truncated on disk
    second = make_trainer(toy_corpus, run, max_epochs=3)
    assert second.resume() and second.update == per_epoch and second.sampler.epoch == 1
    assert "resuming from the checkpoint before it" in caplog.text and "checkpoint_last.pt.prev" in caplog.text


def test_orphaned_temp_files_of_a_killed_save_are_removed(toy_corpus, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / f".checkpoint_last.pt.tmp{os.getpid() + 1}").write_bytes(b"half a checkpoint")
    make_trainer(toy_corpus, run, max_epochs=1)
    assert not list(run.glob(".*tmp*"))


def test_budget_stop_on_an_epochs_last_batch_ends_the_epoch(toy_corpus, tmp_path):
    n = len(make_trainer(toy_corpus, tmp_path / "probe").sampler)  # updates in epoch 1
    trainer = make_trainer(toy_corpus, tmp_path / "run", max_updates=n, keep_last=5)
    assert trainer.fit(job_start=0) == "max_updates"
    assert trainer.epochs_done == 1 and (tmp_path / "run" / "checkpoint1.pt").is_file()
    assert saved.load(tmp_path / "run" / "checkpoint_last.pt")["sampler"] == {"epoch": 1, "position": 0, "seed": 1}


def test_an_fp16_step_skipped_by_the_grad_scaler_is_not_an_update(toy_corpus, tmp_path):
    trainer = make_trainer(toy_corpus, tmp_path / "run")
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)  # what fp16 gets on CUDA
    batch = next(iter(trainer.loader))
    hook = trainer.model.output.weight.register_hook(lambda g: g.clone().fill_(float("inf")))
    lr_before = trainer.scheduler.get_last_lr()
    stats = trainer.train_step([batch])  # finite loss, overflowing gradients
    assert stats["skipped"] and trainer.update == 0 and trainer.scheduler.get_last_lr() == lr_before
    assert trainer.scaler.get_scale() == 2.0**15
    hook.remove()
    trainer.train_step([batch])
    assert trainer.update == 1


def test_test_report_truncates_lines_longer_than_the_model(toy_corpus, tmp_path):
    for lang in ("xx", "yy"):
        with open(toy_corpus / f"test.{lang}", "a") as f:
            f.write(" ".join(["the big red house"] * 100) + "\n")  # 400 words, over max_positions 128
    trainer = make_trainer(toy_corpus, tmp_path / "run", max_epochs=1)
    trainer.fit(job_start=0)
    report = finish(trainer)["reports"][0]
    assert report["sentences"] == 21 and len((tmp_path / "run" / "test.hyp").read_text().splitlines()) == 21


def test_progress_bar_shows_only_when_asked(toy_corpus, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar is drawn
    make_trainer(toy_corpus, tmp_path / "a", max_epochs=1, progress=True).fit(job_start=0)
    assert "epoch 1" in capsys.readouterr().err  # the tqdm bar, on stderr
    make_trainer(toy_corpus, tmp_path / "b", max_epochs=1, progress=False).fit(job_start=0)
    assert "epoch 1" not in capsys.readouterr().err


def _nan_on_one_rank(rank: int, port: int, corpus_dir: Path, run_dir: Path, out) -> None:
    """One rank of `test_a_nan_on_one_rank_skips_the_update_on_every_rank`."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        trainer = Trainer(make_config(corpus_dir, run_dir, max_nan_updates=5), prepare_data(
            make_config(corpus_dir, run_dir), run_dir, 128), run_dir)  # fmt: skip
        batch = next(iter(trainer.loader))
        before = trainer.model.output.weight.detach().clone()
        if rank == 1:
            with torch.no_grad():
                trainer.model.output.weight[7, 0] = float("nan")
        stats = trainer.train_step([batch])
        changed = not torch.equal(trainer.model.output.weight.detach()[8:], before[8:])
        out.put((rank, stats["finite"], trainer.update, trainer.nan_in_a_row, changed))
    finally:
        dist.destroy_process_group()


def test_a_nan_on_one_rank_skips_the_update_on_every_rank(toy_corpus, tmp_path):
    """Gradients are all-reduced before the skip is decided: a rank that stepped while another skipped would take
    NaN weights and count one update more, and the ranks' collectives would then fall out of step."""
    (tmp_path / "run").mkdir()
    prepare_data(make_config(toy_corpus, tmp_path / "run"), tmp_path / "run", 128)
    got = on_two_ranks(_nan_on_one_rank, toy_corpus, tmp_path / "run")
    assert got[0] == got[1] == [False, 0, 1, False]


def test_resume_refuses_a_run_whose_batches_or_updates_would_change(toy_corpus, tmp_path, caplog):
    run = tmp_path / "run"
    make_trainer(toy_corpus, run, max_updates=4, lr=3e-3).fit(job_start=0)
    with pytest.raises(errors.CheckpointError, match=r"train.lr=0.003, this command train.lr=0.001; .*resume_anyway"):
        make_trainer(toy_corpus, run, max_updates=8, lr=1e-3).resume()
    with pytest.raises(errors.CheckpointError, match=r"train.max_tokens=150, this command train.max_tokens=200"):
        make_trainer(toy_corpus, run, max_updates=8, max_tokens=200).resume()
    # what may change between stretches of a run: the budget, validation, logging
    assert make_trainer(toy_corpus, run, max_updates=8, max_epochs=9, valid_bleu=True, log_every=2).resume()
    anyway = make_trainer(toy_corpus, run, max_updates=8, lr=1e-3, resume_anyway=True)
    assert anyway.resume() and anyway.update == 4 and "continuing as train.resume_anyway=true asks" in caplog.text


def test_weight_average_follows_the_warmed_up_decay():
    from mt.model.transformer import Transformer
    from mt.train.ema import WeightEMA

    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), 30, 30)
    ema = WeightEMA(model, decay=0.5)
    expected = None
    for t in range(12):  # the decay: first update copied, then 2/11, 3/12, ..., 9/18 = 0.5, then capped at 0.5
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        weights = {k: v.clone() for k, v in model.named_parameters()}
        d = min(0.5, (1 + t) / (10 + t))  # t: the updates averaged before this one
        expected = weights if expected is None else {k: d * expected[k] + (1 - d) * weights[k] for k in weights}
        ema.update(model)
    averaged = dict(ema.model.named_parameters())
    assert ema.updates == 12
    for k, v in expected.items():
        torch.testing.assert_close(averaged[k], v, rtol=1e-5, atol=1e-6)
        assert not torch.equal(averaged[k], dict(model.named_parameters())[k])


def test_exact_resume_with_a_weight_average(toy_corpus, tmp_path):
    """N updates straight == k, stop, resume, N: bitwise equal trained weights and weight average."""
    N, k = 14, 5
    straight = make_trainer(toy_corpus, tmp_path / "a", max_updates=N, ema_decay=0.9)
    straight.fit(job_start=0)
    first = make_trainer(toy_corpus, tmp_path / "b", max_updates=k, ema_decay=0.9)
    first.fit(job_start=0)
    second = make_trainer(toy_corpus, tmp_path / "b", max_updates=N, ema_decay=0.9)
    second.fit(job_start=0)
    assert second.update == N and second.ema.updates == N
    for a, b in ((straight.model, second.model), (straight.ema.model, second.ema.model)):
        sa, sb = a.state_dict(), b.state_dict()
        assert all(torch.equal(sa[key], sb[key]) for key in sa)
    raw, averaged = straight.model.state_dict(), straight.ema.model.state_dict()
    assert not torch.equal(raw["output.weight"], averaged["output.weight"])


def test_a_run_with_a_weight_average_validates_both_and_keeps_the_average(toy_corpus, tmp_path):
    from mt.decode.loading import load_translator

    run = tmp_path / "run"
    trainer = make_trainer(toy_corpus, run, max_epochs=2, ema_decay=0.99, average_last=0, valid_bleu=True)
    trainer.fit(job_start=0)
    finish(trainer)
    valid = [r for r in read_metrics(run) if r["kind"] == "valid"]
    assert len(valid) == 2 and all({"valid_loss", "valid_bleu", "raw_valid_loss", "raw_valid_bleu"} <= r.keys()
                                   for r in valid)  # fmt: skip
    assert valid[-1]["valid_loss"] != valid[-1]["raw_valid_loss"]
    # What translate.py loads from the run dir is the weight average, not the trained weights.
    model, _, _ = load_translator(saved.load(run), DecodeConfig(), "fp32", torch.device("cpu"))
    decoded, averaged, raw = model.state_dict(), trainer.ema.model.state_dict(), trainer.model.state_dict()
    assert all(torch.equal(decoded[k], averaged[k]) for k in decoded)
    assert not all(torch.equal(decoded[k], raw[k]) for k in decoded)
