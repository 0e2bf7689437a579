"""Device and precision choices, with CUDA mocked where the machine has none."""

import pytest
import torch

from mt import runtime
from mt.config import ConfigError


class FakeCuda:
    def __init__(self, native_bf16: bool):
        self.native = native_bf16

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return True if including_emulation else self.native  # every GPU "supports" bf16 by emulation


@pytest.mark.parametrize(
    "gpu, native, expected",
    [("Ampere and newer", True, torch.bfloat16), ("V100 / T4", False, torch.float16)],
)
def test_auto_precision_on_cuda_is_native_bf16_else_fp16(monkeypatch, gpu, native, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", FakeCuda(native).is_bf16_supported)
    assert runtime.pick_autocast("auto", torch.device("cuda")) is expected, gpu


def fake_cpu(monkeypatch, amx: bool, avx512_bf16: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)


@pytest.mark.parametrize(
    "cpu, amx, avx512_bf16, expected",
    [
        ("Intel Xeon with AMX", True, True, torch.bfloat16),
        ("AMD EPYC Zen 4", False, True, torch.bfloat16),
        ("AVX-512 or AVX2 only", False, False, None),
    ],
)
def test_auto_precision_on_the_cpu_is_bf16_only_with_bf16_instructions(monkeypatch, cpu, amx, avx512_bf16, expected):
    fake_cpu(monkeypatch, amx, avx512_bf16)
    assert runtime.pick_autocast("auto", torch.device("cpu")) is expected, cpu


@pytest.mark.parametrize("width, expected", [(128, None), (255, None), (256, torch.bfloat16), (512, torch.bfloat16)])
@pytest.mark.parametrize("amx", [True, False])
def test_auto_precision_on_a_bf16_cpu_is_fp32_for_narrow_models(monkeypatch, amx, width, expected):
    fake_cpu(monkeypatch, amx, avx512_bf16=True)
    assert runtime.pick_autocast("auto", torch.device("cpu"), width) is expected
    assert runtime.pick_autocast("bf16", torch.device("cpu"), width) is torch.bfloat16  # asked for: always


def test_auto_precision_on_cuda_ignores_the_width(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", FakeCuda(True).is_bf16_supported)
    assert runtime.pick_autocast("auto", torch.device("cuda"), 128) is torch.bfloat16


def test_explicit_precisions():
    cpu = torch.device("cpu")
    assert runtime.pick_autocast("fp32", cpu) is None and runtime.pick_autocast("bf16", cpu) is torch.bfloat16
    with pytest.raises(ConfigError, match="fp16 needs CUDA"):
        runtime.pick_autocast("fp16", cpu)


def test_tf32_for_fp32_matmuls_on_cuda_only():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        runtime.use_tf32(torch.device("cpu"))
        assert torch.get_float32_matmul_precision() == "highest"
        runtime.use_tf32(torch.device("cuda"))
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_int8_decoding_is_refused_before_training_on_a_gpu(monkeypatch):
    monkeypatch.setattr(runtime, "pick_device", lambda name: torch.device("cuda", 0))
    with pytest.raises(ConfigError, match="decode.quantize=int8 runs on the CPU only"):
        runtime.training_device("cuda", "int8")


@pytest.mark.parametrize(
    "device, cuda_available, backend",
    [("cpu", True, "gloo"), ("auto", True, "nccl"), ("cuda", True, "nccl"), ("auto", False, "gloo")],
)
def test_torchrun_backend_follows_the_training_device(monkeypatch, device, cuda_available, backend):
    """`torchrun ... train.device=cpu` on a GPU machine must not pick NCCL (which needs CUDA tensors)."""
    from mt.train import distributed

    chosen = []
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")  # the node's fourth process, which a launcher may show only its own GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: chosen.append(f"GPU {i}"))
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda b: chosen.append(b))
    monkeypatch.setattr(distributed.dist, "new_group", lambda backend, timeout: chosen.append(f"waiting: {backend}"))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 0)
    gpu = ["GPU 0"] if backend == "nccl" else []  # LOCAL_RANK 3 of one visible GPU: not "invalid device ordinal"
    assert distributed.init_distributed(device) == 0 and chosen == [*gpu, backend, "waiting: gloo"]


def test_adam_step_counts_move_to_where_the_new_kernel_reads_them(cuda_branches):
    """A CPU run's checkpoint resumed on CUDA: load_state_dict leaves foreach Adam's step counts on the CPU, and
    fused Adam's CUDA kernel refuses them there (the first GPU run's failure). The parameters live on the meta
    device here, a device other than the CPU that a CPU machine has."""
    params = [torch.nn.Parameter(torch.zeros(3, device="meta")) for _ in range(2)]
    opt = torch.optim.Adam(params, foreach=True)
    for p in params:  # what load_state_dict leaves for a checkpoint of foreach Adam
        opt.state[p] = {"step": torch.tensor(7.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    runtime.use_optimizer_kernel(opt, torch.device("cuda"))
    assert opt.param_groups[0]["fused"] and not opt.param_groups[0]["foreach"]
    assert all(s["step"].device.type == "meta" and s["step"].dtype == torch.float32 for s in opt.state.values())
