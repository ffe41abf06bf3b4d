"""How the model is spread over the workers: DDP (default) or FSDP2 (`--fsdp`).

FSDP: PyTorch's FSDP2 `fully_shard`, applied by us, not FSDP1 through
`ray.train.torch.prepare_model(parallel_strategy="fsdp")`. Why:
- Ray Train 2.60's `prepare_model` wraps with FSDP1 (`FullyShardedDataParallel(model,
  **parallel_strategy_kwargs)`) and raises unless CUDA is present; FSDP1 defaults flatten every
  parameter into one 1-D `FlatParameter` (so shape-based weight decay broke: issue #13) and,
  without a wrap policy, gather the whole model for every forward. FSDP1 is also the API
  PyTorch is retiring in favour of FSDP2.
- FSDP2 keeps every parameter as a DTensor with its ORIGINAL name and shape (what FSDP1 needs
  `use_orig_params=True` for), so the optimizer groups are built by name exactly as for DDP;
  `torch.distributed.checkpoint.state_dict.get_state_dict/set_state_dict` save and load full
  state dicts for both; and it runs on CPU with gloo, so its save -> resume path is tested here.
- It only needs the process group Ray Train already set up; `prepare_model(parallel_strategy=
  None)` still moves the model to the worker's device.
Wrapping: one FSDP unit per `GPT2Block` (the auto-wrap policy FSDP1 would take as
`ModuleWrapPolicy({GPT2Block})`), then the root (embeddings, tied LM head, final LayerNorm), so
one block is gathered at a time and the next one's all-gather overlaps compute.
Mixed precision: `MixedPrecisionPolicy(param_dtype=<bf16|fp16>, reduce_dtype=fp32)`: compute in
the run's precision, gradients reduced and kept in fp32 (sharded fp32 master weights). The
policy is the only cast: the loop runs FSDP2 without autocast (training.gpt2.precision).
Gradient accumulation communicates once per optimizer step (`gradient_sync`): DDP skips the
all-reduce of every micro-batch but the last (`no_sync`); FSDP2 skips the reduce-scatters
(`set_requires_gradient_sync(False)`) and keeps the micro-batches' unsharded gradients until
the last one. That memory (one full gradient per worker, 0.5 GB for gpt2-small in fp32) is the
price of dividing the gradient traffic by the accumulation steps: with ~0.5 M tokens per step
(submitter.contract.batch) it is what makes 8 pods scale. tests/training/test_grad_sync.py
counts the collectives over gloo.
FSDP2 also gathers the parameters once per optimizer step where memory allows (`gather_once`:
the unsharded parameters in the compute dtype take at most GATHER_ONCE_SHARE of the card; 250 MB
for gpt2-small): during a step's micro-batches the blocks keep their gathered parameters after
forward (no second all-gather in backward) and after backward (none in the next micro-batch's
forward), and reshard after the last backward, before the optimizer steps on the shards
(`set_reshard_after_forward` / `set_reshard_after_backward`, the way torchtitan trades memory
for communication under accumulation). Outside a step (evaluation, checkpoints) FSDP2's own
defaults hold. Per step: one all-gather per FSDP unit instead of two per micro-batch; on one
GPU, where the "all-gather" is a copy in and out, it removes 2 x accumulation - 1 of those
copies of the model a step. tests/training/test_fsdp_gather.py counts them.

DDP on CUDA: gradients are all-reduced in bf16 (`bf16_compress_hook`; fp16 on GPUs without
native bf16), halving the bytes of the step's dominant communication; `gradient_as_bucket_view`
avoids a copy. `--precision fp32` keeps fp32 all-reduces and turns TF32 off
(training.gpt2.precision.configure_matmul); mixed precision allows TF32 for its fp32 parts.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator, Optional

from training.gpt2.precision import Precision, bf16_native, configure_matmul


def comm_hook_name(strategy: str, device_type: str, world: int, bf16_supported: bool,
                   precision: str = "bf16") -> Optional[str]:
    """Which DDP gradient compression hook a run registers (None: plain fp32 all-reduce).
    `bf16_supported`: NATIVE bf16 (training.gpt2.precision.bf16_native); `precision`: the run's
    resolved precision (fp32 means fp32 gradients on the wire too)."""
    if strategy != "ddp" or device_type != "cuda" or world < 2 or precision == "fp32":
        return None
    return "bf16_compress_hook" if bf16_supported else "fp16_compress_hook"


def enable_tf32(device_type: str) -> bool:
    """TF32 on for a mixed-precision run (what `configure_matmul` does for bf16/fp16); kept
    for callers that do not hold a Precision (benchmarks/gpu_smoke.py)."""
    return configure_matmul(Precision("bf16", "bf16", "mixed precision"), device_type)


#: The share of a GPU's memory the unsharded parameters may take for FSDP2 to keep them
#: gathered across a step's micro-batches (see the module docstring).
GATHER_ONCE_SHARE = 1 / 8


def gather_once_fits(params: int, itemsize: int, device_memory: Optional[int]) -> bool:
    """Whether the whole model's unsharded parameters (`params` x `itemsize` bytes) fit
    GATHER_ONCE_SHARE of `device_memory` (None: a CPU run, where memory is not the limit)."""
    return device_memory is None or params * itemsize <= GATHER_ONCE_SHARE * device_memory


def shard_fsdp(model: Any, precision: Precision) -> Any:
    """FSDP2: one unit per GPT2Block, then the root; see the module docstring. Sets
    `model.gather_once` (read by `gradient_sync`)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = precision.dtype()
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    first = next(model.parameters())
    memory = torch.cuda.get_device_properties(first.device).total_memory if first.is_cuda else None
    itemsize = (dtype or first.dtype).itemsize
    for block in _blocks(model):
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.gather_once = (hasattr(model, "set_reshard_after_forward")
                         and gather_once_fits(sum(p.numel() for p in model.parameters()),
                                              itemsize, memory))
    return model


def _blocks(model: Any) -> list[Any]:
    """The transformer blocks (GPT2Block instances) in order."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    return [m for m in model.modules() if isinstance(m, GPT2Block)]


def wrap_model(model: Any, *, fsdp: bool, precision: Precision, world: int, device: Any) -> tuple[Any, dict[str, Any]]:
    """The model ready to train on this worker, and facts about it (for run_started).

    Called inside a Ray Train worker (uses `ray.train.torch.prepare_model` for the device and
    DDP)."""
    import ray.train.torch
    import torch.distributed as dist

    device_type = device.type
    facts: dict[str, Any] = {"tf32": configure_matmul(precision, device_type)}
    distributed = dist.is_available() and dist.is_initialized()
    if fsdp and distributed:
        model = ray.train.torch.prepare_model(model, parallel_strategy=None)  # to the device
        facts["parallel"] = "fsdp2"
        return shard_fsdp(model, precision), facts
    if world > 1:
        bf16 = device_type == "cuda" and bf16_native(device)
        hook = comm_hook_name("ddp", device_type, world, bf16, precision.name)
        from training.gpt2.comm import pod_network_ddp  # bucket size, the tied gradient

        model = pod_network_ddp(model, hook)
        if hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, getattr(default_hooks, hook))
        facts.update(parallel="ddp", grad_compression=hook)
        return model, facts
    facts["parallel"] = "single"
    if device_type == "cuda":
        return ray.train.torch.prepare_model(model, parallel_strategy=None), facts
    return model.to(device), facts


def gradient_sync(model: Any, sync: bool) -> ContextManager[Any]:
    """The context one micro-batch's forward and backward run in: gradients are communicated
    only when `sync` (the last micro-batch of an optimizer step). DDP: `no_sync()` on the
    others; FSDP2: `set_requires_gradient_sync(sync)` (FSDP2 modules have no `no_sync`), and
    with `gather_once` the parameters stay gathered until the last backward (`_gathered`);
    one process: nothing to skip."""
    if is_fsdp(model):
        model.set_requires_gradient_sync(sync)
        return _gathered(model, sync) if getattr(model, "gather_once", False) else contextlib.nullcontext()
    if not sync and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


@contextlib.contextmanager
def _gathered(model: Any, last: bool) -> Iterator[None]:
    """One micro-batch of a step with the parameters kept gathered: no reshard after forward;
    after backward only on the `last` micro-batch, which then restores FSDP2's defaults
    (blocks reshard after forward, the root does not) for whatever runs outside a step."""
    model.set_reshard_after_forward(False)
    model.set_reshard_after_backward(last)
    try:
        yield
    finally:
        if last:
            model.set_reshard_after_forward(True)
            model.set_reshard_after_forward(False, recurse=False)


def is_fsdp(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def unwrapped(model: Any) -> Any:
    """The GPT2LMHeadModel under DDP (FSDP2 modules are the model itself)."""
    return getattr(model, "module", model)
