"""The metrics trackers' cost per training step (not a test).

A tiny GPT-2 trains on random tokens in this process (1 thread, like a 1-CPU Ray worker) and
every `--progress-every` steps sends the progress event a run's rank 0 sends (the grad norm read
included) into an emitter built as a run builds it: (a) events.jsonl only, (b) events.jsonl +
TensorBoard + MLflow (a local sqlite store, or MLFLOW_TRACKING_URI) + W&B (offline). In a run the
emitter is another process (the driver's actor); here it shares the step's process, so this is
the worst case. Printed per configuration:
  - the step time (median of windows) and the time the step loop spent inside emit(),
  - the process CPU time per step (the trackers' threads included),
  - the tax: (b) - (a) as a fraction of the step, for the emit() time (what blocks the step)
    and for the CPU time (what the trackers' threads take from the machine). Target < 1%.

    python benchmarks/bench_trackers.py [--steps 300] [--progress-every 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(steps: int, every: int, emitter, vocab: int = 257, block: int = 64, batch: int = 8):
    import torch

    from training.model import BETAS, build_model, build_optimizer, gpt2_config

    torch.manual_seed(0)
    model = build_model(gpt2_config("tiny", vocab, vocab - 1, block))
    opt = build_optimizer(model, 1e-3, 0.1, BETAS)
    data = torch.randint(0, vocab - 1, (64, batch, block))
    emit_s, marks = 0.0, []
    window = torch.zeros((), dtype=torch.float64)
    cpu0 = None
    for step in range(1, steps + 1):
        if step == every + 1:  # after a warm-up window
            cpu0, emit_s = time.process_time(), 0.0
        x = data[step % len(data)]
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window += loss.detach().double()
        if step % every == 0:
            t = time.perf_counter()
            emitter.emit("progress", epoch=1, step=step, loss=round(window.item() / every, 5),
                         tokens_per_sec=1000.0, data_wait_fraction=0.0, lr=1e-3,
                         grad_norm=round(float(norm), 5))
            emit_s += time.perf_counter() - t
            window.zero_()
            marks.append(time.perf_counter())
    measured = steps - every
    cpu = time.process_time() - cpu0
    windows = [(b - a) / every for a, b in zip(marks, marks[1:])]
    return {"step_s": statistics.median(windows), "emit_per_step_s": emit_s / measured,
            "cpu_per_step_s": cpu / measured}


def emitter(run_dir: str, environ: dict):
    from training.emitter import Emitter, events_sink
    from training.trackers import TrackerSink

    os.makedirs(run_dir, exist_ok=True)
    sinks = [events_sink(run_dir)]
    if environ is not None:
        sinks.append(TrackerSink(run_dir, environ, []))
    em = Emitter(sinks, [])
    em.emit("run_started", run_name="bench", num_workers=1, storage_path=run_dir)
    return em


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--progress-every", type=int, default=10)
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="bench-trackers-")
    os.environ.setdefault("WANDB_SILENT", "true")
    tracked = {"MLFLOW_TRACKING_URI": os.environ.get("MLFLOW_TRACKING_URI")
               or f"sqlite:///{root}/mlflow.db", "WANDB_MODE": "offline"}
    results = {}
    for label, env in (("a: events.jsonl only", None), ("b: + tensorboard, mlflow, wandb", tracked),
                       ("a: events.jsonl only (again)", None)):
        em = emitter(os.path.join(root, label[0] + str(len(results))), env)
        results[label] = r = train(a.steps, a.progress_every, em)
        t = time.perf_counter()
        em.emit("run_finished", step=a.steps)  # drains and closes the trackers (not a step)
        print(f"{label:32} step {r['step_s'] * 1e3:7.2f} ms  emit/step "
              f"{r['emit_per_step_s'] * 1e6:8.1f} us  cpu/step {r['cpu_per_step_s'] * 1e3:7.2f} ms"
              f"  (close {time.perf_counter() - t:.1f} s)")
    base = [results["a: events.jsonl only"], results["a: events.jsonl only (again)"]]
    b = results["b: + tensorboard, mlflow, wandb"]
    step = statistics.mean(r["step_s"] for r in base)
    emit_tax = (b["emit_per_step_s"] - statistics.mean(r["emit_per_step_s"] for r in base)) / step
    cpu_tax = (b["cpu_per_step_s"] - statistics.mean(r["cpu_per_step_s"] for r in base)) / step
    print(f"tax on the step (emit, blocking): {emit_tax:.3%}   trackers' CPU per step: "
          f"{cpu_tax:.2%} of a step (target < 1%; noise: the two (a) runs differ by "
          f"{abs(base[0]['cpu_per_step_s'] - base[1]['cpu_per_step_s']) / step:.2%})")


if __name__ == "__main__":
    main()
