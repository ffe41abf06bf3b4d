"""SIGTERM to the preemption checkpoint: how many steps (and seconds) it takes (not a test).

A 2-worker local run (`python -m training`, what `submitter submit --local` spawns) of the tiny
model on CPU with 32 micro-batches per optimizer step per worker and `--progress-every 20`.
Right after a progress event it sends SIGTERM to the driver and its Ray Train workers (what the
preStop hook does in a pod) and waits for `checkpoint_saved` with reason `preemption`. It
prints the step the signal followed, the step of the checkpoint, the difference in steps, the
step time and the seconds from SIGTERM to the event.

Before issue 23 the workers agreed on the flag once per progress window (every 20 steps here);
now at every step. Run it against another checkout with PYTHONPATH, e.g. the old main:

    git archive 5fcdc7d | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base python benchmarks/bench_preemption.py
    python benchmarks/bench_preemption.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: ../shared beside the checkout (tests/conftest.py), or beside the worktrees' folder
DATA = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()),
            ROOT.parent / "shared")


def events(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def train_workers(session: int) -> list[int]:
    """Ray Train workers in the driver's session (the bench starts the driver in a new one)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if title.startswith(b"ray::RayTrainWorker") and int(fields[3]) == session:
            out.append(int(entry.name))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(DATA / "data" / "wikitext-2" / "valid.txt"))
    p.add_argument("--progress-every", type=int, default=20)
    p.add_argument("--after-step", type=int, default=1,
                   help="signal right after the first progress event at or past this step")
    p.add_argument("--timeout", type=float, default=400)
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-preempt-", dir=os.path.expanduser("~")))
    name = "pre"
    # 2 workers x micro-batch 2 x 32 micro-batches = a global batch of 128 sequences
    argv = [sys.executable, "-m", "training", "--name", name, "--storage-path", str(work),
            "--model", "tiny", "--data", args.data, "--tokenizer", "byte", "--block-size", "64",
            "--val-steps", "2", "--replicas", "2", "--batch-size-per-worker", "2",
            "--global-batch-size", "128", "--epochs", "1", "--max-steps-per-epoch", "100",
            "--progress-every", str(args.progress_every), "--max-failures", "0"]
    env = {**os.environ}
    env.pop("RAY_ADDRESS", None)
    log = (work / "driver.log").open("wb")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    path = work / name / "events.jsonl"
    result: dict = {}
    try:
        deadline = time.monotonic() + args.timeout
        signalled_at = None
        while time.monotonic() < deadline and proc.poll() is None:
            evs = events(path)
            if signalled_at is None:
                progress = [e for e in evs if e["type"] == "progress"
                            and e["step"] >= args.after_step]
                if progress:
                    last = progress[-1]
                    targets = [proc.pid, *train_workers(proc.pid)]
                    for pid in targets:
                        os.kill(pid, signal.SIGTERM)
                    signalled_at = time.monotonic()
                    result.update(signalled_after_step=last["step"],
                                  step_s=round(128 * 64 / last["tokens_per_sec"], 3),
                                  processes=len(targets))
            else:
                saved = [e for e in evs if e["type"] == "checkpoint_saved"
                         and e.get("reason") == "preemption"]
                if saved:
                    result.update(checkpoint_step=saved[0]["step"],
                                  seconds=round(time.monotonic() - signalled_at, 2))
                    break
            time.sleep(0.05)
        code = proc.wait(timeout=120)
        result["exit_code"] = code
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
    if "checkpoint_step" in result:
        result["steps"] = result["checkpoint_step"] - result["signalled_after_step"]
    print(json.dumps(result))
    print(f"(driver log: {work / 'driver.log'})")
    return 0 if "steps" in result else 1


if __name__ == "__main__":
    sys.exit(main())
