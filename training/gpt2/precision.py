"""Which numeric precision a run trains in (`--precision auto|bf16|fp16|fp32`).

`choose_precision` is a pure function of the request and what the device offers, so the table
is unit-tested without a GPU:

| request | CPU  | CUDA with bf16 (Ampere+) | CUDA without bf16 (T4, V100) |
|---------|------|--------------------------|------------------------------|
| auto    | fp32 | bf16                     | fp16 + GradScaler            |
| bf16    | bf16 | bf16                     | refused (one line)           |
| fp16    | refused (no fp16 autocast worth having on CPU) | fp16 + GradScaler | fp16 + GradScaler |
| fp32    | fp32 | fp32                     | fp32                         |

"With bf16" means NATIVE bf16 (`bf16_native`: compute capability 8.0+, Ampere and later).
`torch.cuda.is_bf16_supported()` also says True on a T4 (sm75) or V100 (sm70), where bf16 is
emulated through fp32 and slower than fp32 itself; those GPUs get fp16 with loss scaling.

Mixed precision here is autocast (DDP, one GPU): the weights and the optimizer stay fp32,
matmuls run in the low precision. Under FSDP2 the `MixedPrecisionPolicy` casts the parameters
instead, and autocast is off (`Precision.autocast(..., params_cast=True)`): autocast on top
would cast the already-cast weights again and push LayerNorm/softmax inputs back to fp32.
fp16's narrow range needs loss scaling: `torch.amp.GradScaler` (DDP) or FSDP's
`ShardedGradScaler`, with `unscale_` before gradient clipping so the clip sees true norms.

`fp32` means fp32 (`configure_matmul`): TF32 off for matmuls and cuDNN, and no bf16/fp16
gradient compression (training.gpt2.parallel.comm_hook_name). Every other precision allows TF32
for whatever still runs in fp32.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Optional

from submitter.contract.spec import PRECISIONS


class PrecisionError(ValueError):
    """The requested precision cannot run on this device (the message says what to use)."""


@dataclass(frozen=True)
class Precision:
    name: str            # "bf16" | "fp16" | "fp32": what the run actually uses
    requested: str       # what was asked for
    reason: str          # one phrase, for run_started

    @property
    def needs_scaler(self) -> bool:
        return self.name == "fp16"

    def dtype(self) -> Any:
        """The autocast dtype (None for fp32)."""
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    def autocast(self, device_type: str, params_cast: bool = False) -> Any:
        """The context the forward pass runs in. `params_cast`: FSDP2's MixedPrecisionPolicy
        already runs the model in `dtype()`, so no autocast on top (no doubled casts)."""
        import torch

        dtype = self.dtype()
        if dtype is None or params_cast:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=dtype)

    def describe(self) -> dict[str, str]:
        return {"precision": self.name, "precision_requested": self.requested,
                "precision_reason": self.reason}


def choose_precision(requested: str, device_type: str, bf16_supported: bool) -> Precision:
    """The table in the module docstring. device_type: "cuda" or "cpu"."""
    if requested not in PRECISIONS:
        raise PrecisionError(f"precision {requested!r} is not one of {', '.join(PRECISIONS)}")
    cuda = device_type == "cuda"
    if requested == "auto":
        if not cuda:
            return Precision("fp32", requested, "CPU: fp32")
        if bf16_supported:
            return Precision("bf16", requested, "this GPU supports bf16")
        return Precision("fp16", requested, "this GPU has no bf16: fp16 with loss scaling")
    if requested == "bf16" and cuda and not bf16_supported:
        raise PrecisionError("this GPU has no bf16 (e.g. T4, V100): use --precision fp16 or auto")
    if requested == "fp16" and not cuda:
        raise PrecisionError("--precision fp16 needs a CUDA GPU: use auto or fp32 on CPU")
    return Precision(requested, requested, "asked for")


#: The first compute capability with bf16 tensor cores (A100, sm80).
BF16_MIN_CAPABILITY = (8, 0)


def bf16_native(device: Any = None) -> bool:
    """True when this CUDA GPU computes bf16 natively (Ampere, sm80, and later). Plain
    `torch.cuda.is_bf16_supported()` also counts emulation (True on T4/V100); asked without
    it, and with the capability checked too (a ROCm or old torch may not take the keyword)."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        supported = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # a torch without the keyword
        supported = torch.cuda.is_bf16_supported()
    return bool(supported) and tuple(torch.cuda.get_device_capability(device)) >= BF16_MIN_CAPABILITY


def precision_here(requested: str, device: Any) -> Precision:
    """`choose_precision` for the device this worker trains on."""
    cuda = getattr(device, "type", str(device)) == "cuda"
    return choose_precision(requested, "cuda" if cuda else "cpu", bool(cuda and bf16_native(device)))


def configure_matmul(precision: Precision, device_type: str) -> bool:
    """Set TF32 for this process; returns whether TF32 is in use. fp32 means fp32: TF32 off
    (`highest`). Mixed precision allows TF32 for its fp32 parts, which only Ampere (sm80) and
    later have: on a T4 or V100 the flag is set but reported False (it changes nothing)."""
    import torch

    allow = device_type == "cuda" and precision.name != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.set_float32_matmul_precision("high" if allow else "highest")
    return allow and tuple(torch.cuda.get_device_capability()) >= BF16_MIN_CAPABILITY


def make_scaler(precision: Precision, device_type: str, sharded: bool) -> Optional[Any]:
    """A gradient scaler for fp16 (None otherwise). FSDP's grads are shards: its scaler
    all-reduces the found-inf flag so every rank skips the same steps."""
    if not precision.needs_scaler:
        return None
    if sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device_type)
    import torch

    return torch.amp.GradScaler(device_type)


def apply_gradients(model: Any, optimizer: Any, scaler: Optional[Any], clip: float) -> Any:
    """The end of an optimizer step (the training loop's, and the smoke run's `step` case, so
    both time the same work): unscale under fp16 (the clip must see the true norm), clip,
    step (the scaler skips a step with inf/NaN gradients), zero the gradients. Returns the
    norm before clipping (a tensor on the device), or None without a clip."""
    import torch

    norm = None
    if scaler is not None:
        scaler.unscale_(optimizer)
    if clip:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
