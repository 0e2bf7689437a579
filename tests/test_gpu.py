"""The CUDA path: `python -m pytest -m gpu` on a machine with a GPU (skipped cleanly without one).

What a first GPU user runs into: AMP (bf16, fp16 with a GradScaler), search on CUDA, the KV cache's reorder on CUDA,
checkpoints moved between devices, NCCL under torchrun.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mt.config import DecodeConfig
from mt.data.tokenizer import BOS, PAD
from mt.decode.search import beam_search, greedy_search
from mt.model import saved
from mt.model.transformer import Transformer
from mt.train import checkpoint
from tests.conftest import ROOT, tiny_model_config, write_toy_corpus
from tests.test_search import padded_sources

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")


def padded_batch(B: int = 6, S: int = 9, T: int = 8, V: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    tgt = torch.randint(4, V, (B, T), generator=g)
    for i in range(B):  # ragged lengths: padding on both sides
        src[i, S - i :] = PAD
        tgt[i, T - i // 2 :] = PAD
    tgt_in = torch.cat([torch.full((B, 1), BOS), tgt[:, :-1]], 1)
    return src, src.eq(PAD), tgt_in, tgt


def tiny(V: int = 40, **kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model_config(**kw), V, V)


@pytest.fixture
def exact_fp32():
    """fp32 matmuls without TF32 for a comparison, and the session's settings as they were afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    yield
    torch.backends.cuda.matmul.allow_tf32 = before[0]
    torch.set_float32_matmul_precision(before[1])


def test_fp32_forward_and_loss_match_the_cpu(exact_fp32):
    model = tiny().eval()
    src, mask, tgt_in, tgt_out = padded_batch()
    with torch.no_grad():
        cpu_logits = model(src, mask, tgt_in)
        cpu_loss = model.loss(src, mask, tgt_in, tgt_out, 0.1)
        model.cuda()
        gpu_logits = model(src.cuda(), mask.cuda(), tgt_in.cuda())
        gpu_loss = model.loss(src.cuda(), mask.cuda(), tgt_in.cuda(), tgt_out.cuda(), 0.1)
    torch.testing.assert_close(gpu_logits.cpu(), cpu_logits, atol=1e-4, rtol=1e-4)
    for a, b in zip(gpu_loss, cpu_loss):
        torch.testing.assert_close(a.cpu(), b, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_with_padding_masks_matches_the_math_path(dtype):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(4, 8, 12, 64, device=CUDA, dtype=dtype) for _ in range(3))
    allow = torch.ones(4, 1, 1, 12, dtype=torch.bool, device=CUDA)
    allow[1, ..., 7:] = False
    allow[3, ..., 3:] = False
    fast = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allow)
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=allow)
    torch.testing.assert_close(fast.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_precision_steps_are_finite_and_the_loss_falls(dtype):
    model = tiny(dropout=0.0).cuda().train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    src, mask, tgt_in, tgt_out = (t.cuda() for t in padded_batch())
    losses = []
    for _ in range(20):
        with torch.autocast("cuda", dtype=dtype):
            loss, _ = model.loss(src, mask, tgt_in, tgt_out, 0.1)
        scaler.scale(loss / tgt_out.ne(PAD).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.7 * losses[0]


def test_fused_projection_loss_gradients_in_fp16_match_the_unfused_ones():
    """The fused loss forms the output layer's gradient before the loss scale applies: it must not underflow."""
    from benchmarks.speed.reference_loss import label_smoothed_loss
    from mt.model.loss import projected_label_smoothed_loss

    torch.manual_seed(0)
    h = (torch.randn(512, 128, device=CUDA) * 0.5).requires_grad_()
    w = (torch.randn(8000, 128, device=CUDA) * 0.05).requires_grad_()
    target = torch.randint(4, 8000, (512,), device=CUDA)
    grads = []
    for fused in (True, False):
        with torch.autocast("cuda", dtype=torch.float16):
            if fused:
                loss, _ = projected_label_smoothed_loss(h, w, target, 0.1)
            else:
                loss, _ = label_smoothed_loss(h @ w.t(), target, 0.1)
        gh, gw = torch.autograd.grad(loss * 1024.0, (h, w))  # a loss scale, as the GradScaler applies
        grads.append((gh.float() / 1024, gw.float() / 1024))
    (fh, fw), (uh, uw) = grads
    torch.testing.assert_close(fh, uh, atol=2e-3, rtol=2e-2)
    torch.testing.assert_close(fw, uw, atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("beam", [1, 4])
def test_search_on_cuda_gives_the_cpu_tokens_and_cached_equals_uncached(trained_model, beam, exact_fp32):
    """The best hypotheses' tokens, and every n-best entry's score; the n-best's order only where its scores are
    apart by more than float noise (near-ties may swap between devices)."""
    trained = trained_model
    try:
        src, mask = padded_sources()
        search = greedy_search if beam == 1 else beam_search
        cfg = dict(beam_size=beam, nbest=beam, length_penalty=1.0)
        cpu = search(trained, src, mask, DecodeConfig(**cfg))
        model = trained.to(CUDA)
        gpu = search(model, src.cuda(), mask.cuda(), DecodeConfig(**cfg))
        uncached = search(model, src.cuda(), mask.cuda(), DecodeConfig(use_cache=False, **cfg))
    finally:
        trained.cpu()
    for other in (gpu, uncached):
        for hs, ref in zip(other, cpu):
            assert [h.score for h in hs] == pytest.approx([h.score for h in ref], abs=1e-4)
            for i, (h, r) in enumerate(zip(hs, ref)):
                apart = all(abs(r.score - o.score) > 1e-4 for j, o in enumerate(ref) if j != i)
                assert h.tokens == r.tokens or not apart


def run(args, env_extra=None):
    import os

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def train_args(corpus, run_dir, *extra):
    return [
        "train.py", "data=local", f"data.dir={corpus}", "data.src_lang=xx", "data.tgt_lang=yy",
        "model=transformer_tiny", "tokenizer.vocab_size=60", "tokenizer.min_frequency=1", "train.max_tokens=300",
        "train.progress=false", "decode=greedy", f"run_dir={run_dir}", *extra,
    ]  # fmt: skip


def test_checkpoints_move_between_devices(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus")
    # written on CUDA, translated on the CPU
    p = run(train_args(corpus, tmp_path / "gpu", "train.device=cuda", "train.max_epochs=1"))
    assert p.returncode == 0, p.stderr[-2000:]
    t = subprocess.run([sys.executable, "translate.py", f"checkpoint={tmp_path / 'gpu'}", "device=cpu"], cwd=ROOT,
                       input="the cat\n", capture_output=True, text=True, timeout=300)  # fmt: skip
    assert t.returncode == 0 and len(t.stdout.splitlines()) == 1, t.stderr[-2000:]
    # written on the CPU, resumed on CUDA
    p = run(train_args(corpus, tmp_path / "cpu", "train.device=cpu", "train.max_epochs=1"))
    assert p.returncode == 0, p.stderr[-2000:]
    p = run(train_args(corpus, tmp_path / "cpu", "train.device=cuda", "train.max_epochs=2"))
    assert p.returncode == 0 and "resumed from" in p.stderr, p.stderr[-2000:]


def test_resume_with_fewer_visible_gpus_than_the_saving_run():
    state = checkpoint.rng_state()
    state["cuda"] = [torch.cuda.get_rng_state()] * (torch.cuda.device_count() + 3)  # saved on a bigger machine
    checkpoint.set_rng_state(state)  # restores the visible devices' states, ignores the rest


def test_resume_on_cuda_continues_like_the_uninterrupted_run(tmp_path):
    """Deterministic algorithms on (train.deterministic): the resumed run's weights equal the uninterrupted run's."""
    corpus = write_toy_corpus(tmp_path / "corpus")
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    common = ["train.device=cuda", "train.precision=fp32", "train.average_last=0", "data.test_splits=[]",
              "train.deterministic=true"]  # fmt: skip
    assert run(train_args(corpus, tmp_path / "a", *common, "train.max_updates=24"), env).returncode == 0
    assert run(train_args(corpus, tmp_path / "b", *common, "train.max_updates=10"), env).returncode == 0
    p = run(train_args(corpus, tmp_path / "b", *common, "train.max_updates=24"), env)
    assert p.returncode == 0 and "resumed from" in p.stderr, p.stderr[-2000:]
    a = saved.load(tmp_path / "a" / "checkpoint_last.pt")["model"]
    b = saved.load(tmp_path / "b" / "checkpoint_last.pt")["model"]
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-6, f"largest difference {worst}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank: two ranks need two GPUs")
def test_torchrun_two_processes_with_nccl(tmp_path):
    """Two ranks over NCCL (one process alone never creates a process group). NCCL refuses two ranks on one GPU,
    so a one-GPU machine cannot run this: there only the gloo path (tests/test_cuda_on_cpu.py) is checked."""
    corpus = write_toy_corpus(tmp_path / "corpus")
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    p = run(cmd + train_args(corpus, tmp_path / "run", "train.device=cuda", "train.max_epochs=2"))
    assert p.returncode == 0 and "training stopped" in p.stderr, p.stderr[-3000:]
    assert "process group: nccl, 2 ranks" in p.stderr


def test_an_update_and_a_search_step_wait_for_the_gpu_at_most_once(tmp_path, trained_model, monkeypatch):
    """CUDA's own sync detection (torch.cuda.set_sync_debug_mode), which sees what the CPU harness's counter
    cannot (boolean indexing, blocking copies): one synchronisation per update, and per beam step with at most three
    more per search, the bound tests/test_cuda_on_cpu.py holds the host reads to (on the H200, 2026-11-27: 3 in 3
    updates, 10 in a beam search of at least 7 steps)."""
    import warnings

    from tests.test_cuda_on_cpu import count_steps
    from tests.test_training import make_trainer

    corpus = write_toy_corpus(tmp_path / "corpus")
    trainer = make_trainer(corpus, tmp_path / "run", device="cuda", precision="fp16", ema_decay=0.99, clip_norm=1.0)
    batches = iter(trainer.loader)
    trainer.train_step([next(batches)])  # first-use initialisations
    src, mask = padded_sources()
    model = trained_model.to(CUDA)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            for _ in range(3):
                trainer.train_step([next(batches)])
            in_training = syncs(caught)
            steps = count_steps(monkeypatch)
            hyps = beam_search(model, src.cuda(), mask.cuda(), DecodeConfig(beam_size=4, length_penalty=1.0))
            in_search = syncs(caught) - in_training
    finally:
        torch.cuda.set_sync_debug_mode("default")
        trained_model.cpu()
    assert any(h[0].tokens for h in hyps) and steps[0] >= 5
    assert in_training <= 3, [str(w.message) for w in caught[:5]]
    assert in_search <= steps[0] + 3, f"{in_search} synchronisations in {steps[0]} steps"


def syncs(caught: list) -> int:
    """The synchronisations among the recorded warnings (the first also carries the debug mode's own notice that it
    is a prototype, which on the H200 made three updates' three syncs count four)."""
    return sum("called a synchronizing" in str(w.message) for w in caught)
