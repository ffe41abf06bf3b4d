"""Optimizer steps timed without Ray: the smoke run's in-process cases (training.gpu_smoke).

    python -m training.smoke.step --case reference|step|ddp2 --micro M --accum A
                                  [--steps 3] [--warmup 1] [--compile on|off] [--cpu]

- `reference`: the nanoGPT-style model (training.smoke.reference_gpt), `torch.compile` of the whole
  model, plain cross-entropy on the low-precision logits, fused AdamW, clip 1.0.
- `step`: the project's own pieces: `build_model` + `compile_model` (training.gpt2.compiling) +
  `build_optimizer`, the run's precision (autocast, GradScaler under fp16, TF32) and loss, the
  same accumulation and clip as the training loop; no Ray, no data pipeline.
- `ddp2`: the `step` in 2 processes on ONE device (gloo carries the gradients), wrapped in DDP
  with the compression hook the run would register (training.gpt2.parallel.comm_hook_name) and
  `gradient_sync` (no_sync on all micro-batches but the last): what a one-GPU smoke run
  otherwise never exercises. Each rank takes half the step's micro-batches; the case fails
  when the ranks' weights differ after the steps.
Batches are random token ids (the same for both models), so the figures are the model's and
the optimizer's alone. Prints one line `SMOKE_RESULT {json}`: tokens/s, peak memory (CUDA's
allocator peak; on CPU the process's peak RSS), what ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

RESULT_PREFIX = "SMOKE_RESULT "
CASES = ("reference", "step", "ddp2")
#: The shapes: gpt2-small on a GPU, the tiny preset (byte vocabulary) with --cpu.
GPU_SHAPES = {"preset": "gpt2-small", "vocab": 50257, "eot": 50256}
CPU_SHAPES = {"preset": "tiny", "vocab": 257, "eot": 256}
LR, WEIGHT_DECAY, CLIP = 6e-4, 0.1, 1.0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.smoke.step", description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=CASES, required=True)
    p.add_argument("--micro", type=int, required=True, help="sequences per micro-batch")
    p.add_argument("--accum", type=int, required=True, help="micro-batches per optimizer step (all ranks)")
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps [default: 3]")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (compile) [default: 1]")
    p.add_argument("--compile", choices=("on", "off"), default="on")
    p.add_argument("--precision", default="auto", help="auto | bf16 | fp16 | fp32 [default: auto]")
    p.add_argument("--vocab", type=int, default=None, help="the tokenizer's vocabulary (default: GPT-2's; byte on --cpu)")
    p.add_argument("--compile-cache", default=None, help="inductor's cache directory (shared by the cases)")
    p.add_argument("--cpu", action="store_true", help="tiny shapes on CPU (a check of this script)")
    return p.parse_args(argv)


def shapes(cpu: bool, vocab: Optional[int] = None) -> dict[str, Any]:
    """Model shapes of a case: preset, layers, width, heads, block, padded vocab."""
    from training.gpt2.model import PRESETS, padded_vocab

    base = CPU_SHAPES if cpu else GPU_SHAPES
    p = PRESETS[base["preset"]]
    v = vocab or base["vocab"]
    return {"preset": base["preset"], "n_layer": p.n_layer, "n_head": p.n_head, "n_embd": p.n_embd,
            "block": p.block_size, "vocab": v, "padded_vocab": padded_vocab(p.vocab_size or v),
            "eot": v - 1}


def _peak_memory_gib(device: Any) -> float:
    if device.type == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # Linux: KiB


def build_case(case: str, a: argparse.Namespace, device: Any, precision: Any) -> dict[str, Any]:
    """The model (what `forward(x)` calls), its optimizer, and facts for the result."""
    import torch

    s = shapes(a.cpu, a.vocab)
    compiled = a.compile == "on"
    if case == "reference":
        from training.gpt2.model import BETAS
        from training.smoke.reference_gpt import build_reference, next_token_targets, reference_optimizer

        raw = build_reference(s["padded_vocab"], s["block"], s["n_layer"], s["n_head"], s["n_embd"]).to(device)
        model = torch.compile(raw) if compiled else raw
        opt = reference_optimizer(raw, LR, WEIGHT_DECAY, BETAS, fused=device.type == "cuda")
        forward: Callable[[Any], Any] = lambda x: model(x, next_token_targets(x))  # noqa: E731
        params = raw
    else:
        from training.gpt2.model import BETAS, build_model, build_optimizer, gpt2_config

        raw = build_model(gpt2_config(s["preset"], s["vocab"], s["eot"], s["block"])).to(device)
        if compiled:
            from training.gpt2.compiling import compile_model

            compile_model(raw)
        model = raw
        if case == "ddp2":
            model = _ddp(raw, device, precision)
        opt = build_optimizer(model, LR, WEIGHT_DECAY, BETAS)
        forward = lambda x: model(input_ids=x, labels=x).loss  # noqa: E731
        params = raw
    return {"model": model, "raw": params, "optimizer": opt, "forward": forward, "shapes": s,
            "params": sum(p.numel() for p in params.parameters())}


def _ddp(model: Any, device: Any, precision: Any) -> Any:
    """DDP as the training loop's wrap gives it (bucket views, the run's compression hook)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from training.gpt2.parallel import comm_hook_name
    from training.gpt2.precision import bf16_native

    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                  gradient_as_bucket_view=True)
    hook = comm_hook_name("ddp", device.type, dist.get_world_size(),
                          device.type == "cuda" and bf16_native(device), precision.name)
    if hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, getattr(default_hooks, hook))
    ddp.smoke_hook = hook
    return ddp


def run_steps(case: str, a: argparse.Namespace, rank: int = 0, world: int = 1) -> dict[str, Any]:
    """Build the case, run warmup + timed steps; the figures of this rank."""
    import torch

    from training.gpt2.parallel import gradient_sync
    from training.gpt2.precision import apply_gradients, configure_matmul, make_scaler, precision_here

    device = torch.device("cpu") if a.cpu else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    precision = precision_here(a.precision, device)
    tf32 = configure_matmul(precision, device.type)
    if a.compile_cache:
        from training.gpt2.compiling import CompileCache

        CompileCache(a.compile_cache, rank).open()  # <dir>/.compile-cache, as a run's
    torch.manual_seed(0)
    built = build_case(case, a, device, precision)
    model, opt, forward = built["model"], built["optimizer"], built["forward"]
    scaler = make_scaler(precision, device.type, sharded=False)
    accum = a.accum // world  # ranks share the step's micro-batches
    g = torch.Generator().manual_seed(1234 + rank)
    vocab, block = built["shapes"]["vocab"], built["shapes"]["block"]
    batches = [torch.randint(0, vocab, (a.micro, block), generator=g).to(device) for _ in range(accum)]
    autocast = precision.autocast(device.type)

    def step() -> Any:
        total = torch.zeros((), device=device)
        for k, x in enumerate(batches):
            with gradient_sync(model, sync=k == len(batches) - 1):
                with autocast:
                    loss = forward(x) / accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
            total += loss.detach().float()
        apply_gradients(model, opt, scaler, CLIP)
        return total

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        loss = step()
    sync()
    warmup_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    step_s = (time.perf_counter() - t0) / a.steps
    s = built["shapes"]
    tokens = a.micro * block * accum * world
    out = {"case": case, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "micro": a.micro, "accum": a.accum, "world": world, "tokens_per_step": tokens,
           "step_s": round(step_s, 6), "tokens_per_s": round(tokens / step_s, 1),
           "params": built["params"], "n_layer": s["n_layer"], "n_embd": s["n_embd"], "block": block,
           "vocab": s["padded_vocab"], "precision": precision.name, "tf32": tf32,
           "compile": a.compile == "on", "warmup_s": round(warmup_s, 2),
           "loss": round(float(loss), 4), "peak_mem_gib": round(_peak_memory_gib(device), 3),
           "parallel": "single", "torch": torch.__version__}
    if case == "ddp2":
        out.update(parallel="ddp", backend=_backend(),
                   grad_compression=getattr(model, "smoke_hook", None),
                   weights_agree=_weights_agree(built["raw"]))
    return out


def _backend() -> str:
    import torch.distributed as dist

    return dist.get_backend()


def _weights_agree(model: Any) -> bool:
    """Whether every rank holds the same weights (a sum of all parameters, max vs min)."""
    import torch
    import torch.distributed as dist

    total = sum(float(p.detach().double().sum()) for p in model.parameters())
    hi = torch.tensor([total], dtype=torch.float64)
    lo = hi.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return abs(float(hi) - float(lo)) <= 1e-6 * max(1.0, abs(float(hi)))


def _ddp2_rank(rank: int, a: argparse.Namespace, port: int, results: Any) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        results[rank] = run_steps("ddp2", a, rank, 2)
    finally:
        dist.destroy_process_group()


def run_ddp2(a: argparse.Namespace) -> dict[str, Any]:
    """Two processes on one device; rank 0's figures, with the larger peak memory of the two
    and whether their weights agree."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_ddp2_rank, args=(a, port, results), nprocs=2, join=True)
        r0, r1 = dict(results[0]), dict(results[1])
    r0["peak_mem_gib"] = max(r0["peak_mem_gib"], r1["peak_mem_gib"])
    return r0


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    if a.accum < (2 if a.case == "ddp2" else 1) or a.accum % (2 if a.case == "ddp2" else 1):
        print(f"error: --accum {a.accum}: ddp2 needs an even number (the ranks share it)", file=sys.stderr)
        return 2
    out = run_ddp2(a) if a.case == "ddp2" else run_steps(a.case, a)
    print(RESULT_PREFIX + json.dumps(out), flush=True)
    return 0 if out.get("weights_agree", True) else 1


if __name__ == "__main__":
    sys.exit(main())
