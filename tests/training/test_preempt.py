"""Preemption without Ray: the SIGTERM handler, the step gate, Ray's handler wrapped, and the
checkpoint_saved fields the controller sends."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support import gloo
from training.run import preempt


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
    from training.run.checkpoint_events import event_fields

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
    from training.run.checkpoint_io import snapshot

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
    from training.run.checkpoint_io import interval_due

    assert interval_due(since, minutes) is due


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class AnyHub:
    """Every method of the emitter actor, answering its own name (`ray.get` is faked)."""

    def __getattr__(self, name):
        return _Remote(lambda *a, **k: name)


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


def test_a_script_driver_without_a_run_yet_leaves_at_once_and_reinstalling_keeps_the_old_handler():
    """The --script driver's SIGTERM before its fit() started a hub: no wait; after ray.init
    replaced the handler, installing again must not make ours its own fallback."""
    import time

    before = signal.getsignal(signal.SIGTERM)
    driver = preempt.DriverPreemption(None, wait_s=30, find_hub=lambda: None)
    driver.install()
    driver.install()  # again, as once the script's fit() started Ray
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            while time.monotonic() - started < 10:
                time.sleep(0.05)
    finally:
        driver.uninstall()
    assert time.monotonic() - started < 5 and driver.fired and driver.step is None
    assert signal.getsignal(signal.SIGTERM) == before
    assert "before a preemption checkpoint was registered" in driver.message()


def test_a_lost_emitter_on_a_draining_head_still_exits_preempted(monkeypatch):
    """The emitter actor is pinned to the driver's node; when that node is the one going away
    its run_failed may never land (lost, or unschedulable), and that must not turn the
    preemption (exit 143, retried from the checkpoint) into a failure (exit 1)."""
    import ray

    from submitter.contract.shutdown import exit_chain
    from training.driver import _preempted

    class Hub:
        class emit:
            @staticmethod
            def remote(*args, **kwargs):
                return "ref"

    def lost(*args, **kwargs):
        raise ray.exceptions.ActorUnschedulableError("the node is draining")

    monkeypatch.setattr(ray, "get", lost)
    preemption = preempt.DriverPreemption(Hub(), wait_s=95)
    preemption.step = 12
    with pytest.raises(preempt.Preempted, match="checkpoint at step 12"):
        _preempted(Hub(), preemption, _NoPoller(), exit_chain(120))


class _NoPoller:
    def stop(self, timeout=None):
        pass


# --- the stop flag is agreed at every step (issue 23) ---------------------------------------------

def _gate_rank(rank: int, world: int, rendezvous: str, signal_at: int, out) -> None:
    """One rank of a 2-process gloo group: 12 steps through a StepGate; rank 1 gets the request
    during step `signal_at` (after the step began); then 12 more where rank 0 asks for a
    limit's stop during step 3. Puts (rank, (step it stopped at, (step, limit), flag left))."""
    from training.run import preempt as p

    gloo.join(rank, world, rendezvous)
    gate = p.StepGate()
    stopped = None
    for step in range(1, 13):
        gate.begin()
        if rank == 1 and step == signal_at:
            p.request()
        if gate.stop():
            stopped = step
            break
    gate.close()
    # a limit of the job (issue 38): rank 0 alone measures it; its code rides on the same
    # flag, so every rank stops at the same step knowing it is the limit's (no retry)
    p._requested.clear()
    gate = p.StepGate()
    limit = None
    for step in range(1, 13):
        if rank == 0 and step == 3:
            p.request_limit_stop("deadline")
        gate.begin()
        if gate.stop():
            limit = (step, p.limit_reason())
            p.clear_limit_stop()
            break
    gate.close()
    out.put((rank, (stopped, limit, p.requested())))
    gloo.leave()


def test_every_rank_stops_one_step_after_the_signal_whatever_progress_every(tmp_path):
    """The flag is agreed at every step (an async reduce started with the step): a request
    that arrives during step 4 on one rank stops both ranks after step 5. Before, the gate
    agreed only every `progress_every` steps (20 by then)."""
    pytest.importorskip("torch")
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    meet = gloo.rendezvous(tmp_path)
    procs = [ctx.Process(target=_gate_rank, args=(r, 2, meet, 4, out)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    try:
        results = dict(out.get(timeout=120) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=30)
    assert results == {r: (5, (3, "deadline"), False) for r in (0, 1)}


def test_a_rank_that_learns_it_from_the_others_starts_its_deadline_then(fresh_flags):
    assert preempt.seconds_left(90, now=1000.0) == 90  # not preempted: the whole budget
    preempt.request()
    start = preempt._requested_at[0]
    assert preempt.seconds_left(90, now=start + 30) == 60
    assert preempt.seconds_left(90, now=start + 200) == 0
    preempt.request()  # a second request keeps the first time
    assert preempt._requested_at == [start]


# --- every wait on the way out is bounded ---------------------------------------------------------

def test_leave_without_a_registered_checkpoint_past_the_budget_says_so(fresh_flags, monkeypatch):
    """A save that outlasts the worker's share of the grace period is left behind: the worker
    still leaves (retryably) within its budget, and says the checkpoint does not count."""
    waited = []
    monkeypatch.setattr(preempt, "registered",
                        lambda name, timeout: waited.append(("registered", timeout)) or True)
    preempt.request()

    def upload_never_ends(timeout):
        waited.append(("upload", timeout))
        return False

    with pytest.raises(preempt.Preempted, match="not registered within 90s"):
        preempt.leave(7, "checkpoint_epoch001_step0000007", 90, upload_never_ends)
    assert waited and all(0 <= t <= 90 for _, t in waited)
    assert not preempt.requested()  # a second SIGTERM now ends the process
    preempt.request()
    monkeypatch.setattr(preempt, "registered", lambda name, timeout: True)
    with pytest.raises(preempt.Preempted, match="saved and registered"):
        preempt.leave(8, "checkpoint_epoch001_step0000008", 90)


def test_exit_143_is_never_held_up_by_a_tracker(monkeypatch):
    """The emitter actor closes the trackers inside run_failed: a tracker that never answers
    holds the actor, never the driver. Every wait of the driver's way out has a timeout
    within the chain's tracker share."""
    import ray

    from submitter.contract.shutdown import exit_chain
    from training.driver import _preempted
    from training.events.poller import EventPoller

    timeouts = []

    def busy_actor(ref, timeout=None):
        timeouts.append(timeout)
        raise ray.exceptions.GetTimeoutError("the emitter is closing a tracker")

    monkeypatch.setattr(ray, "get", busy_actor)
    for grace in (11, 30, 120, 3600):
        chain = exit_chain(grace)
        timeouts.clear()
        preemption = preempt.DriverPreemption(AnyHub(), wait_s=chain.driver_wait_s)
        poller = EventPoller(AnyHub(), on_event=lambda e: None, every=0.5)
        with pytest.raises(preempt.Preempted):
            _preempted(AnyHub(), preemption, poller, chain)
        assert timeouts and None not in timeouts
        assert sum(timeouts) <= chain.driver_exit_s, (grace, timeouts)
        assert max(timeouts) <= max(chain.tracker_close_s, 0.001)


def test_a_poll_stuck_on_a_busy_actor_never_holds_the_way_out(monkeypatch):
    """The polling thread waits on the actor (closing a tracker) while the driver stops it on
    its way to exit 143: the stop's own timeout bounds it, the thread's drain never does."""
    import threading
    import time

    import ray

    from training.events.poller import EventPoller

    inside, waits = threading.Event(), []

    def busy_actor(ref, timeout=None):
        waits.append(timeout)
        inside.set()
        time.sleep(min(timeout, 1.0) if timeout is not None else 3600)
        raise ray.exceptions.GetTimeoutError("busy")

    monkeypatch.setattr(ray, "get", busy_actor)
    poller = EventPoller(AnyHub(), on_event=lambda e: None, every=0.01)
    poller.start()
    assert inside.wait(5)
    stopper = threading.Thread(target=poller.stop, kwargs={"timeout": 0.2}, daemon=True)
    started = time.monotonic()
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive() and time.monotonic() - started < 3
    assert None not in waits  # the thread's own waits are bounded too


# --- one upload in flight -------------------------------------------------------------------------

def test_the_next_save_waits_for_the_upload_in_flight_never_queues_a_second_copy():
    """Ray Train's upload thread (one thread, an unbounded queue) gets the state's host copy;
    the slot makes the next save wait before its copy exists, and frees on a failed upload."""
    import queue
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from training.run.upload_slot import UploadSlot

    slot, pool = UploadSlot(), ThreadPoolExecutor(max_workers=1)  # Ray's upload thread
    gate, copies, most = threading.Event(), [], []
    started = queue.Queue()

    def upload(n):
        started.put(n)
        gate.wait(30)  # a slow bucket
        copies.remove(n)

    def save(n):  # what loop.save does on rank 0
        assert slot.wait(30)
        copies.append(n)  # the host copy
        most.append(len(copies))
        pool.submit(slot.hold(upload), n)

    save(1)
    assert started.get(timeout=10) == 1
    second = threading.Thread(target=save, args=(2,))
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive() and copies == [1]  # waiting, not queued
    assert slot.wait(0) is False
    gate.set()
    second.join(timeout=10)
    assert started.get(timeout=10) == 2 and max(most) == 1
    pool.submit(slot.hold(lambda: 1 / 0)).exception(timeout=10)  # a failed upload frees it
    assert slot.wait(10)
    pool.shutdown()
