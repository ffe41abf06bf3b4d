"""The metrics trackers' cost per training step (not a test).

A tiny GPT-2 trains on random tokens in this process (1 thread, like a 1-CPU Ray worker) and
every `--progress-every` steps sends a progress event, fire and forget, to an emitter in another
process, as rank 0 sends it to the driver's actor in a run:
  (a) without trackers, and without the grad-norm read (the loop as it was before them);
  (b) with the grad-norm read, and the emitter's TrackerSink: TensorBoard, MLflow (a real
      `mlflow server` on 127.0.0.1 started here, or MLFLOW_TRACKING_URI) and W&B (offline).
(a) runs before and after (b). Printed: the step time (median of 10-step windows) and the
training process's CPU per step; the emitter process's CPU per step (what the trackers' client
code takes from the machine, e.g. from the data pipeline on the same node); and the taxes as a
fraction of the step. Target < 1%. The MLflow server's own work is not counted (it is a service
elsewhere); a shared VM's noise in the step time is printed beside it (the two (a) runs).

    python benchmarks/bench_trackers.py [--steps 300] [--progress-every 10]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def emitter_process(run_dir: str, environ, events: "mp.Queue", out: "mp.Queue") -> None:
    """The driver's actor, stood in for by a process: events in, CPU time out."""
    os.environ.update(environ or {})
    from training.events.emitter import Emitter, events_sink
    from training.events.trackers import TrackerSink

    os.makedirs(run_dir, exist_ok=True)
    sinks = [events_sink(run_dir)]
    if environ is not None:
        sinks.append(TrackerSink(run_dir, {**os.environ, **environ}, []))
    em = Emitter(sinks, [])
    em.emit("run_started", run_name="bench", num_workers=1, storage_path=run_dir)
    for sink in sinks[1:]:  # steady state: imports, the MLflow run, wandb.init are start-up
        for worker in sink.workers:
            worker.opened.wait(300)
    out.put("ready")
    cpu0 = None
    while True:
        item = events.get()
        if item == "start":
            cpu0 = time.process_time()
            continue
        if item == "stop":
            out.put(time.process_time() - cpu0)
            em.emit("run_finished", step=0)  # drain and close: not a training step
            out.put(time.process_time())
            return
        em.emit("progress", **item)


def train(steps: int, every: int, events: "mp.Queue", grad_norm: bool) -> dict:
    import torch

    from training.gpt2.model import BETAS, build_model, build_optimizer, gpt2_config

    torch.manual_seed(0)
    vocab, block, batch = 257, 64, 8
    model = build_model(gpt2_config("tiny", vocab, vocab - 1, block))
    opt = build_optimizer(model, 1e-3, 0.1, BETAS)
    data = torch.randint(0, vocab - 1, (64, batch, block))
    marks, window, cpu0 = [], torch.zeros((), dtype=torch.float64), 0.0
    for step in range(1, steps + 1):
        if step == every + 1:  # after a warm-up window
            cpu0 = time.process_time()
            events.put("start")
        x = data[step % len(data)]
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window += loss.detach().double()
        if step % every == 0:
            fields = {"epoch": 1, "step": step, "loss": round(window.item() / every, 5),
                      "tokens_per_sec": 1000.0, "data_wait_fraction": 0.0, "lr": 1e-3}
            if grad_norm:
                fields["grad_norm"] = round(float(norm), 5)
            events.put(fields)
            window.zero_()
            marks.append(time.perf_counter())
    cpu = time.process_time() - cpu0
    windows = [(b - a) / every for a, b in zip(marks, marks[1:])]
    return {"step_s": statistics.median(windows), "cpu_per_step_s": cpu / (steps - every)}


def one(label: str, root: str, environ, steps: int, every: int) -> dict:
    ctx = mp.get_context("spawn")
    events, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=emitter_process,
                       args=(os.path.join(root, label[:1] + str(time.time())), environ, events, out))
    proc.start()
    assert out.get(timeout=300) == "ready"
    r = train(steps, every, events, grad_norm=environ is not None)
    events.put("stop")
    r["emitter_cpu_per_step_s"] = out.get(timeout=300) / (steps - every)
    out.get(timeout=300)
    proc.join(timeout=60)
    print(f"{label:34} step {r['step_s'] * 1e3:7.2f} ms   training cpu/step "
          f"{r['cpu_per_step_s'] * 1e3:6.2f} ms   emitter cpu/step "
          f"{r['emitter_cpu_per_step_s'] * 1e3:6.3f} ms", flush=True)
    return r


def mlflow_server(root: str) -> tuple[str, subprocess.Popen]:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                             "--port", str(port), "--backend-store-uri",
                             f"sqlite:///{root}/mlflow.db", "--artifacts-destination",
                             f"{root}/artifacts", "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return f"http://127.0.0.1:{port}", proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("mlflow server did not start")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--progress-every", type=int, default=10)
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="bench-trackers-")
    server = None
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        uri, server = mlflow_server(root)
    tracked = {"MLFLOW_TRACKING_URI": uri, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    try:
        base1 = one("a: no trackers", root, None, a.steps, a.progress_every)
        b = one("b: tensorboard + mlflow + wandb", root, tracked, a.steps, a.progress_every)
        base2 = one("a: no trackers (again)", root, None, a.steps, a.progress_every)
    finally:
        if server is not None:
            server.terminate()
    base = [base1, base2]
    step = statistics.mean(r["step_s"] for r in base)

    def tax(key: str) -> float:
        return (b[key] - statistics.mean(r[key] for r in base)) / step

    print(f"tax per step, of a {step * 1e3:.1f} ms step: training process CPU "
          f"{tax('cpu_per_step_s'):+.2%} (noise: the (a) runs differ by "
          f"{abs(base1['cpu_per_step_s'] - base2['cpu_per_step_s']) / step:.2%}); step time "
          f"{tax('step_s'):+.2%} (noise {abs(base1['step_s'] - base2['step_s']) / step:.2%}); "
          f"the trackers' CPU in the emitter process {tax('emitter_cpu_per_step_s'):.2%}; "
          "target < 1%")


if __name__ == "__main__":
    main()
