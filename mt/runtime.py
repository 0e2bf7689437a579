"""Where and how numbers are computed: the device, autocast precision, and the allocator setting for the CPU."""

from __future__ import annotations

import contextlib
import ctypes
import platform
import sys

import torch

from mt.config import ConfigError


def keep_freed_memory_in_the_heap() -> bool:
    """Stop glibc malloc from handing each step's large tensors back to the kernel (Linux/glibc only); the entry
    points call it first. Returns whether the settings took.

    By default glibc serves large blocks with mmap and unmaps them on free, so every training or decoding step
    page-faults (and the kernel zeroes) its activations anew; `benchmarks/allocator.py` measures the difference.
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
    if quantize == "int8" and device.type != "cpu":
        raise ConfigError(f"decode.quantize=int8 runs on the CPU only (device: {device}); set decode.quantize=none")
    return device


def pick_autocast(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for fp32. `auto` = bf16 where the hardware runs it natively (AMX CPUs, Ampere and
    newer GPUs), fp16 on older CUDA GPUs, fp32 on other CPUs (emulated bf16 is slower than fp32 there)."""
    if precision == "auto":
        if device.type == "cuda":  # emulated bf16 (pre-Ampere) would be slow: fp16 with a GradScaler there
            native = torch.cuda.is_bf16_supported(including_emulation=False)
            return torch.bfloat16 if native else torch.float16
        amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        return torch.bfloat16 if amx else None
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision=fp16 needs CUDA (no fp16 GradScaler on CPU); use bf16 or fp32")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """torch.autocast to `dtype`, or a no-op for fp32."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def use_tf32(device: torch.device) -> None:
    """fp32 matmuls on CUDA in TF32 (Ampere and newer): full-precision GEMMs there run at a fraction of the speed,
    and TF32's 10-bit mantissa in the products is what PyTorch's own AMP recipes accept for fp32 training."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
