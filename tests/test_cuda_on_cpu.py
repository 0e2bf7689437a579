"""The CUDA path, driven on the CPU: the `cuda_branches` fixture takes every `mt.runtime.on_cuda` branch (fused Adam,
the GradScaler under fp16, padding masked in the loss, pinned prefetch); what it computes must equal the CPU path,
and each update and search step may read the device once. Also the multi-node launch (two torchrun "nodes" on
loopback, gloo). What no CPU can show (NCCL, the CUDA kernels, real synchronisation) is in tests/test_gpu.py."""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from mt.config import DecodeConfig
from mt.decode.search import beam_search, greedy_search
from mt.model import saved
from mt.train import checkpoint
from tests.conftest import ROOT, HostReads, write_toy_corpus
from tests.test_search import padded_sources
from tests.test_training import make_trainer, on_two_ranks, params, read_metrics, record_batches


def overflow_first(trainer, n: int):
    """Make the first `n` backward passes' output-layer gradients infinite (an fp16 overflow)."""
    left = [n]

    def hook(grad):
        if left[0] > 0:
            left[0] -= 1
            return torch.full_like(grad, float("inf"))
        return grad

    return trainer.model.output.weight.register_hook(hook)


# ------------------------------------------------------------------ what the CUDA path computes


def test_the_cuda_path_computes_the_cpu_paths_losses_and_gradients(toy_corpus, tmp_path, request):
    """Padding masked (not dropped) in the loss and 8,192-row loss chunks: the same loss sums and gradients of the
    same batches; then fused Adam on prefetched, pinned batches: the same training and validation losses over 12
    updates. (Weights are not compared after several updates: Adam's eps of 1e-9 turns float noise in near-zero
    gradients into steps of the learning rate's size.)"""
    runs = {}
    for path in ("cpu", "cuda"):
        if path == "cuda":
            pinned = request.getfixturevalue("cuda_branches")
        trainer = make_trainer(toy_corpus, tmp_path / path, max_updates=12, log_every=1, model=dict(dropout=0.0))
        batches = list(trainer.loader)[:2]
        stats = trainer.backward(batches)
        grads = [p.grad.clone() for p in trainer.model.parameters()]
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.fit(job_start=0)
        runs[path] = (stats, grads, read_metrics(tmp_path / path), trainer)
    (cpu_stats, cpu_grads, cpu_log, _), (stats, grads, log, cuda) = runs["cpu"], runs["cuda"]
    assert cuda.optimizer.param_groups[0]["fused"] and cuda.loader.prefetch and len(pinned) >= 12
    torch.testing.assert_close(stats["loss"], cpu_stats["loss"], rtol=1e-5, atol=0)
    for a, b in zip(grads, cpu_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for kind in ("train", "valid"):
        ours = [r["loss" if kind == "train" else "valid_loss"] for r in log if r["kind"] == kind]
        theirs = [r["loss" if kind == "train" else "valid_loss"] for r in cpu_log if r["kind"] == kind]
        assert len(ours) == len(theirs) > 0 and ours == pytest.approx(theirs, rel=1e-4)


def test_the_cuda_path_resumes_exactly(toy_corpus, tmp_path, cuda_branches):
    straight = make_trainer(toy_corpus, tmp_path / "a", max_updates=14)
    order_a = record_batches(straight)
    straight.fit(job_start=0)
    first = make_trainer(toy_corpus, tmp_path / "b", max_updates=5)
    order_b = record_batches(first)
    first.fit(job_start=0)
    second = make_trainer(toy_corpus, tmp_path / "b", max_updates=14)
    order_b2 = record_batches(second)
    second.fit(job_start=0)
    assert order_a == order_b + order_b2
    a, b = params(straight), params(second)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("beam", [1, 4])
def test_the_cuda_path_searches_as_the_cpu_path_does(trained_model, beam, request):
    src, mask = padded_sources()
    cfg = DecodeConfig(beam_size=beam, nbest=beam, length_penalty=1.0)
    search = greedy_search if beam == 1 else beam_search
    cpu = search(trained_model, src, mask, cfg)
    request.getfixturevalue("cuda_branches")  # torch's topk instead of the blocked CPU one
    cuda = search(trained_model, src, mask, cfg)
    assert [[h.tokens for h in hs] for hs in cuda] == [[h.tokens for h in hs] for hs in cpu]
    for hs_cuda, hs_cpu in zip(cuda, cpu):
        assert [h.score for h in hs_cuda] == pytest.approx([h.score for h in hs_cpu], abs=1e-5)


# ------------------------------------------------------------------ reads of the device, collectives


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_an_update_reads_the_device_once(toy_corpus, tmp_path, monkeypatch, cuda_branches, precision):
    """fp16 (GradScaler), a weight average, clipping: one read per update (whether the loss and the gradients are
    finite, and the clock), as docs/gpu.md says. Before: 3 under fp16 (two loss-scale reads), 6 with the average."""
    reads = HostReads(monkeypatch)
    trainer = make_trainer(toy_corpus, tmp_path / "run", precision=precision, ema_decay=0.99, clip_norm=1.0)
    assert trainer.scaler.is_enabled() == (precision == "fp16")
    batches = iter(trainer.loader)
    counts = []
    for _ in range(5):
        batch = next(batches)
        with reads:
            trainer.train_step([batch])
        counts.append(reads.count)
    assert trainer.update == 5 and counts == [1] * 5


def count_steps(monkeypatch) -> list[int]:
    import mt.decode.search

    steps = [0]
    step = mt.decode.search._next_logits

    def counted(*args):
        steps[0] += 1
        return step(*args)

    monkeypatch.setattr(mt.decode.search, "_next_logits", counted)
    return steps


@pytest.mark.parametrize("beam", [1, 5])
def test_a_search_step_reads_the_device_once(trained_model, monkeypatch, cuda_branches, beam):
    """One read per step (greedy: whether all sentences ended; beam: the step's candidates at once), and at most
    three more per search (the length limits, greedy's tokens and scores). Before: 9 per beam step, 3 per greedy
    step."""
    src, mask = padded_sources()
    reads, steps = HostReads(monkeypatch), count_steps(monkeypatch)
    search = greedy_search if beam == 1 else beam_search
    with reads:
        hyps = search(trained_model, src, mask, DecodeConfig(beam_size=beam, nbest=1, length_penalty=1.0))
    assert any(h[0].tokens for h in hyps) and steps[0] >= 5
    assert reads.count <= steps[0] + 3, f"{reads.count} reads in {steps[0]} steps"


def _collectives_per_update(rank: int, port: int, corpus: Path, run_dir: Path, out) -> None:
    """One rank of `test_ddp_takes_two_collectives_per_update`."""
    import torch.distributed as dist

    from mt.data.corpus import prepare_data
    from mt.train.trainer import Trainer
    from tests.test_training import make_config

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        cfg = make_config(corpus, run_dir, schedule="linear", max_time=10.0, cooldown=0.1)
        trainer = Trainer(cfg, prepare_data(cfg, run_dir, 128), run_dir)
        calls = []
        for name in ("all_reduce", "all_gather", "all_gather_object", "broadcast", "barrier"):
            original = getattr(dist, name)
            setattr(dist, name, functools.partial(lambda f, n, *a, **k: (calls.append(n), f(*a, **k))[1], original,
                                                  name))  # fmt: skip
        batches = iter(trainer.loader)
        for _ in range(3):
            trainer.train_step([next(batches)])
        out.put((rank, calls, trainer.update))
    finally:
        dist.destroy_process_group()


def test_ddp_takes_two_collectives_per_update(toy_corpus, tmp_path):
    """Besides DDP's gradient buckets: the token count, and one packed all_reduce for finite / overflow / stop /
    clock. Before: up to four (token count, finite, budget, stop)."""
    (tmp_path / "run").mkdir()
    from mt.data.corpus import prepare_data
    from tests.test_training import make_config

    prepare_data(make_config(toy_corpus, tmp_path / "run"), tmp_path / "run", 128)
    got = on_two_ranks(_collectives_per_update, toy_corpus, tmp_path / "run")
    for rank in (0, 1):
        calls, updates = got[rank]
        assert updates == 3 and calls == ["all_reduce"] * 6, calls


def _dropout_draws(rank: int, port: int, corpus: Path, run_dir: Path, out) -> None:
    import torch.distributed as dist

    from mt.data.corpus import prepare_data
    from mt.train.trainer import Trainer
    from tests.test_training import make_config

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        cfg = make_config(corpus, run_dir)
        trainer = Trainer(cfg, prepare_data(cfg, run_dir, 128), run_dir)
        out.put((rank, trainer.model.output.weight.tolist(), torch.rand(8).tolist()))  # lists: the process ends
    finally:
        dist.destroy_process_group()


def test_ranks_start_from_the_same_weights_but_draw_their_own_dropout(toy_corpus, tmp_path):
    (tmp_path / "run").mkdir()
    from mt.data.corpus import prepare_data
    from tests.test_training import make_config

    prepare_data(make_config(toy_corpus, tmp_path / "run"), tmp_path / "run", 128)
    got = on_two_ranks(_dropout_draws, toy_corpus, tmp_path / "run")
    assert got[0][0] == got[1][0] and got[0][1] != got[1][1]


# ------------------------------------------------------------------ resuming onto another device or precision


def test_a_cpu_fp32_run_resumes_on_cuda_in_fp16(toy_corpus, tmp_path, request):
    """The CPU run saved an empty GradScaler state and foreach Adam: the CUDA run loads neither (before: "The source
    state dict is empty", then GradScaler's "Expected grad_scale and found_inf to be None" from foreach Adam)."""
    make_trainer(toy_corpus, tmp_path / "run", max_updates=4).fit(job_start=0)
    request.getfixturevalue("cuda_branches")
    resumed = make_trainer(toy_corpus, tmp_path / "run", max_updates=8, precision="fp16")
    assert resumed.resume() and resumed.update == 4
    group = resumed.optimizer.param_groups[0]
    assert group["fused"] and not group["foreach"] and resumed.scaler.is_enabled()
    resumed.fit(job_start=0, resume=False)
    assert resumed.update == 8


def test_a_cuda_run_resumes_on_the_cpu_with_foreach_adam(toy_corpus, tmp_path, monkeypatch, request):
    request.getfixturevalue("cuda_branches")
    make_trainer(toy_corpus, tmp_path / "run", max_updates=4).fit(job_start=0)
    monkeypatch.undo()  # back on the CPU's paths
    resumed = make_trainer(toy_corpus, tmp_path / "run", max_updates=8)
    assert resumed.resume()
    group = resumed.optimizer.param_groups[0]
    assert group["foreach"] and not group["fused"]
    resumed.fit(job_start=0, resume=False)
    assert resumed.update == 8


# ------------------------------------------------------------------ skipped updates


def test_a_skipped_update_neither_logs_nor_validates(toy_corpus, tmp_path):
    """fp16 overflows at update 0: no validation of the random weights, no best checkpoint for update 0, one record
    per update (before: a validation and a log record for every skipped step)."""
    trainer = make_trainer(toy_corpus, tmp_path / "run", max_updates=3, valid_every=1, log_every=1, patience=2)
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)  # what fp16 gets on CUDA
    overflow_first(trainer, 3)
    assert trainer.fit(job_start=0) == "max_updates"
    records = read_metrics(tmp_path / "run")
    assert [r["update"] for r in records if r["kind"] == "valid"] == [1, 2, 3]
    assert [r["update"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert trainer.scaler.get_scale() == 2.0**13


# ------------------------------------------------------------------ how often checkpoints are written


def count_saves(monkeypatch) -> list[tuple[str, int]]:
    saves = []
    save = checkpoint.save_atomic

    def counted(obj, path, keep_previous=False):
        save(obj, path, keep_previous)
        saves.append((path.name, path.stat().st_size))

    monkeypatch.setattr(checkpoint, "save_atomic", counted)
    return saves


@pytest.mark.parametrize(
    "save_every, keep_last, expected_last",
    [(0.0, 3, 3), (1e6, 0, 1), (1e-9, 0, 30)],  # every epoch's end (today's default), only at the stop, every update
    ids=["every epoch", "only at the stop", "every update"],
)
def test_checkpoints_written_per_epoch(toy_corpus, tmp_path, monkeypatch, save_every, keep_last, expected_last):
    saves = count_saves(monkeypatch)
    trainer = make_trainer(toy_corpus, tmp_path / "run", max_epochs=3, save_every=save_every, keep_last=keep_last)
    per_epoch = len(trainer.sampler)
    trainer.fit(job_start=0)
    last = [size for name, size in saves if name == "checkpoint_last.pt"]
    epochs = [name for name, _ in saves if name.startswith("checkpoint") and name[10:-3].isdigit()]
    assert per_epoch == 10 and len(last) == expected_last
    assert len(epochs) == (3 if keep_last else 0)
    bytes_per_epoch = sum(size for name, size in saves if name != "checkpoint_best.pt") / 3
    print(f"save_every={save_every}: {len(last) / 3:.1f} checkpoint_last.pt and {bytes_per_epoch:,.0f} bytes per epoch")


def test_a_run_resumes_exactly_from_a_checkpoint_written_inside_an_epoch(toy_corpus, tmp_path, monkeypatch):
    """A crash (no stop, no save) at update 13: the resume continues from the save_every checkpoint of update 12,
    in the middle of epoch 2, and ends as the uninterrupted run does."""
    straight = make_trainer(toy_corpus, tmp_path / "a", max_updates=20)
    order_a = record_batches(straight)
    straight.fit(job_start=0)
    crashing = make_trainer(toy_corpus, tmp_path / "b", max_updates=20, save_every=1e-9)
    order_b = record_batches(crashing)
    step = crashing.train_step

    def crash_at_13(batches):
        stats = step(batches)
        if crashing.update == 13:
            raise KeyboardInterrupt("the machine went away")
        return stats

    crashing.train_step = crash_at_13
    with pytest.raises(KeyboardInterrupt):
        crashing.fit(job_start=0)
    assert saved.load(tmp_path / "b" / "checkpoint_last.pt")["update"] == 12
    resumed = make_trainer(toy_corpus, tmp_path / "b", max_updates=20, save_every=1e-9)
    order_b2 = record_batches(resumed)
    resumed.fit(job_start=0)
    assert order_a == order_b[:12] + order_b2
    a, b = params(straight), params(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ decoding settings


def test_test_reports_decode_in_fp32_whatever_the_training_autocast(toy_corpus, tmp_path, monkeypatch):
    """So that `translate.py checkpoint=RUN` (fp32 by default) reproduces the report's BLEU."""
    import mt.decode.batched
    import mt.train.finish

    trainer = make_trainer(toy_corpus, tmp_path / "run", max_updates=2)
    trainer.fit(job_start=0)
    trainer.amp = torch.bfloat16  # what precision=auto trains with on an AMX CPU or an Ampere GPU
    used = []
    decode = mt.decode.batched.translate_ids
    monkeypatch.setattr(mt.train.finish, "translate_ids", lambda *a, **k: (used.append(a[-1]), decode(*a, **k))[1])
    report = mt.train.finish.finish(trainer)["reports"][0]
    assert used == [None] and report["precision"] == "fp32"


def test_int8_is_quantized_once_at_load_and_dropped_on_cuda(trained_model, monkeypatch, caplog, request):
    """translate.py and the server load through `load_translator`: int8 made once there, not per served batch
    (before: a deep copy and quantization per batch); on CUDA a warning and no int8 (before: every request failed)."""
    import mt.decode.batched
    import mt.decode.loading
    import mt.model.saved
    from mt.model.quantize import quantize_int8

    made = []
    monkeypatch.setattr(mt.decode.loading, "quantize_int8", lambda m: (made.append(1), quantize_int8(m))[1])
    monkeypatch.setattr(mt.decode.batched, "quantize_int8", lambda m: (made.append(1), quantize_int8(m))[1])
    monkeypatch.setattr(mt.model.saved, "build_model", lambda ckpt: (trained_model, None))
    src = [[5, 6, 7], [8, 9]]
    for device_is_cuda in (False, True):
        if device_is_cuda:
            request.getfixturevalue("cuda_branches")  # a run whose saved settings say int8, served on a GPU
        decode = DecodeConfig(quantize="int8", beam_size=2)
        model, _, _ = mt.decode.loading.load_translator({"format": 1}, decode, "fp32", torch.device("cpu"))
        for _ in range(3):  # three served batches
            assert mt.decode.batched.decode_ids(model, src, decode, torch.device("cpu"), None)
    assert len(made) == 1 and model is trained_model and decode.quantize == "none"
    assert "decode.quantize=int8 runs on the CPU only; decoding on cpu without it" in caplog.text


# ------------------------------------------------------------------ torch.compile under DDP


def test_compile_wraps_ddp_with_dynamic_shapes_and_compiles_once(toy_corpus, tmp_path, monkeypatch):
    """Differently shaped batches: no recompile after the first (before: DDP over a compiled module, and a
    recompile when the shape first changed)."""
    import torch.distributed as dist
    from torch._dynamo.testing import CompileCounter

    from mt.train.trainer import wrap_for_training

    counter = CompileCounter()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counter))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        torch._dynamo.reset()
        trainer = make_trainer(toy_corpus, tmp_path / "run", compile=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapped = wrap_for_training(trainer.model, trainer.tc, 2, trainer.device)  # as under torchrun
        assert isinstance(wrapped._orig_mod, torch.nn.parallel.DistributedDataParallel)
        ddp = wrapped._orig_mod  # the positions are fixed: no broadcast before every forward (the attribute's names)
        assert not getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", True))
        assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
        shapes, frames = set(), []
        for b in list(trainer.loader)[:6]:
            loss, _ = wrapped(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)
            loss.backward()
            shapes.add((b.src.shape, b.tgt_in.shape))
            frames.append(counter.frame_count)
        assert len(shapes) >= 4 and frames[0] >= 1 and frames[-1] == frames[0], frames
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()


# ------------------------------------------------------------------ two torchrun "nodes" on loopback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(corpus: Path, run_dirs: tuple[Path, Path], *extra: str) -> list[subprocess.CompletedProcess]:
    """train.py on two torchrun nodes of one process each (c10d rendezvous on loopback, gloo), node i in
    run_dirs[i]; bounded by a timeout, so a hang fails the test."""
    port = free_port()
    procs = []
    for node, run_dir in enumerate(run_dirs):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               f"--node_rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "train.py",
               "data=local", f"data.dir={corpus}", "data.src_lang=xx", "data.tgt_lang=yy", "model=transformer_tiny",
               "tokenizer.vocab_size=60", "tokenizer.min_frequency=1", "train.max_tokens=300", "train.progress=false",
               "train.device=cpu", "train.precision=fp32", "train.valid_bleu=false", "train.average_last=0",
               "data.test_splits=[]", f"run_dir={run_dir}", *extra]  # fmt: skip
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("two-node training hung")
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def test_two_nodes_sharing_the_run_dir_train_and_resume_exactly(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    for node in two_nodes(corpus, (straight, straight), "train.max_updates=10"):
        assert node.returncode == 0, node.stderr[-2000:]
    for node in two_nodes(corpus, (stopped, stopped), "train.max_updates=4"):
        assert node.returncode == 0, node.stderr[-2000:]
    resumed = two_nodes(corpus, (stopped, stopped), "train.max_updates=10")
    assert all(n.returncode == 0 for n in resumed) and "resumed from" in resumed[0].stderr, resumed[0].stderr[-2000:]
    a = saved.load(straight / "checkpoint_last.pt")
    b = saved.load(stopped / "checkpoint_last.pt")
    assert a["update"] == b["update"] == 10
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_two_nodes_with_separate_run_dirs_stop_in_one_line(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus")
    nodes = two_nodes(corpus, (tmp_path / "node0", tmp_path / "node1"), "train.max_updates=4")
    for node in nodes:
        errors = [line for line in node.stderr.splitlines() if line.startswith("error: ")]
        assert node.returncode != 0 and len(errors) == 1, node.stderr[-2000:]
        assert "must be on a filesystem shared by all nodes: rank(s) 1 do not see" in errors[0]
    assert not (tmp_path / "node1" / "tokenizer.json").exists()  # node 1 trained no BPE of its own


# ------------------------------------------------------------------ smaller


def test_ctranslate2_decodes_on_the_cuda_device_it_is_given(monkeypatch, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    import mt.decode.ct2

    seen = {}
    monkeypatch.setattr(ctranslate2, "Translator", lambda path, **kw: seen.update(kw))
    monkeypatch.setattr(mt.decode.ct2.saved, "tokenizer_files", lambda path, config: None)
    monkeypatch.setattr(mt.decode.ct2, "vocabs_from_json", lambda d: None)
    (tmp_path / "mt.json").write_text('{"model_args": {"model": {}}, "config": {}, "quantization": null}')
    mt.decode.ct2.CTranslate2Model(tmp_path, torch.device("cuda", 1), threads=1)
    assert seen["device"] == "cuda" and seen["device_index"] == 1


def test_the_cuda_allocator_gets_expandable_segments_unless_configured(monkeypatch):
    from mt.runtime import prefer_expandable_segments

    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    prefer_expandable_segments()
    import os

    assert os.environ["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.delenv("PYTORCH_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")  # the user's own setting stays
    prefer_expandable_segments()
    assert "PYTORCH_ALLOC_CONF" not in os.environ


def test_the_training_benchmark_runs_without_transformers():
    """benchmarks/gpu_kit.sh run measures the HF Marian peer where transformers is installed (the GPU image has
    it), the others without it (before: an ImportError ended the benchmark)."""
    code = (
        "import sys, runpy; sys.modules['transformers'] = None; sys.argv = ['train_peers.py', '--shape', 'small', "
        "'--dtypes', 'fp32', '--tokens', '300', '--steps', '1', '--warmup', '0']; "
        "runpy.run_path('benchmarks/peers/train_peers.py', run_name='__main__')"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "HF Marian: skipped" in p.stdout and "torch.nn.Transformer" in p.stdout


def test_deterministic_training_turns_on_deterministic_algorithms(toy_corpus, tmp_path):
    """`train.deterministic` (what tests/test_gpu.py's resume test sets on CUDA): the flag and cuBLAS's workspace."""
    import os

    assert not torch.are_deterministic_algorithms_enabled()
    try:
        make_trainer(toy_corpus, tmp_path / "run", deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("failing", ["", "translate.py"])
def test_the_gpu_kit_fails_loudly_and_writes_into_its_own_folder(tmp_path, failing):
    """benchmarks/gpu_kit.sh run, with a stand-in python that fails `failing`'s steps. Before: the kit exited 0
    whatever failed, and compared hypotheses at fixed /tmp paths, which on a reused machine were an earlier run's.
    Now every step still runs, each failure is named in summary.txt and the kit exits 1; what it writes besides
    its output folder goes to a folder of its own."""
    import gzip
    import os
    import shutil

    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "gpu_kit.sh", root / "benchmarks")
    (root / ".gpudata" / "multi30k").mkdir(parents=True)
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            with gzip.open(root / ".gpudata" / "multi30k" / f"{split}.{lang}.gz", "wt") as f:
                f.write("a line\n")
    stub = tmp_path / "bin"
    stub.mkdir()
    fail = f'  *{failing}*) echo "stand-in failure" >&2; exit 3;;\n' if failing else ""
    (stub / "python").write_text(f'#!/bin/sh\ncase "$*" in\n{fail}  *) exit 0;;\nesac\n')
    (stub / "python").chmod(0o755)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "TMPDIR": str(tmp_path / "tmp")}
    env.pop("OUT", None)
    p = subprocess.run(["bash", str(root / "benchmarks" / "gpu_kit.sh"), "run", str(tmp_path / "out"), "--device",
                        "cpu"], capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert [d.name[:8] for d in (tmp_path / "tmp").iterdir()] == ["gpu_kit."]  # the run's own folder
    if not failing:
        assert p.returncode == 0 and "FAILED" not in summary, summary
        return
    assert p.returncode == 1, p.stderr[-2000:]
    names = ("gpu_fp32", "gpu_bf16", "cpu_fp32", "speed_5_1500", "speed_greedy_16000")
    assert all(f"FAILED: translate {name} (exit 3)" in summary for name in names), summary
    assert "FAILED steps: translate gpu_fp32" in summary and "training throughput" in summary  # the rest ran
    assert "identical" not in summary  # failed decodes are not compared


def test_the_probe_waits_for_the_device_before_it_stops_the_clock(monkeypatch, cuda_branches):
    """A CUDA update returns before its kernels have run: the probe's clock must stop after a synchronize, or it times
    the launches and the rule plans the run several times too long."""
    import time

    from mt.train import probe

    events: list[str] = []
    clock = time.perf_counter
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(f"synchronize {device}"))
    monkeypatch.setattr(probe.time, "perf_counter", lambda: events.append("clock") or clock())
    tiny = {"d_model": 16, "n_heads": 2, "d_ff": 32, "encoder_layers": 1, "decoder_layers": 1}
    trial = probe._Trial(tiny, torch.device("cpu"), "fp32", 64, False)
    events.clear()
    assert trial.rate(2) > 0
    assert events == ["clock", "synchronize cpu", "clock"]


def test_on_a_gpu_the_probe_times_the_long_schedules_batch_and_keys_its_figures_by_it(cuda_branches):
    """At 2,048 tokens a GPU update of the compact model is bound by its kernel launches: the probe would read a
    fraction of the tokens a second training's 4,096-token batches reach, and the rule would plan a GPU run as a
    slow machine's. Figures cached from smaller batches are not reused."""
    from mt.train import auto, probe

    tiny = {"d_model": 16, "n_heads": 2, "d_ff": 32, "encoder_layers": 1, "decoder_layers": 1}
    trial = probe._Trial(tiny, torch.device("cpu"), "fp32", 64, False)
    assert probe.CUDA_TOKENS == auto.LONG_TOKENS
    assert trial.tokens == [probe.CUDA_TOKENS // probe.SENTENCE * probe.SENTENCE]
    assert sum(int(n) for n in (~trial.batches[0][1]).sum(1)) == trial.tokens[0]  # the batch holds them
    key = probe.cache_key(("compact", 64, False), tiny, torch.device("cpu"), "fp32")
    assert f"batch {probe.CUDA_TOKENS}|" in key
