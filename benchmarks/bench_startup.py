"""Start-up of the training entrypoint: how long until the first step (not a test).

Reports, from one run:
  (1) (command -> first step of `python -m training`, 1 worker, the small local corpus)
      / (the same first step in one process without Ray: import, read, tokenize, build, step);
      target <= 2.5;
  and, for scale, Ray Train's own floor: command -> the first line of an EMPTY train function;
  (2) (command -> first step on the LARGE corpus) / (on the SMALL one), for a local text file
      and for a Hub-style dataset (a local directory of Parquet files loaded through
      `datasets.load_dataset`, the `--dataset` path): start-up must not grow with the corpus;
      target <= 1.2 for both.
The corpora are WikiText-2 repeated to the sizes asked (default 5 MB and 200 MB), written once
under --work. Every figure is the median of --repeats runs. Run it on a quiet machine; under
load the ratios mean little. For a quick check that it works:

    python benchmarks/bench_startup.py --small-mb 0.2 --large-mb 1 --repeats 1
    python benchmarks/bench_startup.py                       # the real figures (~10 minutes)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from submitter.contract import events as ev  # noqa: E402

WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.txt"
BLOCK, BATCH = 128, 8
TIMEOUT = 600
#: Seconds from command to run_started of every entrypoint run, in order.
STARTED: list[float] = []


def make_text(path: Path, megabytes: float) -> Path:
    """WikiText-2 lines repeated to `megabytes` (kept between runs)."""
    want = int(megabytes * 1e6)
    if path.exists() and path.stat().st_size >= want:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    chunk = WIKI.read_bytes()
    with path.open("wb") as f:
        written = 0
        while written < want:
            piece = chunk[: want - written]
            f.write(piece)
            written += len(piece)
    return path


def make_hub_dir(text: Path, out: Path) -> Path:
    """A local dataset directory `datasets.load_dataset(out)` reads: train + validation Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if (out / "train.parquet").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    lines = text.read_text(encoding="utf-8").splitlines(keepends=True)
    pq.write_table(pa.table({"text": lines}), out / "train.parquet")
    pq.write_table(pa.table({"text": lines[:2000]}), out / "validation.parquet")
    return out


def entrypoint_first_step(storage: Path, name: str, data_args: list[str]) -> float:
    """Seconds from starting `python -m training` to its first progress event (the time to
    its run_started event, when Ray is up and the data planned, is kept in STARTED)."""
    shutil.rmtree(storage / name, ignore_errors=True)
    argv = [sys.executable, "-m", "training", "--name", name, "--storage-path", str(storage),
            "--model", "tiny", "--tokenizer", "byte", "--block-size", str(BLOCK),
            "--batch-size-per-worker", str(BATCH), "--replicas", "1", "--epochs", "1",
            "--max-steps-per-epoch", "3", "--progress-every", "1", "--val-steps", "1",
            *data_args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=storage, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    first = None
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            event = ev.parse_line(line)
            if event and event.get("type") == "run_started":
                STARTED.append(time.perf_counter() - start)
            if event and event.get("type") == "progress":
                first = time.perf_counter() - start
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    if first is None:
        raise SystemExit(f"{name}: no progress event (run the command by hand: {' '.join(argv)})")
    return first


PLAIN = r"""
import sys, time
t0 = float(sys.argv[2])
import torch
from training.gpt2.model import build_model, build_optimizer, gpt2_config
from training.data.tokens import byte_encoding, tokenize_and_chunk
torch.set_num_threads(1)
enc = byte_encoding()
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
blocks = torch.from_numpy(tokenize_and_chunk(lines, enc, %(block)d))
torch.manual_seed(0)
model = build_model(gpt2_config("tiny", enc.n_vocab, enc.eot_token, %(block)d))
opt = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95))
x = blocks[:%(batch)d]
loss = model(input_ids=x, labels=x).loss
loss.backward(); opt.step(); loss.item()
print(time.time() - t0)
"""


def plain_first_step(text: Path) -> float:
    """Seconds from starting a plain Python process to its first step (no Ray)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = PLAIN % {"block": BLOCK, "batch": BATCH}
    out = subprocess.run([sys.executable, "-c", code, str(text), repr(time.time())], env=env,
                         capture_output=True, text=True, timeout=TIMEOUT, check=True)
    return float(out.stdout.strip().splitlines()[-1])


RAY_FLOOR = r"""
import sys, time
t0, out = float(sys.argv[1]), sys.argv[2]
import ray, ray.train
from ray.train.torch import TorchTrainer

def first_line(config):
    import time
    with open(config["out"], "w") as f:
        f.write(repr(time.time() - config["t0"]))

ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
TorchTrainer(first_line, train_loop_config={"t0": t0, "out": out},
             scaling_config=ray.train.ScalingConfig(num_workers=1),
             run_config=ray.train.RunConfig(storage_path=sys.argv[3], name="ray-floor")).fit()
"""


def ray_floor(storage: Path) -> float:
    """Seconds from starting a process to the first line of an EMPTY Ray Train function (1
    CPU worker, embedded Ray, no data, no model): what no entrypoint on Ray Train can beat."""
    out = storage / "ray-floor.txt"
    out.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-c", RAY_FLOOR, repr(time.time()), str(out), str(storage)],
                   capture_output=True, timeout=TIMEOUT, check=True)
    shutil.rmtree(storage / "ray-floor", ignore_errors=True)
    return float(out.read_text())


def median_of(repeats: int, fn, *args) -> float:
    return statistics.median(fn(*args) for _ in range(repeats))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small-mb", type=float, default=5.0)
    p.add_argument("--large-mb", type=float, default=200.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", default=str(Path.home() / ".cache" / "submitter-bench-startup"))
    a = p.parse_args()
    work = Path(a.work)
    storage = work / "runs"
    storage.mkdir(parents=True, exist_ok=True)
    small = make_text(work / f"small-{a.small_mb:g}mb.txt", a.small_mb)
    large = make_text(work / f"large-{a.large_mb:g}mb.txt", a.large_mb)
    hub_small = make_hub_dir(small, work / f"hub-small-{a.small_mb:g}mb")
    hub_large = make_hub_dir(large, work / f"hub-large-{a.large_mb:g}mb")
    load = os.getloadavg()
    print(f"cpus: {os.cpu_count()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"corpora {a.small_mb:g} MB and {a.large_mb:g} MB, median of {a.repeats}")

    plain = median_of(a.repeats, plain_first_step, small)
    floor = median_of(a.repeats, ray_floor, storage)
    file_small = median_of(a.repeats, entrypoint_first_step, storage, "su-fs", ["--data", str(small)])
    started = statistics.median(STARTED)
    file_large = median_of(a.repeats, entrypoint_first_step, storage, "su-fl", ["--data", str(large)])
    hub_s = median_of(a.repeats, entrypoint_first_step, storage, "su-hs",
                      ["--dataset", str(hub_small), "--dataset-config", "default"])
    hub_l = median_of(a.repeats, entrypoint_first_step, storage, "su-hl",
                      ["--dataset", str(hub_large), "--dataset-config", "default"])
    print(f"plain process, first step ({a.small_mb:g} MB file): {plain:.1f} s")
    print(f"entrypoint, first step: file {file_small:.1f} s / {file_large:.1f} s, "
          f"hub {hub_s:.1f} s / {hub_l:.1f} s ({a.small_mb:g} MB / {a.large_mb:g} MB)")
    print(f"  of which command -> run_started (Ray up, tokenizer, data planned): {started:.1f} s; "
          f"run_started -> first step (Ray Train's controller and workers, model, first "
          f"batch): {file_small - started:.1f} s")
    print(f"Ray Train's floor, command -> first line of an empty train function: {floor:.1f} s "
          f"= {floor / plain:.2f} x plain; the entrypoint adds {file_small - floor:.1f} s to it")
    print(f"(1) command -> first step / plain = {file_small / plain:.2f}   (target <= 2.5)")
    print(f"(2) {a.large_mb:g} MB / {a.small_mb:g} MB: file {file_large / file_small:.2f}, "
          f"hub {hub_l / hub_s:.2f}   (target <= 1.2)")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
