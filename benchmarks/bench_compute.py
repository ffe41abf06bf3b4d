"""The compute path's figures on this machine (issues #18 and 24; CPU, a few minutes):

1. The loss, counted op by op on meta tensors (no memory used, no time measured) for
   gpt2-small's logits (50,304, bf16), forward and backward:
   - the largest logits tensor of the plain loss (Hugging Face's: all logits, upcast to fp32)
     and of `training.gpt2.loss.lm_loss` for a micro-batch of 8 x 256;
   - bytes moved (every op's inputs and outputs, views aside: eager, unfused, an upper bound of
     what a GPU reads and writes) and matmul FLOPs by dtype, for a 64 x 256 micro-batch (16 k
     tokens, issue 24's): before (main 5fcdc7d: 16 chunks, fp32 copies of `g`, an fp32
     weight-gradient matmul) and after, with the CPU budget and an H100's (one chunk).
2. `--compile` on the tiny preset (CPU, inductor's C++ backend): compile seconds of a first
   start and of a second start that finds the run's cache (`<run dir>/.compile-cache`), each
   in a fresh process as a restart is; and the step time compiled vs eager, interleaved.

    python benchmarks/bench_compute.py [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

START = r"""
import json, statistics, sys, time
import torch
from training.gpt2.compiling import CompileCache, compile_model, compile_seconds, counters
from training.gpt2.model import build_model, build_optimizer, gpt2_config

run_dir, steps = sys.argv[1], int(sys.argv[2])
models = {}
for name in ("eager", "compiled"):
    torch.manual_seed(0)
    models[name] = build_model(gpt2_config("tiny", 257, 256, 128))
CompileCache(run_dir, 0).open()
compile_model(models["compiled"])
opts = {k: build_optimizer(m, 3e-4, 0.1, (0.9, 0.95)) for k, m in models.items()}

def step(name, x):
    t = time.perf_counter()
    models[name](input_ids=x, labels=x).loss.backward()
    opts[name].step()
    opts[name].zero_grad(set_to_none=True)
    return time.perf_counter() - t

step("compiled", torch.randint(0, 257, (8, 128)))  # compiles (or loads the run's cache)
compile_s = compile_seconds()
ratios, times = [], {"eager": [], "compiled": []}
for _ in range(steps):  # interleaved: a shared machine's load hits both alike
    x = torch.randint(0, 257, (8, 128))
    pair = {k: step(k, x) for k in ("eager", "compiled")}
    ratios.append(pair["compiled"] / pair["eager"])
    for k, v in pair.items():
        times[k].append(v)
print(json.dumps({"compile_s": compile_s, **counters(), "ratio": statistics.median(ratios),
                  **{k + "_s": statistics.median(v) for k, v in times.items()}}))
"""


def largest_logits() -> tuple[int, int]:
    """(plain, chunked): bytes of the largest tensor with a vocabulary-sized last dimension."""
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from training.gpt2.loss import lm_loss

    vocab = 50304

    class Largest(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == vocab and not func.is_view:
                    self.bytes = max(self.bytes, t.numel() * t.element_size())
            return out

    def inputs():
        h = torch.empty(8, 256, 768, device="meta", dtype=torch.bfloat16, requires_grad=True)
        w = torch.empty(vocab, 768, device="meta", dtype=torch.bfloat16, requires_grad=True)
        return h, w, torch.zeros(8, 256, dtype=torch.long, device="meta")

    h, w, y = inputs()
    with Largest() as plain:
        logits = (h @ w.t()).float()
        F.cross_entropy(logits[:, :-1].reshape(-1, vocab), y[:, 1:].reshape(-1)).backward()
    h, w, y = inputs()
    with Largest() as chunked:
        lm_loss(h, w, y).backward()
    return plain.bytes, chunked.bytes


def _before_chunk_loss(hidden, weight, targets, chunk: int):
    """The loss's chunk loop as it was before issue 24 (main 5fcdc7d), for the comparison:
    fp32 logits, three fp32 copies of `g`, the weight gradient as an fp32 matmul."""
    import torch

    acc = torch.float32
    total, grad_h, grad_w = hidden.new_zeros((), dtype=acc), [], None
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start:start + chunk], targets[start:start + chunk]
        logits = (h @ weight.t()).to(acc)
        valid = t != -100
        safe = torch.where(valid, t, 0)
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, safe[:, None])[:, 0]
        total = total + torch.where(valid, lse - picked, 0.0).sum()
        g = torch.exp(logits - lse[:, None])
        g = g.scatter_add(1, safe[:, None], torch.full_like(lse[:, None], -1.0))
        g = (g * valid[:, None]).to(h.dtype)
        grad_h.append((g @ weight).to(acc))
        gw = g.t().to(acc) @ h.to(acc)
        grad_w = gw if grad_w is None else grad_w + gw
    return total, torch.cat(grad_h), grad_w


def loss_traffic(rows: int = 64 * 256, vocab: int = 50304, d: int = 768) -> dict[str, dict]:
    """Bytes moved and matmul FLOPs (by input dtype) of one micro-batch's loss, forward and
    backward, op by op on meta tensors: before issue 24, and after (CPU budget; H100's)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from training.gpt2.loss import DEFAULT_LOSS_BUDGET, bytes_per_logit, lm_loss, loss_chunk_rows

    class Traffic(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes, self.flops = 0, {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (tuple, list)) else [out]
            if func.is_view:
                return out  # a view moves nothing
            tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
            if func is torch.ops.aten.scatter_add_.default:  # touches the indexed entries only
                tensors, outs = tensors[1:], tensors[2:]
            self.bytes += sum(t.numel() * t.element_size() for t in (*tensors, *outs)
                              if isinstance(t, torch.Tensor))
            if func is torch.ops.aten.mm.default:
                (m, k), n = args[0].shape, args[1].shape[1]
                key = str(args[0].dtype).removeprefix("torch.")
                self.flops[key] = self.flops.get(key, 0) + 2 * m * n * k
            return out

    def inputs():
        h = torch.empty(rows, d, device="meta", dtype=torch.bfloat16)
        w = torch.empty(vocab, d, device="meta", dtype=torch.bfloat16)
        return h, w, torch.zeros(rows // 256, 256, dtype=torch.long, device="meta")

    out = {}
    h, w, y = inputs()
    with Traffic() as before:
        _before_chunk_loss(h, w, y.reshape(-1), 1024)  # 16 chunks of 1,024 rows
    out["before (16 chunks)"] = {"bytes": before.bytes, "flops": before.flops}
    h100 = int(80 * 2**30 / 8)
    for label, budget in (("CPU budget", DEFAULT_LOSS_BUDGET), ("H100 budget", h100)):
        h, w, y = inputs()
        h.requires_grad_()
        w.requires_grad_()
        with Traffic() as after:
            lm_loss(h.reshape(rows // 256, 256, d), w, y, budget=budget).backward()
        chunks = -(-rows // loss_chunk_rows(rows, vocab, budget, bytes_per_logit(2, compiled=False)))
        out[f"after ({label}: {chunks} chunk{'s' if chunks > 1 else ''})"] = {
            "bytes": after.bytes, "flops": after.flops}
    return out


def start(run_dir: str, steps: int, local_cache: str) -> dict:
    """One start of a run in a fresh process (a new pod: its own inductor cache empty)."""
    env = {**os.environ, "PYTHONPATH": ROOT, "TORCHINDUCTOR_CACHE_DIR": local_cache}
    out = subprocess.run([sys.executable, "-c", START, run_dir, str(steps)], env=env,
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    sys.path.insert(0, ROOT)
    plain, chunked = largest_logits()
    print(f"loss, gpt2-small micro-batch 8 x 256 (bf16): largest logits tensor plain "
          f"{plain / 2**20:,.0f} MiB, chunked {chunked / 2**20:,.0f} MiB "
          f"({plain / chunked:.1f}x smaller)", flush=True)
    figures = loss_traffic()
    base = next(iter(figures.values()))["bytes"]
    for label, f in figures.items():
        flops = ", ".join(f"{v / 1e12:.2f} TFLOP {k}" for k, v in sorted(f["flops"].items()))
        print(f"loss, gpt2-small micro-batch 64 x 256, eager ops: {label}: "
              f"{f['bytes'] / 2**30:.1f} GiB moved ({f['bytes'] / base:.2f}x), matmuls {flops}",
              flush=True)
    logits = 64 * 256 * 50304
    print(f"loss, compiled (inductor fuses the fp32 softmax into the kernels around the matmuls; "
          f"from its generated code, tests/training/test_compute.py): 12 bytes a logit, "
          f"{12 * logits / 2**30:.1f} GiB, as nanoGPT's compiled cross-entropy; no fp32 "
          f"vocabulary-sized buffer, one bf16 one a chunk (nanoGPT keeps two: the logits and "
          f"their gradient)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        first = start(run_dir, 2, os.path.join(tmp, "pod-1"))
        second = start(run_dir, a.steps, os.path.join(tmp, "pod-2"))
    print(f"compile, tiny on CPU: first start {first['compile_s']:.1f} s "
          f"({first['fxgraph_cache_miss']} graphs compiled), second start "
          f"{second['compile_s']:.1f} s ({second['fxgraph_cache_hit']} cache hits, "
          f"{second['fxgraph_cache_miss']} misses)")
    print(f"step time, tiny 8 x 128 on CPU, interleaved: eager {second['eager_s'] * 1e3:.1f} ms, "
          f"compiled {second['compiled_s'] * 1e3:.1f} ms (median compiled/eager "
          f"{second['ratio']:.2f}; CPU only: the issue's target is CUDA)")


if __name__ == "__main__":
    main()
