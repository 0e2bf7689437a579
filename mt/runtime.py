"""Where and how numbers are computed: the device, autocast precision, and the allocator setting for the CPU."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys

import torch

from mt.config import ConfigError


def keep_freed_memory_in_the_heap() -> bool:
    """Stop glibc malloc from handing each step's large tensors back to the kernel (Linux/glibc only); the entry
    points call it first. Returns whether the settings took.

    By default glibc serves large blocks with mmap and unmaps them on free, so every training or decoding step
    page-faults (and the kernel zeroes) its activations anew; `benchmarks/speed/allocator.py` measures the difference.
    """
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # from <malloc.h>
    settings = ((m_mmap_threshold, 32 << 20), (m_trim_threshold, 1 << 30), (m_top_pad, 64 << 20))
    # 32 MiB is the largest mmap threshold glibc accepts on 64-bit
    return all(libc.mallopt(option, value) == 1 for option, value in settings)


def prefer_expandable_segments() -> None:
    """CUDA's caching allocator with expandable segments, unless the user configured the allocator: batches differ in
    shape at every step, and fixed-size segments fragment into blocks no new shape fits (out-of-memory with memory
    free). Read when CUDA first allocates, so the entry points call this first."""
    if "PYTORCH_ALLOC_CONF" not in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"


def use_deterministic_algorithms() -> None:
    """`train.deterministic`: bitwise repeatable runs on CUDA (cuBLAS needs its workspace setting before its first
    matmul), at some cost in speed."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def on_cuda(device: torch.device) -> bool:
    """Whether `device` takes the CUDA code paths (fused Adam, GradScaler, padding masked in the loss, pinned
    prefetch, ...). Every such branch asks this one predicate, so that the tests can force the CUDA paths on the CPU
    (tests/conftest.py: `cuda_branches`)."""
    return device.type == "cuda"


def pick_device(name: str) -> torch.device:
    """`auto` = CUDA when available, else the CPU; `cuda[:N]` without CUDA is a config error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but CUDA is not available; use device=cpu or device=auto")
    return torch.device(name)


def training_device(name: str, quantize: str) -> torch.device:
    """`train.device`, under torchrun this process's GPU; int8 decoding (CPU only) is refused now, not after
    training."""
    device = pick_device(name)
    if device.type == "cuda" and torch.distributed.is_initialized():
        device = torch.device("cuda", torch.cuda.current_device())
    if quantize == "int8" and on_cuda(device):
        raise ConfigError(f"decode.quantize=int8 runs on the CPU only (device: {device}); set decode.quantize=none")
    return device


# A bf16 training step on a CPU with bf16 instructions pays only from this model width up: with AMX (Intel Xeon)
# d 512 1.63x fp32, d 256 1.09x, d 128 0.71x; with AVX512-BF16 and no AMX (AMD EPYC Zen 4) d 512 1.56x, d 256
# 1.21x, d 128 0.89x (benchmarks/speed/train_precision.py, 2026-11-25). Narrower models spend more in the casts
# and small ops than the bf16 products save.
CPU_BF16_MIN_WIDTH = 256


def cpu_has_bf16() -> bool:
    """The CPU multiplies bf16 natively (AMX tiles or AVX512-BF16 dot products); elsewhere torch emulates bf16,
    ~3x slower than fp32."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch's private CPU-feature checks
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def pick_autocast(precision: str, device: torch.device, width: int | None = None) -> torch.dtype | None:
    """The autocast dtype, or None for fp32. `auto` = bf16 where the hardware runs it natively (CPUs with AMX or
    AVX512-BF16, for models at least CPU_BF16_MIN_WIDTH wide when `width`, the model's d_model, is given; Ampere and
    newer GPUs), fp16 on older CUDA GPUs, fp32 on other CPUs (emulated bf16 is slower than fp32 there)."""
    if precision == "auto":
        if on_cuda(device):  # emulated bf16 (pre-Ampere) would be slow: fp16 with a GradScaler there
            native = torch.cuda.is_bf16_supported(including_emulation=False)
            return torch.bfloat16 if native else torch.float16
        wide = width is None or width >= CPU_BF16_MIN_WIDTH
        return torch.bfloat16 if cpu_has_bf16() and wide else None
    if precision == "fp16" and not on_cuda(device):
        raise ConfigError("train.precision=fp16 needs CUDA (no fp16 GradScaler on CPU); use bf16 or fp32")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def optimizer_kernel(device: torch.device) -> dict:
    """Adam's kernel: one for all parameters on CUDA (fused), one per group of tensors on the CPU (foreach)."""
    return dict(fused=True, foreach=None) if on_cuda(device) else dict(fused=None, foreach=True)


def use_optimizer_kernel(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Set `optimizer_kernel(device)` on a built optimizer. `load_state_dict` restores the saving run's flags, so a
    run started on the CPU would step with foreach Adam on CUDA: slower, and under fp16 the GradScaler, which passes
    its scale to a fused optimizer, would fail."""
    kernel = optimizer_kernel(device)
    for group in optimizer.param_groups:
        group.update(kernel)
        for p in group["params"]:  # the step counts where the kernel reads them (load_state_dict placed them for
            state = optimizer.state.get(p, {})  # the saving run's kernel): fused Adam on the parameter's device,
            if torch.is_tensor(state.get("step")):  # the others on the CPU (seen on an H200: a CPU checkpoint
                to = p.device if kernel["fused"] else torch.device("cpu")  # resumed on CUDA failed its first step)
                state["step"] = state["step"].to(device=to, dtype=torch.float32)
    optimizer._step_supports_amp_scaling = bool(kernel["fused"])  # as Adam's constructor sets it


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """torch.autocast to `dtype`, or a no-op for fp32."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def use_tf32(device: torch.device) -> None:
    """fp32 matmuls on CUDA in TF32 (Ampere and newer): full-precision GEMMs there run at a fraction of the speed,
    and TF32's 10-bit mantissa in the products is what PyTorch's own AMP recipes accept for fp32 training."""
    if on_cuda(device):
        torch.set_float32_matmul_precision("high")
