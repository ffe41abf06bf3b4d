"""DDP's gradient communication shaped for pod networks (TCP between pods, tens of Gb/s).

Two changes to DDP's defaults, both sized with benchmarks/scaling_model.py (docs/gpus/multi-node.md):
- **Buckets**: DDP's 25 MiB buckets of fp32 gradients (12.5 MB on the wire in bf16) each pay a
  ring all-reduce's 2 (n-1) latency steps; over TCP a step costs tens of microseconds. The
  scaling model (50 us a step) puts 50 MiB within 2% of the step time of the best size at 8
  GPUs (25-400 Gb/s), with 18-46% less exposed communication than 25 MiB at 64 GPUs; 100 MiB
  and more lose overlap at 8.
- **The tied embedding / LM-head weight** (gpt2-small: 38.6 M parameters, 77 MB in bf16, 31% of
  the gradient bytes) has its own all-reduce. Its gradient is complete only when the embedding's
  backward, the last op of the backward, adds its part; in DDP it sat in the last bucket with
  the first block's and the position embedding's gradients, launched after every earlier
  bucket. Here DDP ignores it and a post-accumulate-grad hook launches its all-reduce (in the
  run's compressed dtype, like DDP's hook) the moment it is complete, on the last micro-batch of
  a step only (the others accumulate under `no_sync`); the end of the backward waits for it, as
  DDP waits for its buckets, so the optimizer sees reduced gradients. What is left exposed is
  that one all-reduce after the backward: the scaling model counts it (`tied_tail_s`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

#: DDP bucket size (MiB of fp32 gradients) for pod networks; see the module docstring.
BUCKET_CAP_MB = 50


def tied_names(model: Any) -> list[str]:
    """Every name of the parameter that two modules share (GPT-2's wte and lm_head), as DDP
    names them; [] when no parameter is shared."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    shared = [n for n in names.values() if len(n) > 1]
    return shared[0] if shared else []


class TiedGradient:
    """The tied weight's all-reduce, launched when its gradient is complete (see the module
    docstring). `launches` counts them."""

    def __init__(self, ddp: Any, param: Any, dtype: Optional[Any]) -> None:
        self.ddp, self.param, self.dtype = ddp, param, dtype
        self.launches = 0
        self.handle = param.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, param: Any) -> None:
        import torch
        import torch.distributed as dist

        if not self.ddp.require_backward_grad_sync:  # a no_sync micro-batch: keep accumulating
            return
        grad = param.grad
        grad.div_(dist.get_world_size())  # DDP's mean, divided before the cast as its hooks do
        wire = grad.to(self.dtype) if self.dtype is not None else grad
        work = dist.all_reduce(wire, async_op=True)
        self.launches += 1

        def finish() -> None:  # at the end of this backward
            work.wait()
            if wire is not grad:
                grad.copy_(wire)

        torch.autograd.Variable._execution_engine.queue_callback(finish)


def pod_network_ddp(model: Any, hook: Optional[str],
                    wrap: Optional[Callable[..., Any]] = None) -> Any:
    """`model` in DDP with pod-network buckets and the tied weight reduced by `TiedGradient`
    (in bf16/fp16 when `hook` names DDP's compression hook). `wrap(model, **ddp_kwargs)` builds
    the DDP module: by default Ray Train's `prepare_model`, which also moves it to the device."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    names = tied_names(model)
    if names:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    kwargs = {"gradient_as_bucket_view": True, "bucket_cap_mb": BUCKET_CAP_MB}
    if wrap is None:
        import ray.train.torch

        ddp = ray.train.torch.prepare_model(model, parallel_strategy="ddp",
                                            parallel_strategy_kwargs=kwargs)
    else:
        ddp = wrap(model, **kwargs)
    if names:
        param = dict(ddp.module.named_parameters(remove_duplicate=False))[names[0]]
        dist.broadcast(param.data, src=0)  # DDP broadcasts every weight but those it ignores
        dtype = {"bf16_compress_hook": torch.bfloat16,
                 "fp16_compress_hook": torch.float16}.get(hook or "")
        ddp.tied_gradient = TiedGradient(ddp, param, dtype)
    return ddp
