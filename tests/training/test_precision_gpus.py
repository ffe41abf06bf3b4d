"""`--precision` on the GPUs people train GPT-2 on, with the device mocked (no GPU here):
bf16 only where it is native, fp16 + loss scaling on T4/V100, fp32 that is fp32 (no TF32, no
bf16 gradient compression)."""

from __future__ import annotations

import pytest
import torch

from training.gpu_check import _probe
from training.gpt2.parallel import comm_hook_name
from training.gpt2.precision import bf16_native, configure_matmul, make_scaler, precision_here

#: name, compute capability; torch's own is_bf16_supported says True for all of them
#: (emulation counts by default) and False without emulation below sm80.
GPUS = {"T4": ("Tesla T4", (7, 5)), "V100": ("Tesla V100-SXM2-16GB", (7, 0)),
        "A100": ("NVIDIA A100-SXM4-80GB", (8, 0)), "H100": ("NVIDIA H100 80GB HBM3", (9, 0))}


@pytest.fixture
def gpu(monkeypatch):
    """Pretend this process has one of GPUS; restores TF32 settings afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())

    def use(kind: str) -> None:
        name, cap = GPUS[kind]
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True: including_emulation or cap >= (8, 0))

    yield use
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("kind, precision, scaler, tf32, hook", [
    ("T4", "fp16", True, False, "fp16_compress_hook"),
    ("V100", "fp16", True, False, "fp16_compress_hook"),
    ("A100", "bf16", False, True, "bf16_compress_hook"),
    ("H100", "bf16", False, True, "bf16_compress_hook"),
])
def test_auto_resolves_per_gpu(gpu, kind, precision, scaler, tf32, hook):
    gpu(kind)
    assert torch.cuda.is_bf16_supported()  # what the old check saw: True even on T4/V100
    assert bf16_native() == (precision == "bf16")
    p = precision_here("auto", CUDA)
    assert p.name == precision and p.needs_scaler == scaler
    made = make_scaler(p, "cuda", sharded=False)
    assert (made is not None) == scaler
    if scaler:
        assert isinstance(made, torch.amp.GradScaler)
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        assert isinstance(make_scaler(p, "cuda", sharded=True), ShardedGradScaler)
    assert configure_matmul(p, "cuda") is tf32
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "high"
    assert comm_hook_name("ddp", "cuda", 8, bf16_native(), p.name) == hook
    assert _probe() == {"cuda": True, "bf16": precision == "bf16", "gpu": GPUS[kind][0]}


@pytest.mark.parametrize("kind", sorted(GPUS))
def test_fp32_means_fp32_on_every_gpu(gpu, kind):
    gpu(kind)
    p = precision_here("fp32", CUDA)
    assert p.name == "fp32" and not p.needs_scaler and make_scaler(p, "cuda", False) is None
    assert configure_matmul(p, "cuda") is False
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"
    assert comm_hook_name("ddp", "cuda", 8, bf16_native(), p.name) is None


@pytest.mark.parametrize("kind", ["T4", "V100"])
def test_bf16_is_refused_where_it_is_only_emulated(gpu, kind):
    from training.gpt2.precision import PrecisionError

    gpu(kind)
    with pytest.raises(PrecisionError, match="fp16"):
        precision_here("bf16", CUDA)
    assert precision_here("fp16", CUDA).needs_scaler


def test_cpu_is_fp32_without_tf32():
    p = precision_here("auto", torch.device("cpu"))
    assert p.name == "fp32" and configure_matmul(p, "cpu") is False


def test_fsdp2_runs_without_autocast_on_top_of_its_param_cast():
    """Under FSDP2 the MixedPrecisionPolicy is the only cast: autocast would cast the already
    bf16 weights again and push LayerNorm/softmax back to fp32."""
    p = precision_here("bf16", torch.device("cpu"))
    assert isinstance(p.autocast("cpu"), torch.autocast)
    with p.autocast("cpu", params_cast=True):
        assert not torch.is_autocast_enabled("cpu")
