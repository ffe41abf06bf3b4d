"""Throughput and recovery of the training entrypoint vs a plain PyTorch loop (not a test).

One run, same tiny model, batch and data for all three measurements:
  (a) a plain single-process PyTorch loop (1 thread: what a 1-CPU Ray worker gets),
  (b) `python -m training` with 1 worker,   (c) with 2 workers;
then prints b/a (target >= 0.97), c/b (target >= 1.5), the time from command to first step,
and the time from SIGKILL of one worker to the first resumed step (target <= 30 s).

Throughput is wall clock between progress events (steps 10..N), so data loading, event and
all-reduce overheads count; start-up is reported separately.

    python benchmarks/bench_training.py [--steps 150] [--storage DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training import events as ev  # noqa: E402

WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.txt"
BLOCK, BATCH, WARM = 128, 8, 10


def ts(event: dict) -> float:
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def plain_loop(steps: int, data_args: list[str]) -> float:
    """(a) tokens/s of the same model and batch in one process, no Ray."""
    import torch

    from training.data import stdlib_files
    from training.model import build_model, build_optimizer, build_scheduler, gpt2_config
    from training.tokens import byte_encoding, tokenize_and_chunk

    torch.set_num_threads(1)
    enc = byte_encoding()
    if "--data" in data_args:
        lines = WIKI.read_text(encoding="utf-8").splitlines()
    else:
        lines = [ln for f in stdlib_files()[:200] for ln in f.read_text(errors="replace").splitlines()]
    blocks = torch.from_numpy(tokenize_and_chunk(lines, enc, BLOCK))
    torch.manual_seed(0)
    model = build_model(gpt2_config("tiny", enc.n_vocab, enc.eot_token, BLOCK))
    opt = build_optimizer(model, 2e-3, 0.1, (0.9, 0.95))
    sched = build_scheduler(opt, 10, steps, 0.1)
    start = None
    for step in range(steps):
        if step == WARM:
            start = time.perf_counter()
        i = (step * BATCH) % (len(blocks) - BATCH)
        x = blocks[i:i + BATCH]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss.item()
    return BATCH * BLOCK * (steps - WARM) / (time.perf_counter() - start)


def entrypoint(storage: Path, name: str, workers: int, steps: int, data_args: list[str],
               kill_at_step: int | None = None) -> dict:
    """Run `python -m training`; return throughput, start-up and (optionally) recovery times."""
    shutil.rmtree(storage / name, ignore_errors=True)
    argv = [sys.executable, "-m", "training", "--name", name, "--storage-path", str(storage),
            "--num-workers", str(workers), "--model", "tiny", "--tokenizer", "byte",
            "--block-size", str(BLOCK), "--batch-size-per-worker", str(BATCH), "--epochs", "1",
            "--max-steps-per-epoch", str(steps), "--progress-every", "10", "--val-steps", "2",
            "--max-failures", "2", *data_args]
    if kill_at_step:
        argv += ["--checkpoint-every", str(kill_at_step // 2)]
    events_file = storage / name / ev.EVENTS_FILE
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at = None
    while proc.poll() is None:
        if kill_at_step and killed_at is None and events_file.exists():
            evs = ev.parse_lines(events_file.read_text())
            if any(e["type"] == "progress" and e["step"] >= kill_at_step for e in evs):
                pid = _worker_pids()[-1]
                killed_at = time.time()
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    evs = ev.parse_lines(events_file.read_text())
    prog = [e for e in evs if e["type"] == "progress"]
    out = {"ok": evs[-1]["type"] == "run_finished", "first_step_s": ts(prog[0]) - t0,
           "wall_s": time.time() - t0}
    if kill_at_step is None:
        window = [e for e in prog if e["step"] >= WARM]
        a, b = window[0], window[-1]
        out["tokens_per_sec"] = BATCH * BLOCK * workers * (b["step"] - a["step"]) / (ts(b) - ts(a))
    else:
        restart = next(e for e in evs if e["type"] == "worker_group_restarted")
        resumed = next(e for e in evs[evs.index(restart):] if e["type"] == "progress")
        out.update(kill_to_restart_event_s=ts(restart) - killed_at,
                   kill_to_resumed_step_s=ts(resumed) - killed_at,
                   resumed_from=restart["resumed_from"], resumed_step=resumed["step"])
    return out


def _worker_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"ray::RayTrainWorker"):
                pids.append(int(entry))
    return pids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--storage", default=str(Path.home() / ".cache" / "submitter-bench"))
    args = p.parse_args()
    storage = Path(args.storage)
    storage.mkdir(parents=True, exist_ok=True)
    data_args = ["--data", str(WIKI)] if WIKI.exists() else ["--dataset", "python-stdlib"]
    print(f"cpus: {os.cpu_count()}, data: {data_args[-1]}, tiny GPT-2, block {BLOCK}, "
          f"batch {BATCH}/worker, {args.steps} steps", flush=True)
    a = plain_loop(args.steps, data_args)
    print(f"(a) plain PyTorch loop, 1 thread:  {a:10,.0f} tokens/s", flush=True)
    b = entrypoint(storage, "bench-1w", 1, args.steps, data_args)
    print(f"(b) entrypoint, 1 worker:          {b['tokens_per_sec']:10,.0f} tokens/s  "
          f"(command -> first step {b['first_step_s']:.1f} s, wall {b['wall_s']:.0f} s)", flush=True)
    c = entrypoint(storage, "bench-2w", 2, args.steps, data_args)
    print(f"(c) entrypoint, 2 workers:         {c['tokens_per_sec']:10,.0f} tokens/s  "
          f"(command -> first step {c['first_step_s']:.1f} s, wall {c['wall_s']:.0f} s)", flush=True)
    print(f"b/a = {b['tokens_per_sec'] / a:.3f}   (target >= 0.97)")
    print(f"c/b = {c['tokens_per_sec'] / b['tokens_per_sec']:.3f}   (target >= 1.5)")
    k = entrypoint(storage, "bench-kill", 2, args.steps, data_args, kill_at_step=args.steps // 2)
    print(f"worker SIGKILL -> worker_group_restarted event: {k['kill_to_restart_event_s']:.1f} s; "
          f"-> first resumed step (step {k['resumed_step']}): {k['kill_to_resumed_step_s']:.1f} s "
          f"(target <= 30 s); resumed from {Path(k['resumed_from']).name}; finished: {k['ok']}")
    for name in ("bench-1w", "bench-2w", "bench-kill"):
        shutil.rmtree(storage / name, ignore_errors=True)


if __name__ == "__main__":
    main()
