"""Object storage, proven: Ray Train checkpoints and the run's events in an S3 bucket.

A real S3-protocol server (moto's, on 127.0.0.1) stands in for AWS; pyarrow, and so Ray Train,
reach it through `AWS_ENDPOINT_URL`, exactly as they would reach a cloud bucket.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from submitter.contract import events as ev
from submitter.contract import naming
from tests.conftest import ROOT
from tests.training.test_ray import _args, _our_workers
from training.run.object_store import ObjectStoreSink


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _event(etype: str, seq: int, **fields) -> dict:
    return ev.make_event(etype, time="2026-11-24T00:00:00Z", seq=seq, **fields)


def _progress(seq: int) -> dict:
    return _event("progress", seq, epoch=1, step=seq, loss=1.0, lr=1e-3, tokens_per_sec=1.0)


def test_the_sink_writes_through_what_matters_and_batches_progress(s3_server):
    s3_server.make_bucket("bkt")
    clock = _Clock()
    uri = "s3://bkt/runs/job/events.jsonl"
    sink = ObjectStoreSink(uri, min_interval=15, clock=clock)
    state = ev.fold([])
    sink.write(_event("run_started", 1, run_name="job", num_workers=1, storage_path="s3://bkt/runs"), state)
    assert len(ev.parse_lines(s3_server.read_text("bkt/runs/job/events.jsonl"))) == 1
    sink.write(_progress(2), state)
    clock.now = 5
    sink.write(_progress(3), state)  # within the interval: kept, not yet written
    assert len(ev.parse_lines(s3_server.read_text("bkt/runs/job/events.jsonl"))) == 1
    sink.write(_event("checkpoint_saved", 4, epoch=1, step=3, path="s3://bkt/runs/job/c1"), state)
    assert [e["seq"] for e in ev.parse_lines(s3_server.read_text("bkt/runs/job/events.jsonl"))] == [1, 2, 3, 4]
    clock.now = 30
    sink.write(_progress(5), state)  # the interval passed: written
    assert len(ev.parse_lines(s3_server.read_text("bkt/runs/job/events.jsonl"))) == 5
    # a new driver (a resumed run) reads the history back and appends after it
    again = ObjectStoreSink(uri, clock=clock)
    assert [e["seq"] for e in again.read()] == [1, 2, 3, 4, 5]
    again.write(_event("run_finished", 6, epoch=1, step=5), state)
    assert [e["seq"] for e in ev.parse_lines(s3_server.read_text("bkt/runs/job/events.jsonl"))] == [1, 2, 3, 4, 5, 6]


def test_a_missing_events_object_is_an_empty_history(s3_server):
    s3_server.make_bucket("bkt")
    assert ObjectStoreSink("s3://bkt/nothing/events.jsonl").read() == []


def _bucket_events(s3_server, run: str) -> list[dict]:
    text = s3_server.read_text(f"bkt/runs/{run}/{naming.EVENTS_FILE}")
    return ev.parse_lines(text) if text else []


@pytest.mark.slow
def test_a_killed_worker_resumes_from_the_checkpoint_in_the_bucket(s3_server):
    import ray

    from training.args import parse_args
    from training.driver import prepare_run, run

    s3_server.make_bucket("bkt")
    steps, killed, seen, done = 30, [], [], threading.Event()

    def kill_mid_epoch_two() -> None:
        """Once Ray Train's snapshot in the bucket lists the first checkpoint and epoch 2 is
        under way (the driver's live events say so), kill one worker."""
        while not (killed or done.is_set()):
            # checkpoint_saved is sent once Ray Train registered the checkpoint: the driver's
            # live events say so without reading the bucket (slow under load: epoch 2 of 30
            # steps could end before a bucket read did)
            now = list(seen)
            ready = any(e["type"] == "progress" and e["step"] >= steps + 2 for e in now) \
                and any(e["type"] == "checkpoint_saved" and e.get("registered") for e in now)
            pids = _our_workers() if ready else []
            if len(pids) == 2:
                os.kill(pids[-1], signal.SIGKILL)
                killed.append(pids[-1])
            done.wait(0.2)

    watcher = threading.Thread(target=kill_mid_epoch_two, daemon=True)
    watcher.start()
    argv = _args(ROOT, "s3ft", "--replicas", "2", "--epochs", "3",
                 "--max-steps-per-epoch", str(steps), "--max-failures", "2",
                 "--progress-every", "1")
    argv[argv.index("--storage-path") + 1] = "s3://bkt/runs"
    try:
        cfg, _ = prepare_run(parse_args(argv, environ={}), environ={})
        outcome = run(cfg, on_event=seen.append, notice=lambda line: None)
    finally:
        done.set()
        ray.shutdown()
    watcher.join(timeout=5)
    assert killed, "the worker was never killed"
    assert outcome.ok, outcome.error
    events = _bucket_events(s3_server, "s3ft")  # the run's story, read back from the bucket
    restarts = [e for e in events if e["type"] == "worker_group_restarted"]
    assert len(restarts) == 1
    saved = [e["path"] for e in events if e["type"] == "checkpoint_saved"]
    assert saved and all(p.startswith("s3://bkt/runs/s3ft/") for p in saved)
    # the group resumed from the last checkpoint Ray had registered before the kill (under
    # load that may still be epoch 1's while epoch 2 already ended: then epoch 2 is redone)
    i = events.index(restarts[0])
    last = [e for e in events[:i] if e["type"] == "checkpoint_saved"][-1]
    assert restarts[0]["resumed_from"] == last["path"] and restarts[0]["step"] == last["step"]
    assert last["step"] >= steps
    after = [e for e in events[i:] if e["type"] == "progress"]
    assert after[0]["step"] == last["step"] + 1
    assert sorted({e["epoch"] for e in events if e["type"] == "epoch_finished"}) == [1, 2, 3]
    assert events[-1]["type"] == "run_finished" and events[-1]["step"] == 3 * steps
    keys = s3_server.list("bkt/runs/s3ft")
    assert any(k.endswith("/state.pt") or "checkpoint_" in k for k in keys), keys
    assert not (ROOT / "s3ft").exists()  # nothing landed on local disk instead


@pytest.mark.slow
def test_submit_local_trains_into_a_bucket(s3_server, storage):
    s3_server.make_bucket("bkt")
    cmd = [sys.executable, "-m", "submitter", "submit", "--local", "--name", "s3local",
           "--storage-path", "s3://bkt/runs", "--epochs", "1", "--max-steps-per-epoch", "6",
           "--replicas", "1", "-o", "json"]
    proc = subprocess.run(cmd, cwd=storage, capture_output=True, text=True, timeout=420,
                          env={**os.environ, **s3_server.env, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert printed[-1]["type"] == "run_finished"
    stored = _bucket_events(s3_server, "s3local")
    assert [e["seq"] for e in stored] == [e["seq"] for e in printed if "seq" in e]
    assert any(e["type"] == "checkpoint_saved" and e["path"].startswith("s3://bkt/runs/s3local/")
               for e in stored)
    # the run's identity and its exported model live in the bucket too
    keys = s3_server.list("bkt/runs/s3local")
    assert any(k.endswith("s3local/run.json") for k in keys), keys
    assert any(k.endswith("s3local/model/model.safetensors") for k in keys), keys
    # TensorBoard's event files, uploaded beside them
    assert any("s3local/tensorboard/events.out.tfevents." in k for k in keys), keys
    assert printed[-1]["export_dir"] == "s3://bkt/runs/s3local/model" and printed[-1]["sample"]


def test_a_big_text_file_in_a_bucket_is_read_in_line_aligned_ranges(s3_server, monkeypatch):
    """--data s3://...: the ranges are found with ranged reads of the object, and their lines
    are the object's lines (the Ray tasks call read_line_ranges the same way)."""
    import numpy as np

    import training.data.pipeline as data

    s3_server.make_bucket("bkt")
    text = "".join(f"row {i} {'é' * (i % 5)}\n" for i in range(2000)).encode()
    with s3_server.filesystem().open_output_stream("bkt/corpus/big.txt") as f:
        f.write(text)
    monkeypatch.setattr(data, "OBJECT_STORE_TEXT_RANGE_BYTES", 1000)
    ranges = data._single_file_ranges("s3://bkt/corpus/big.txt")
    assert ranges is not None and len(ranges) > 10 and ranges[-1][1] == len(text)
    batch = {"path": np.array(["s3://bkt/corpus/big.txt"] * len(ranges), dtype=object),
             "start": np.array([a for a, _ in ranges]), "end": np.array([b for _, b in ranges])}
    assert list(data.read_line_ranges(batch)["text"]) == text.decode().splitlines()
