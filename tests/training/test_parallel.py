"""DDP and FSDP2 train the same model: the same optimizer groups by name, and an FSDP
checkpoint resumes with the same next-step loss (CPU with gloo here; CUDA with NCCL where a
GPU exists)."""

from __future__ import annotations

import io
import os

import pytest
import torch

from tests.support import gloo
from training.gpt2.model import build_model, build_optimizer, gpt2_config
from training.gpt2.parallel import comm_hook_name, shard_fsdp
from training.gpt2.precision import bf16_native, choose_precision

VOCAB, EOT, BLOCK = 257, 256, 32


@pytest.fixture
def one_rank_group(request, tmp_path):
    """A world of one (the process group FSDP2 and DDP need), torn down after the test."""
    gloo.join(0, 1, gloo.rendezvous(tmp_path), backend=getattr(request, "param", "gloo"))
    yield
    gloo.leave()


def _model(seed: int = 0, device: str = "cpu"):
    torch.manual_seed(seed)
    return build_model(gpt2_config("tiny", VOCAB, EOT, BLOCK)).to(device)


def _names(optimizer) -> list[tuple[float, list[str]]]:
    return [(g["weight_decay"], g["names"]) for g in optimizer.param_groups]


def test_ddp_and_fsdp_build_the_same_optimizer_groups(one_rank_group):
    plain = build_optimizer(_model(), 1e-3, 0.1, (0.9, 0.95))
    ddp = build_optimizer(torch.nn.parallel.DistributedDataParallel(_model()), 1e-3, 0.1,
                          (0.9, 0.95))
    fsdp_model = shard_fsdp(_model(), choose_precision("fp32", "cpu", False))
    fsdp = build_optimizer(fsdp_model, 1e-3, 0.1, (0.9, 0.95))
    assert _names(ddp) == _names(fsdp) == _names(plain)
    decay, rest = _names(fsdp)
    assert decay[0] == 0.1 and rest[0] == 0.0
    assert all(n.endswith("weight") and ".ln_" not in n for n in decay[1])
    assert {"transformer.wte.weight", "transformer.wpe.weight",
            "transformer.ln_f.weight", "transformer.h.0.attn.c_attn.bias"} <= set(rest[1])
    # every parameter in exactly one group, sharded ones included
    assert len(decay[1]) + len(rest[1]) == len(list(fsdp_model.parameters()))
    # FSDP2 sharded each block as its own unit: parameters are DTensors with their real shapes
    from torch.distributed.tensor import DTensor

    p = dict(fsdp_model.named_parameters())["transformer.h.0.mlp.c_fc.weight"]
    assert isinstance(p, DTensor) and p.shape == (128, 512)


def _step(model, optimizer, x) -> float:
    loss = model(input_ids=x, labels=x).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def _fsdp_save_resume_same_next_loss(device: str, precision: str) -> None:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_state_dict)

    prec = choose_precision(precision, device, device == "cuda" and bf16_native())
    torch.manual_seed(1)
    batches = [torch.randint(0, 256, (4, BLOCK), device=device) for _ in range(4)]
    model = shard_fsdp(_model(0, device), prec)
    opt = build_optimizer(model, 3e-3, 0.1, (0.9, 0.95))
    for x in batches[:2]:
        _step(model, opt, x)
    msd, osd = get_state_dict(model, opt,
                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    buf = io.BytesIO()
    torch.save({"model": msd, "optimizer": osd}, buf)
    straight = [_step(model, opt, x) for x in batches[2:]]

    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    fresh = shard_fsdp(_model(99, device), prec)  # other init: the checkpoint must win
    fresh_opt = build_optimizer(fresh, 3e-3, 0.1, (0.9, 0.95))
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"],
                   options=StateDictOptions(full_state_dict=True))
    resumed = [_step(fresh, fresh_opt, x) for x in batches[2:]]
    assert resumed == pytest.approx(straight, rel=1e-6 if precision == "fp32" else 1e-3)


def test_fsdp_save_then_resume_gives_the_same_next_step_loss(one_rank_group):
    _fsdp_save_resume_same_next_loss("cpu", "fp32")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("one_rank_group", ["nccl"], indirect=True)
def test_fsdp_save_then_resume_on_cuda_bf16(one_rank_group):
    torch.cuda.set_device(0)
    _fsdp_save_resume_same_next_loss("cuda", "bf16" if bf16_native() else "fp16")


def test_ddp_compresses_gradients_on_cuda_only():
    assert comm_hook_name("ddp", "cuda", 8, True) == "bf16_compress_hook"
    assert comm_hook_name("ddp", "cuda", 8, False) == "fp16_compress_hook"
    assert comm_hook_name("ddp", "cpu", 8, True) is None
    assert comm_hook_name("ddp", "cuda", 1, True) is None
    assert comm_hook_name("fsdp", "cuda", 8, True) is None


def test_the_bf16_compress_hook_exists_where_we_look_it_up():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    assert callable(default_hooks.bf16_compress_hook) and callable(default_hooks.fp16_compress_hook)


def test_fsdp_fp16_steps_with_the_sharded_scaler_unscaled_before_the_clip(one_rank_group):
    """fp16 under FSDP2: ShardedGradScaler handles the DTensor gradients; after unscale_ the
    clip sees the true norm (the same as an unscaled fp32 backward's, roughly), not 65536x."""
    from training.gpt2.precision import Precision, make_scaler

    fp16 = Precision("fp16", "fp16", "test")
    model = shard_fsdp(_model(), fp16)
    opt = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95))
    scaler = make_scaler(fp16, "cpu", sharded=True)
    assert type(scaler).__name__ == "ShardedGradScaler"
    x = torch.randint(0, 256, (4, BLOCK))
    losses = []
    for _ in range(3):
        with fp16.autocast("cpu"):
            loss = model(input_ids=x, labels=x).loss
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        assert 0 < norm < 100, norm  # unscaled: a scaled norm would be ~1e5
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0]
