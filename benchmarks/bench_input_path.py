"""The input path's figures (training/gpt2/input_path.py), printed as ratios measured in one run.

1. CPU, an injected slow source: steps of `--accum` micro-batches whose source sleeps `--slow-ms`
   on every other step's first fetch, with a fixed compute per micro-batch; the per-step
   data_wait_fraction (`WaitShare`) against what the old per-window figure gave when the
   window also held pauses (an evaluation between steps). No GPU needed.
2. CUDA (skipped without one): gpt2-small forward and backward in bf16 on `--micro` x 256-token
   micro-batches, the old copy (pageable NumPy, `.to(device, non_blocking=True)` on the compute
   stream) against `InputPath` (pinned, side stream, one ahead): ms per step, and from a
   profiler trace, the share of the host-to-device copies' time that ran while a kernel ran on
   another stream (the overlap the side stream exists for).

    python benchmarks/bench_input_path.py [--steps 3 --accum 8 --micro 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from training.gpt2.input_path import InputPath, WaitShare  # noqa: E402


def cpu_wait_accounting(steps: int, accum: int, slow_ms: float, compute_ms: float,
                        pause_ms: float) -> dict:
    import torch

    def source():
        i = 0
        while True:
            if i % (2 * accum) == 0:
                time.sleep(slow_ms / 1e3)  # a block read and tokenized
            i += 1
            yield {"input_ids": np.zeros((8, 256), dtype=np.int64)}

    feed, batches = InputPath(torch.device("cpu")), source()
    per_step, window = [], WaitShare()
    old_wait, window_start = 0.0, time.perf_counter()
    for _ in range(steps):
        t_wait = time.perf_counter()
        micro = feed.take(batches, accum)
        waited = time.perf_counter() - t_wait
        for batch in micro:
            feed.to_device(batch)
            time.sleep(compute_ms / 1e3)
        took = time.perf_counter() - t_wait
        one = WaitShare()
        one.add(waited, took)
        per_step.append(round(one.fraction(), 3))
        window.add(waited, took)
        old_wait += waited
        time.sleep(pause_ms / 1e3)  # evaluation / a checkpoint between steps
    elapsed = time.perf_counter() - window_start
    return {"per_step": per_step, "window_per_step": round(window.fraction(), 3),
            "window_old_per_window": round(old_wait / elapsed, 3)}


def _overlap(trace: str) -> float:
    """Share of HtoD memcpy time during which a kernel ran on another stream."""
    events = json.load(open(trace))["traceEvents"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "")]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    total = covered = 0.0
    for c in copies:
        start, end = c["ts"], c["ts"] + c["dur"]
        total += c["dur"]
        spans = sorted((max(start, k["ts"]), min(end, k["ts"] + k["dur"])) for k in kernels
                       if k["args"].get("stream") != c["args"].get("stream")
                       and k["ts"] < end and k["ts"] + k["dur"] > start)
        last = start
        for a, b in spans:
            a = max(a, last)
            if b > a:
                covered += b - a
                last = b
    return covered / total if total else 0.0


def cuda_step_times(steps: int, accum: int, micro: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from training.gpt2.model import build_model, gpt2_config

    device = torch.device("cuda")
    model = build_model(gpt2_config("gpt2-small", 50257, 50256, 256)).to(device)
    rng = np.random.default_rng(0)
    host = [{"input_ids": rng.integers(0, 50257, (micro, 256))} for _ in range(accum)]

    def old(batch):
        return torch.from_numpy(batch["input_ids"]).to(device, non_blocking=True)

    def run(path: str) -> float:
        feed = InputPath(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            if path == "old":
                micro_batches, to_device = host, old
            else:
                micro_batches, to_device = feed.take(iter(host), accum), feed.to_device
            for batch in micro_batches:
                x = to_device(batch)
                with torch.autocast("cuda", torch.bfloat16):
                    loss = model(input_ids=x, labels=x).loss
                loss.backward()
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps * 1e3

    run("new"), run("old")  # warm-up (cuBLAS, allocator)
    times = {}
    for path in ("old", "new", "old", "new"):  # interleaved
        times.setdefault(path, []).append(run(path))
    overlap = {}
    for path in ("old", "new"):
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            run(path)
        trace = os.path.join(tempfile.mkdtemp(), f"{path}.json")
        prof.export_chrome_trace(trace)
        overlap[path] = round(_overlap(trace), 3)
    best = {k: round(min(v), 1) for k, v in times.items()}
    return {"device": torch.cuda.get_device_name(), "ms_per_step": best,
            "new_over_old": round(best["new"] / best["old"], 3),
            "htod_overlapped_by_kernels": overlap}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--accum", type=int, default=8)
    p.add_argument("--micro", type=int, default=64)
    p.add_argument("--slow-ms", type=float, default=60.0)
    args = p.parse_args()
    print("cpu, slow source:", json.dumps(cpu_wait_accounting(
        6, args.accum, args.slow_ms, compute_ms=5.0, pause_ms=100.0)))
    import torch

    if torch.cuda.is_available():
        print("cuda:", json.dumps(cuda_step_times(args.steps, args.accum, args.micro)))
    else:
        print("cuda: skipped (no CUDA device)")


if __name__ == "__main__":
    main()
