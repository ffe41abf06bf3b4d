"""The compute path's figures on this machine (issue #18; CPU, a few minutes):

1. The loss: the largest logits tensor the plain loss (Hugging Face's: all logits, upcast to
   fp32) and `training.loss.lm_loss` create for gpt2-small's micro-batch (8 x 256 tokens,
   50,304 logits, bf16), forward and backward. Counted op by op on meta tensors: no memory
   is used and no time is measured.
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
from training.compiling import CompileCache, compile_model, compile_seconds, counters
from training.model import build_model, build_optimizer, gpt2_config

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

    from training.loss import lm_loss

    vocab = 50304

    class Largest(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == vocab:
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
