"""The entrypoint on real Ray: end to end, a killed worker, a stopped-and-restarted run.

Real Ray, real TorchTrainer (2 CPU workers where the point is distribution), the tiny preset,
real WikiText-2 text from ../shared/data.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.conftest import ROOT, shared_file
from tests.support import tensorboard
from submitter.contract import events as ev
from submitter.contract import naming
from training.args import parse_args
from training.driver import prepare_run

pytestmark = pytest.mark.slow


#: Log lines Ray prints in every run that say nothing to the user (see training.driver).
NOISE = ("PreemptionWatcher", "Reporting training result", "exclude_resources",
         "Progress bars disabled", "PlacementGroupCleaner")


@pytest.fixture
def fresh_ray():
    """Each test owns its Ray instance (started by the driver) and shuts it down."""
    import ray

    yield
    ray.shutdown()


def _args(storage: Path, name: str, *extra: str) -> list[str]:
    return ["--name", name, "--storage-path", str(storage), "--model", "tiny",
            "--data", str(shared_file("data", "wikitext-2", "valid.txt")),
            "--tokenizer", "byte", "--block-size", "64", "--val-steps", "8", *extra]


def _events(storage: Path, name: str) -> list[dict[str, Any]]:
    path = storage / name / naming.EVENTS_FILE
    return ev.parse_lines(path.read_text()) if path.exists() else []


def _run(argv: list[str]):
    from training.driver import run

    cfg, _ = prepare_run(parse_args(argv, environ={}), environ={})
    return run(cfg, on_event=lambda e: None, notice=lambda line: None)


def _when(storage: Path, name: str, condition: Callable[[list[dict]], bool],
          action: Callable[[], None], timeout: float = 240) -> threading.Thread:
    """Watch the run's events.jsonl from a thread and act once the condition holds."""
    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition(_events(storage, name)):
                action()
                return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _pids_with_title(prefix: str) -> list[int]:
    """Processes whose (setproctitle'd) command line starts with prefix, e.g. ray::RayTrainWorker."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if cmd.startswith(prefix):
                pids.append(int(entry))
    return pids


def _our_workers() -> list[int]:
    """Ray Train workers of this test's Ray (descendants of this process): other sessions on
    the machine may run their own."""
    mine = set(_descendants(os.getpid()))
    return [p for p in _pids_with_title("ray::RayTrainWorker") if p in mine]


def _signal_a_worker(sig: int, sent: list[int]) -> Callable[[], None]:
    """A `_when` action: send `sig` to one of this run's two Ray Train workers (noted in
    `sent`)."""
    def send() -> None:
        pids = _our_workers()
        assert len(pids) == 2, pids
        os.kill(pids[-1], sig)
        sent.append(pids[-1])

    return send


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                kids = []
            out += kids
            todo += kids
    return out


def _committed_checkpoint(storage: Path, name: str) -> bool:
    """A checkpoint is saved and Ray Train's run snapshot (what a new driver resumes from)
    already lists it: stopping before that point legitimately starts over."""
    snapshot = storage / name / "checkpoint_manager_snapshot.json"
    try:
        text = snapshot.read_text()
    except OSError:
        return False
    return any(e["type"] == "checkpoint_saved" and Path(e["path"]).name in text
               for e in _events(storage, name))


def test_end_to_end_on_wikitext(storage, fresh_ray):
    outcome = _run(_args(storage, "e2e", "--replicas", "2", "--epochs", "3",
                         "--max-steps-per-epoch", "25", "--num-to-keep", "2",
                         "--learning-rate", "0.003", "--progress-every", "5"))
    assert outcome.ok, outcome.error
    events = _events(storage, "e2e")
    types = [e["type"] for e in events]
    # the whole story, in order, with a gap-free seq
    assert types[0] == "run_started" and types[-1] == "run_finished"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert types.count("epoch_finished") == 3 and types.count("checkpoint_saved") == 3
    assert "progress" in types and "run_failed" not in types
    epochs = [e for e in events if e["type"] == "epoch_finished"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    val = [e["val_loss"] for e in epochs]
    assert val[0] > val[1] > val[2], val
    progress = [e for e in events if e["type"] == "progress"]
    assert progress[0]["loss"] > progress[-1]["loss"] + 1.0
    assert all(e["tokens_per_sec"] > 0 for e in progress)
    # num_to_keep=2: the two best (the last two) remain on disk
    kept = sorted(p.name for p in (storage / "e2e").iterdir()
                  if p.is_dir() and p.name.startswith("checkpoint_"))
    saved = [Path(e["path"]).name for e in events if e["type"] == "checkpoint_saved"]
    assert kept == sorted(saved[1:])
    final = events[-1]
    assert final["epoch"] == 3 and final["val_loss"] == pytest.approx(val[2], rel=1e-3)
    assert Path(final["best_checkpoint"]).name == saved[2]
    state = ev.fold(events)
    assert state.status == "finished" and state.checkpoints == 3 and state.restarts == 0
    # the checkpoint holds everything a resume needs
    import torch

    blob = torch.load(Path(final["best_checkpoint"]) / "state.pt", weights_only=True)
    assert {"model", "optimizer", "scheduler", "epoch", "step", "config"} <= set(blob)
    assert blob["step"] == 75 and blob["config"]["run_name"] == "e2e"
    # checkpoint_saved is told once Ray Train registered it (what a resume uses)
    saved_events = [e for e in events if e["type"] == "checkpoint_saved"]
    assert all(e["registered"] is True and e["reason"] == "epoch_end" for e in saved_events)
    # the run's identity beside its checkpoints, and a model that leaves
    assert json.loads((storage / "e2e" / "run.json").read_text())["identity"]["model"] == "tiny"
    assert not (storage / "e2e" / "run.lock").exists()
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(final["export_dir"])
    assert hf.config.vocab_size == 257 and final["sample"].startswith(final["sample_prompt"])


def test_the_driver_log_holds_the_events_and_not_rays_chatter(storage, tmp_path):
    """`python -m training` as the pod runs it: its output is what `submitter logs` shows."""
    from submitter.contract.naming import ENV_JOB
    from submitter.contract.spec import JobSpec

    spec = JobSpec.from_document(JobSpec.build(name="quiet").document(), **dict(
        storage_path=str(storage), model="tiny", tokenizer="byte", block_size=64, val_steps=2,
        data=str(shared_file("data", "wikitext-2", "valid.txt")), replicas=1, epochs=1,
        max_steps_per_epoch=3, progress_every=1))
    env = {**os.environ, "PYTHONPATH": str(ROOT), ENV_JOB: spec.document()}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "training"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert ev.parse_lines(proc.stdout)[-1]["type"] == "run_finished"
    for noise in NOISE:  # Ray's per-run chatter stays out of the driver log
        assert noise not in output, noise


def test_a_killed_worker_restarts_the_group_from_the_last_checkpoint(storage, fresh_ray):
    steps = 40
    killed: list[int] = []

    def mid_epoch_two(events: list[dict]) -> bool:
        # Rank 0 reports checkpoint_saved once the files are on storage; Ray Train's controller
        # registers the checkpoint a little later. Kill only after it has (its snapshot lists
        # it), else the restart legitimately starts from nothing (seen under CI load).
        return any(e["type"] == "progress" and e["step"] >= steps + 4 for e in events) and \
            _committed_checkpoint(storage, "ft")

    watcher = _when(storage, "ft", mid_epoch_two, _signal_a_worker(signal.SIGKILL, killed))
    outcome = _run(_args(storage, "ft", "--replicas", "2", "--epochs", "3",
                         "--max-steps-per-epoch", str(steps), "--max-failures", "2",
                         "--progress-every", "1"))
    watcher.join(timeout=1)
    assert killed, "the worker was never killed"
    assert outcome.ok, outcome.error
    events = _events(storage, "ft")
    restarts = [e for e in events if e["type"] == "worker_group_restarted"]
    assert len(restarts) == 1 and restarts[0]["attempt"] == 1
    first_ckpt = next(e for e in events if e["type"] == "checkpoint_saved")
    assert restarts[0]["resumed_from"] == first_ckpt["path"]
    assert restarts[0]["step"] == steps
    # killed mid-epoch 2: progress past the checkpoint happened before the restart...
    i = events.index(restarts[0])
    assert max(e["step"] for e in events[:i] if e["type"] == "progress") > steps
    # ...and the resumed group starts again right after the checkpoint, then finishes
    after = [e for e in events[i:] if e["type"] == "progress"]
    assert after[0]["step"] == steps + 1
    # under load the kill can land after epoch 2's end was reported but before its checkpoint
    # was registered: the retry then redoes epoch 2 from step 40 (the restart's step above)
    assert [e["epoch"] for e in events[:i] if e["type"] == "epoch_finished"] in ([1], [1, 2])
    assert [e["epoch"] for e in events[i:] if e["type"] == "epoch_finished"] == [2, 3]
    assert events[-1]["type"] == "run_finished" and events[-1]["step"] == 3 * steps
    assert outcome.state.restarts == 1 and outcome.state.status == "finished"
    assert killed[0] not in _pids_with_title("ray::RayTrainWorker")
    # TensorBoard's curve: the steps redone after the restore are there once, none missing
    assert tensorboard.steps(str(storage / "ft" / "tensorboard")) == list(range(1, 3 * steps + 1))


def test_a_stopped_run_continues_with_the_same_next_step_loss(storage, fresh_ray):
    """Kill the whole driver (like a deleted pod), start it again: it picks up at the last
    checkpoint and its next step's loss is the uninterrupted run's."""
    import ray

    common = ["--replicas", "1", "--epochs", "3", "--max-steps-per-epoch", "8",
              "--checkpoint-every", "4", "--progress-every", "1", "--seed", "5"]
    baseline = _run(_args(storage, "straight", *common))
    assert baseline.ok, baseline.error
    ray.shutdown()
    straight = {e["step"]: e["loss"] for e in _events(storage, "straight")
                if e["type"] == "progress"}
    assert sorted(straight) == list(range(1, 25))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (storage / "stopped.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "training", *_args(storage, "stopped", *common)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if _committed_checkpoint(storage, "stopped"):
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the first run ended before it could be stopped"
    finally:
        tree = _descendants(proc.pid)
        for pid in [proc.pid, *tree]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
        log.close()
    assert "SUBMITTER_EVENT" in (storage / "stopped.log").read_text(errors="replace")
    before = _events(storage, "stopped")
    stopped_at = max(e["step"] for e in before if e["type"] == "progress")
    assert stopped_at < 24 and before[-1]["type"] != "run_finished"

    again = _run(_args(storage, "stopped", *common))
    assert again.ok, again.error
    events = _events(storage, "stopped")
    resumed = next(e for e in events[len(before):] if e["type"] == "run_resumed")
    ckpt_steps = [e["step"] for e in before if e["type"] == "checkpoint_saved"]
    assert resumed["step"] in ckpt_steps and resumed["step"] % 4 == 0
    first = next(e for e in events[len(before):] if e["type"] == "progress")
    assert first["step"] == resumed["step"] + 1
    assert first["loss"] == straight[first["step"]]  # bit-identical on CPU, fixed seeds
    later = {e["step"]: e["loss"] for e in events[len(before):] if e["type"] == "progress"}
    assert all(later[s] == straight[s] for s in later)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # seq continued
    assert events[-1]["type"] == "run_finished" and events[-1]["step"] == 24
    # TensorBoard: the killed driver's unflushed points come back from its events, the redone
    # steps are written once (the first run's values)
    logdir = storage / "stopped" / "tensorboard"
    curve = tensorboard.scalars(str(logdir))["train/loss"]
    assert [s for s, _ in curve] == list(range(1, 25))
    assert all(v == pytest.approx(straight[s], abs=1e-4) for s, v in curve)


def test_sigterm_to_a_worker_checkpoints_and_the_retry_redoes_at_most_one_step(storage, fresh_ray):
    """A spot node's SIGTERM reaches one worker mid-epoch: every rank stops at the next step
    boundary, saves a checkpoint with reason preemption, and Ray Train retries from it."""
    steps = 30
    signalled: list[int] = []

    def mid_epoch_one(events: list[dict]) -> bool:
        return any(e["type"] == "progress" and e["step"] >= 12 for e in events)

    watcher = _when(storage, "pre", mid_epoch_one, _signal_a_worker(signal.SIGTERM, signalled))
    outcome = _run(_args(storage, "pre", "--replicas", "2", "--epochs", "2",
                         "--max-steps-per-epoch", str(steps), "--max-failures", "2",
                         "--progress-every", "1"))
    watcher.join(timeout=1)
    assert signalled, "no worker got SIGTERM"
    assert outcome.ok, outcome.error
    events = _events(storage, "pre")
    saved = [e for e in events if e["type"] == "checkpoint_saved" and e["reason"] == "preemption"]
    assert len(saved) == 1 and saved[0]["registered"] is True
    at = saved[0]["step"]
    assert 12 <= at < 2 * steps  # mid-run (mid-epoch 1 unless the signal came late, under load)
    restarts = [e for e in events if e["type"] == "worker_group_restarted"]
    assert len(restarts) == 1 and restarts[0]["resumed_from"] == saved[0]["path"]
    assert restarts[0]["step"] == at
    i = events.index(restarts[0])
    done_before = max(e["step"] for e in events[:i] if e["type"] == "progress")
    first_after = next(e for e in events[i:] if e["type"] == "progress")["step"]
    assert done_before - at <= 1 and first_after == at + 1  # at most one step redone
    assert [e["epoch"] for e in events if e["type"] == "epoch_finished"] == [1, 2]
    assert events[-1]["type"] == "run_finished" and events[-1]["step"] == 2 * steps


def test_the_preemption_checkpoint_starts_within_a_step_whatever_progress_every(storage, fresh_ray):
    """Issue 23: 32 micro-batches a step and a progress event every 20 steps. SIGTERM reaches
    one worker right after the first progress event: both ranks agree on it at the next step
    boundary, so the preemption checkpoint comes at most 2 steps after the step the signal
    followed (before, the flag was read once per progress window: step 20)."""
    signalled: list[int] = []
    first = lambda events: any(e["type"] == "progress" for e in events)  # noqa: E731
    watcher = _when(storage, "gate", first, _signal_a_worker(signal.SIGTERM, signalled))
    outcome = _run(_args(storage, "gate", "--replicas", "2", "--batch-size-per-worker", "2",
                         "--global-batch-size", "128", "--epochs", "1",
                         "--max-steps-per-epoch", "8", "--progress-every", "20",
                         "--max-failures", "1"))
    watcher.join(timeout=1)
    assert signalled, "no worker got SIGTERM"
    assert outcome.ok, outcome.error
    events = _events(storage, "gate")
    progress = next(e for e in events if e["type"] == "progress")
    assert progress["accumulation_steps"] == 32
    assert progress["world_size"] == 2  # a fresh run's first start: only progress says it
    saved = [e for e in events if e["type"] == "checkpoint_saved" and e["reason"] == "preemption"]
    assert len(saved) == 1 and saved[0]["registered"] is True
    assert progress["step"] < saved[0]["step"] <= progress["step"] + 2
    restarts = [e for e in events if e["type"] == "worker_group_restarted"]
    assert len(restarts) == 1 and restarts[0]["step"] == saved[0]["step"]
    assert events[-1]["type"] == "run_finished" and events[-1]["step"] == 8


def test_sigterm_to_the_driver_checkpoints_exits_143_and_the_next_start_resumes_there(
        storage, fresh_ray):
    """The head pod is preempted: the driver asks every worker for a checkpoint at the next
    step, records run_failed (reason preemption) and exits 143, which a RayJob retries."""
    common = ["--replicas", "1", "--epochs", "2", "--max-steps-per-epoch", "30",
              "--progress-every", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    log = (storage / "driver.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "training", *_args(storage, "dt", *common)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if any(e["type"] == "progress" and e["step"] >= 8 for e in _events(storage, "dt")):
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before it could be preempted"
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=180)
    finally:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
        log.close()
    assert code == 143, (storage / "driver.log").read_text(errors="replace")[-3000:]
    before = _events(storage, "dt")
    saved = [e for e in before if e["type"] == "checkpoint_saved" and e["reason"] == "preemption"]
    assert saved and all(e["registered"] for e in saved)
    assert before[-1]["type"] == "run_failed" and before[-1]["reason"] == "preemption"
    at = saved[-1]["step"]
    done = max(e["step"] for e in before if e["type"] == "progress")
    assert done - at <= 1

    again = _run(_args(storage, "dt", *common))
    assert again.ok, again.error
    events = _events(storage, "dt")[len(before):]
    resumed = next(e for e in events if e["type"] == "run_resumed")
    assert resumed["step"] == at
    assert next(e for e in events if e["type"] == "progress")["step"] == at + 1
    assert events[-1]["type"] == "run_finished" and events[-1]["step"] == 60
