"""Throughput and recovery of the training entrypoint vs plain PyTorch (not a test).

Same tiny model, batch and data everywhere:
  (a) a plain single-process PyTorch loop (1 thread: what a 1-CPU Ray worker gets),
  (b) `python -m training` with 1 worker,   (c) with 2 workers,
  (d) for reference, plain PyTorch DDP (gloo) with 2 processes and no Ray: the ceiling (c) can
      reach on this machine;
  (e) the same plain DDP loop run by Ray Train (2 workers, no Ray Data, no events): Ray Train's
      own floor, which (c) cannot beat;
then prints b/a (target >= 0.97), c/b (target >= 1.5), c/d, the time from command to first
step, and the time from SIGKILL of one worker to the first resumed step (target <= 8 s).

Throughput is measured in windows of 10 steps after a warm-up of 10 (from the progress events'
timestamps for the entrypoint, so data loading, events and all-reduce count) and summarized by
the median window: a neighbour's burst on a shared VM slows a few windows, not the estimate.
The mean over all windows is printed too. (a)-(d) run in `--rounds` interleaved rounds ((a)
right before and after (b)), and a ratio is the median of the per-round ratios, so the slow
drift of a shared machine cancels out. Expect about 3 minutes a round.
Start-up is reported separately.

    python benchmarks/bench_training.py [--steps 200] [--rounds 3] [--storage DIR]
"""

from __future__ import annotations
from submitter.contract import naming

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from submitter.contract import events as ev  # noqa: E402

WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.txt"
BLOCK, BATCH, WARM, WINDOW = 128, 8, 10, 10


def ts(event: dict) -> float:
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def summary(rates: list[float]) -> dict:
    return {"median": statistics.median(rates), "mean": statistics.fmean(rates), "windows": len(rates)}


def _blocks(data_args: list[str]):
    import torch

    from training.data.pipeline import stdlib_files
    from training.data.tokens import byte_encoding, tokenize_and_chunk

    enc = byte_encoding()
    if "--data" in data_args:
        lines = WIKI.read_text(encoding="utf-8").splitlines()
    else:
        lines = [ln for f in stdlib_files()[:200] for ln in f.read_text(errors="replace").splitlines()]
    return enc, torch.from_numpy(tokenize_and_chunk(lines, enc, BLOCK))


def _plain_train(rank: int, world: int, steps: int, data_args: list[str], port: int,
                 results=None, wrap=None) -> tuple[list[float], float]:
    """The training step of training/gpt2/loop.py without Ray: tokens/s of each 10-step window
    (all ranks' tokens) and this process's CPU seconds per step after the warm-up. With
    world > 1: DDP over gloo, as Ray Train sets it up on CPU; with `wrap`, the process group
    exists already and `wrap` makes the DDP model (inside Ray Train: (e))."""
    import torch

    from training.gpt2.model import build_model, build_optimizer, build_scheduler, gpt2_config

    torch.set_num_threads(1)
    enc, blocks = _blocks(data_args)
    torch.manual_seed(0)
    model = build_model(gpt2_config("tiny", enc.n_vocab, enc.eot_token, BLOCK))
    if wrap is not None:
        model = wrap(model)
    elif world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = build_optimizer(model, 2e-3, 0.1, (0.9, 0.95))
    sched = build_scheduler(opt, 10, steps, 0.1)
    marks = []  # the time when `step` steps are done, for step = WARM, WARM + WINDOW, ...
    for step in range(steps + 1):
        if step == WARM:
            cpu_start = time.process_time()
        if step >= WARM and (step - WARM) % WINDOW == 0:
            marks.append(time.perf_counter())
        if step == steps:
            cpu_per_step = (time.process_time() - cpu_start) / (steps - WARM)
            break
        i = ((step * world + rank) * BATCH) % (len(blocks) - BATCH)
        x = blocks[i:i + BATCH]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss.item()
    rates = [BATCH * BLOCK * world * WINDOW / (b - a) for a, b in zip(marks, marks[1:])]
    if world > 1 and wrap is None:
        torch.distributed.destroy_process_group()
    if results is not None:
        results[rank] = rates
    return rates, cpu_per_step


def plain_loop(steps: int, data_args: list[str]) -> dict:
    """(a) one process, one thread."""
    rates, cpu_per_step = _plain_train(0, 1, steps, data_args, 0)
    return {**summary(rates), "cpu_per_step": cpu_per_step}


def plain_ddp(steps: int, data_args: list[str], world: int = 2) -> dict:
    """(d) `world` processes of plain PyTorch DDP (what torchrun would run), no Ray."""
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_plain_train, args=(world, steps, data_args, port, results), nprocs=world)
    return summary(results[0])


def _in_ray_train(config: dict) -> None:
    """(e)'s train function: the plain loop inside Ray Train's worker group; rank 0 writes
    its window rates to config["out"]."""
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rates, _ = _plain_train(ctx.get_world_rank(), ctx.get_world_size(), config["steps"],
                            config["data_args"], 0, wrap=ray.train.torch.prepare_model)
    if ctx.get_world_rank() == 0:
        Path(config["out"]).write_text(json.dumps(rates))


def ray_plain_ddp(steps: int, data_args: list[str], storage: Path, world: int = 2) -> dict:
    """(e) the plain DDP loop run by Ray Train (embedded Ray, `world` CPU workers) with no Ray
    Data, no events and none of training/: Ray Train's own floor on this machine."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                             os.environ.get("PYTHONPATH")]))
    out = storage / "bench-ray-plain.json"
    ray.init(address="local", num_cpus=world + 1, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    try:
        TorchTrainer(_in_ray_train,
                     train_loop_config={"steps": steps, "data_args": data_args, "out": str(out)},
                     scaling_config=ray.train.ScalingConfig(num_workers=world),
                     run_config=ray.train.RunConfig(storage_path=str(storage),
                                                    name="bench-ray-plain")).fit()
        return summary(json.loads(out.read_text()))
    finally:
        ray.shutdown()
        shutil.rmtree(storage / "bench-ray-plain", ignore_errors=True)


def entrypoint(storage: Path, name: str, workers: int, steps: int, data_args: list[str],
               kill_at_step: int | None = None) -> dict:
    """Run `python -m training`; return throughput, start-up and (optionally) recovery times."""
    shutil.rmtree(storage / name, ignore_errors=True)
    argv = [sys.executable, "-m", "training", "--name", name, "--storage-path", str(storage),
            "--replicas", str(workers), "--model", "tiny", "--tokenizer", "byte",
            "--block-size", str(BLOCK), "--batch-size-per-worker", str(BATCH), "--epochs", "1",
            "--max-steps-per-epoch", str(steps), "--progress-every", "10", "--val-steps", "2",
            "--max-failures", "2", *data_args]
    if kill_at_step:
        argv += ["--checkpoint-every", str(kill_at_step // 2)]
    events_file = storage / name / naming.EVENTS_FILE
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at = None
    cpu_marks: list[tuple[int, float]] = []  # (step, CPU seconds of all the workers' threads)
    seen_size, last = -1, 0
    while proc.poll() is None:
        size = events_file.stat().st_size if events_file.exists() else 0
        if size != seen_size:  # parse only what changed: this loop shares the CPUs it measures
            seen_size, last = size, _last_progress_step(events_file)
        if kill_at_step and killed_at is None and last >= kill_at_step:
            pid = _worker_pids()[-1]
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
        if not kill_at_step and last >= WARM and (not cpu_marks or last > cpu_marks[-1][0]):
            cpu_marks.append((last, _cpu_seconds(_worker_pids())))
        time.sleep(0.05)
    evs = ev.parse_lines(events_file.read_text())
    prog = [e for e in evs if e["type"] == "progress"]
    out = {"ok": evs[-1]["type"] == "run_finished", "first_step_s": ts(prog[0]) - t0,
           "wall_s": time.time() - t0}
    if kill_at_step is None:
        window = [e for e in prog if e["step"] >= WARM]
        out.update(summary([BATCH * BLOCK * workers * (b["step"] - a["step"]) / (ts(b) - ts(a))
                            for a, b in zip(window, window[1:])]))
        (s0, c0), (s1, c1) = cpu_marks[0], cpu_marks[-2]  # the last one may be the exit's
        out["cpu_per_step"] = (c1 - c0) / (s1 - s0) / workers
    else:
        restart = next(e for e in evs if e["type"] == "worker_group_restarted")
        resumed = next(e for e in evs[evs.index(restart):] if e["type"] == "progress")
        out.update(kill_to_restart_event_s=ts(restart) - killed_at,
                   kill_to_resumed_step_s=ts(resumed) - killed_at,
                   resumed_from=restart["resumed_from"], resumed_step=resumed["step"])
    return out


def _last_progress_step(events_file: Path) -> int:
    try:
        evs = ev.parse_lines(events_file.read_text())
    except OSError:
        return 0
    return max((e["step"] for e in evs if e["type"] == "progress"), default=0)


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (all their threads)."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


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


def ratio(num: list[dict], den: list[dict], key: str = "median") -> tuple[float, list[float]]:
    """Median over rounds of the per-round ratio, and the per-round ratios."""
    per_round = [n[key] / d[key] for n, d in zip(num, den)]
    return statistics.median(per_round), per_round


def line(label: str, runs: list[dict], extra: str = "") -> str:
    medians = ", ".join(f"{r['median']:,.0f}" for r in runs)
    means = ", ".join(f"{r['mean']:,.0f}" for r in runs)
    return f"{label:34s} median window {medians:>18s} tokens/s  (mean {means}){extra}"


def first_steps(runs: list[dict]) -> str:
    return "; command -> first step " + ", ".join(f"{r['first_step_s']:.1f}" for r in runs) + " s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="steps per measurement (default 200)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of (a)-(e)")
    p.add_argument("--storage", default=str(Path.home() / ".cache" / "submitter-bench"))
    args = p.parse_args()
    if args.steps < WARM + 3 * WINDOW or args.rounds < 1:
        p.error(f"--steps must be at least {WARM + 3 * WINDOW} (warm-up plus 3 windows) and "
                "--rounds at least 1")
    storage = Path(args.storage)
    storage.mkdir(parents=True, exist_ok=True)
    data_args = ["--data", str(WIKI)] if WIKI.exists() else ["--dataset", "python-stdlib"]
    print(f"cpus: {os.cpu_count()}, data: {data_args[-1]}, tiny GPT-2, block {BLOCK}, "
          f"batch {BATCH}/worker, {args.steps} steps, {args.rounds} round(s)", flush=True)
    a, b, c, d, e = [], [], [], [], []
    for r in range(args.rounds):
        before = plain_loop(args.steps, data_args)
        b.append(entrypoint(storage, "bench-1w", 1, args.steps, data_args))
        after = plain_loop(args.steps, data_args)  # (a) on both sides of (b): b/a sees one moment
        a.append({k: (before[k] + after[k]) / 2 for k in ("median", "mean", "cpu_per_step")})
        c.append(entrypoint(storage, "bench-2w", 2, args.steps, data_args))
        d.append(plain_ddp(args.steps, data_args))
        e.append(ray_plain_ddp(args.steps, data_args, storage))
        print(f"round {r + 1}: a {a[-1]['median']:,.0f}  b {b[-1]['median']:,.0f}  "
              f"c {c[-1]['median']:,.0f}  d {d[-1]['median']:,.0f}  e {e[-1]['median']:,.0f} "
              "tokens/s", flush=True)
    print(line("(a) plain PyTorch loop, 1 thread:", a))
    print(line("(b) entrypoint, 1 worker:", b, first_steps(b)))
    print(line("(c) entrypoint, 2 workers:", c, first_steps(c)))
    print(line("(d) plain PyTorch DDP, 2 procs:", d))
    print(line("(e) plain DDP loop in Ray Train:", e))
    cpu = ", ".join(f"{x['cpu_per_step'] * 1e3:.1f}/{y['cpu_per_step'] * 1e3:.1f}" for x, y in zip(b, a))
    print(f"CPU per step, (b)/(a): {cpu} ms: what Ray Train adds to a step, whatever the VM's speed")
    cpu_ratio, cpu_rounds = ratio(a, b, "cpu_per_step")
    print(f"b/a by CPU per step = {cpu_ratio:.3f}   (rounds {', '.join(f'{x:.3f}' for x in cpu_rounds)})")
    for name, num, den, target in (("b/a", b, a, ">= 0.97"), ("c/b", c, b, ">= 1.5"),
                                   ("c/d", c, d, ">= 0.95: the entrypoint's cost over plain DDP"),
                                   ("d/a", d, a, "what DDP itself scales to here"),
                                   ("e/d", e, d, "Ray Train's own floor: its cost over DDP"),
                                   ("c/e", c, e, "what Ray Data, events and the loop add")):
        med, per_round = ratio(num, den)
        mean_med, _ = ratio(num, den, "mean")
        print(f"{name} = {med:.3f}   ({target}; rounds {', '.join(f'{x:.3f}' for x in per_round)}; "
              f"by mean windows {mean_med:.3f})")
    k = entrypoint(storage, "bench-kill", 2, args.steps, data_args, kill_at_step=args.steps // 2)
    print(f"worker SIGKILL -> worker_group_restarted event: {k['kill_to_restart_event_s']:.1f} s; "
          f"-> first resumed step (step {k['resumed_step']}): {k['kill_to_resumed_step_s']:.1f} s "
          f"(target <= 8 s); resumed from {Path(k['resumed_from'] or 'scratch').name}; "
          f"finished: {k['ok']}")
    for name in ("bench-1w", "bench-2w", "bench-kill"):
        shutil.rmtree(storage / name, ignore_errors=True)


if __name__ == "__main__":
    main()
