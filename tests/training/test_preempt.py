"""Preemption without Ray: the SIGTERM handler, the step gate, Ray's handler wrapped, and the
checkpoint_saved fields the controller sends."""

from __future__ import annotations

import os
import signal

import pytest

from training import preempt


@pytest.fixture
def fresh_flags():
    previous = signal.getsignal(signal.SIGTERM)
    preempt._requested.clear()
    preempt._armed.clear()
    yield
    preempt._requested.clear()
    preempt._armed.clear()
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_while_training_only_asks_for_a_checkpoint(fresh_flags):
    pytest.importorskip("torch")
    calls = []
    signal.signal(signal.SIGTERM, lambda s, f: calls.append(s))
    preempt.install()
    gate = preempt.StepGate()  # one process: no collective
    gate.begin()
    os.kill(os.getpid(), signal.SIGTERM)  # the process survives: a flag, not an exit
    assert gate.stop() is True and calls == []
    gate.close()


def test_sigterm_outside_training_keeps_the_previous_behaviour(fresh_flags):
    calls = []
    signal.signal(signal.SIGTERM, lambda s, f: calls.append(s))
    preempt.install()
    os.kill(os.getpid(), signal.SIGTERM)
    assert calls == [signal.SIGTERM] and not preempt.requested()


def test_no_sigterm_no_stop(fresh_flags):
    pytest.importorskip("torch")
    gate = preempt.StepGate()
    gate.begin()
    assert gate.stop() is False
    gate.close()


def test_rays_worker_handler_is_wrapped_not_replaced(fresh_flags, monkeypatch):
    """Ray's worker main loop installs its SIGTERM handler after the setup hook ran: ours goes
    in its place and Ray's becomes the fallback outside training."""
    ray_utils = pytest.importorskip("ray._private.utils")
    monkeypatch.setattr(ray_utils, "set_sigterm_handler", ray_utils.set_sigterm_handler)
    preempt.install_in_ray_worker()
    exits = []
    ray_utils.set_sigterm_handler(lambda s, f: exits.append("ray exits"))  # what main_loop does
    assert signal.getsignal(signal.SIGTERM) is preempt._on_sigterm
    os.kill(os.getpid(), signal.SIGTERM)
    assert exits == ["ray exits"]
    preempt._armed.set()
    os.kill(os.getpid(), signal.SIGTERM)
    assert exits == ["ray exits"] and preempt.requested()


def test_the_preemption_checkpoint_ranks_last_but_is_kept_as_the_latest():
    m = preempt.preemption_metrics(epoch=1, step=57, train_loss=2.5)
    assert m["reason"] == "preemption" and m["epoch"] == 2 and m["step"] == 57
    import json
    import math

    assert math.isfinite(json.loads(json.dumps(m))["val_loss"])  # survives Ray's run snapshot
    assert m["val_loss"] > 1e300  # ranks last for num_to_keep


def test_checkpoint_saved_says_registered_and_why():
    pytest.importorskip("ray.train")
    from training.checkpoint_events import event_fields

    local = event_fields({"epoch": 2, "step": 80, "val_loss": 1.5, "epoch_done": True},
                         "/data/runs/j/checkpoint_epoch002_step0000080", "/data/runs/j")
    assert local == {"epoch": 2, "step": 80, "val_loss": 1.5, "reason": "epoch_end",
                     "registered": True, "path": "/data/runs/j/checkpoint_epoch002_step0000080"}
    s3 = event_fields({"epoch": 1, "step": 10, "epoch_done": False}, "bucket/r/ns/j/checkpoint_x",
                      "s3://bucket/r/ns/j")
    assert s3["path"] == "s3://bucket/r/ns/j/checkpoint_x" and s3["reason"] == "interval"
    pre = event_fields(preempt.preemption_metrics(0, 7, 3.0), "/r/j/c", "/r/j")
    assert pre["reason"] == "preemption" and pre["val_loss"] is None  # not validated
    timed = event_fields({"epoch": 1, "step": 9, "epoch_done": False, "stall_s": 0.25}, "/r/j/c",
                         "/r/j")
    assert timed["stall_s"] == 0.25 and timed["reason"] == "interval"  # the pause it cost


def test_a_snapshot_on_cpu_does_not_change_when_training_goes_on():
    """The async save writes the state after the loop moved on: on CPU the gathered state dict
    holds the live tensors, so the snapshot must own copies."""
    torch = pytest.importorskip("torch")
    from training.checkpoint_io import snapshot

    weight = torch.zeros(3)
    state = snapshot({"model": {"w": weight}, "optimizer": [weight], "step": 4}, "cpu")
    weight += 1  # the next optimizer step
    assert state["model"]["w"].tolist() == [0.0] * 3 and state["optimizer"][0].tolist() == [0.0] * 3
    assert state["step"] == 4
    gpu_gathered = {"w": weight}  # cpu_offload already copied it to the host
    assert snapshot(gpu_gathered, "cuda") is gpu_gathered


@pytest.mark.parametrize("since, minutes, due", [
    (0.0, 30.0, False), (1799.9, 30.0, False), (1800.0, 30.0, True), (10**6, 0.0, False),
    (0.06, 0.001, True), (0.05, 0.001, False)])
def test_a_timed_checkpoint_is_due_after_its_minutes_of_wall_time(since, minutes, due):
    from training.checkpoint_io import interval_due

    assert interval_due(since, minutes) is due


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class FakeHub:
    """The emitter actor's surface the driver uses (`ray.get` is the identity here)."""

    def __init__(self) -> None:
        self.asked = False
        self.events: list[dict] = []
        self.request_preemption = _Remote(self._ask)
        self.since = _Remote(lambda seq: list(self.events))

    def _ask(self) -> None:
        self.asked = True
        self.events.append({"type": "checkpoint_saved", "reason": "preemption", "step": 17,
                            "path": "/r/j/checkpoint_epoch001_step0000017"})


def test_sigterm_in_the_driver_asks_the_workers_then_interrupts_fit(fresh_flags, monkeypatch):
    """The driver forwards SIGTERM to the workers through the emitter actor, waits for their
    registered preemption checkpoint, then interrupts fit() (exit 143, retryable)."""
    import time

    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "get", lambda ref, **kw: ref)
    hub = FakeHub()
    driver = preempt.DriverPreemption(hub, wait_s=10)
    driver.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # fit() blocking in the main thread
                time.sleep(0.05)
    finally:
        driver.uninstall()
    assert hub.asked and driver.fired and driver.step == 17
    assert "checkpoint at step 17" in driver.message()


def test_a_lost_emitter_on_a_draining_head_still_exits_preempted(monkeypatch):
    """The emitter actor is pinned to the driver's node; when that node is the one going away
    its run_failed may never land (lost, or unschedulable), and that must not turn the
    preemption (exit 143, retried from the checkpoint) into a failure (exit 1)."""
    import ray

    from training.driver import _preempted

    class Hub:
        class emit:
            @staticmethod
            def remote(*args, **kwargs):
                return "ref"

    def lost(*args, **kwargs):
        raise ray.exceptions.ActorUnschedulableError("the node is draining")

    monkeypatch.setattr(ray, "get", lost)
    preemption = preempt.DriverPreemption(Hub())
    preemption.step = 12
    with pytest.raises(preempt.Preempted, match="checkpoint at step 12"):
        _preempted(Hub(), preemption)
