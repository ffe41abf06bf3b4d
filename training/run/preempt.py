"""Preemption: SIGTERM means "checkpoint at the next step boundary, then go".

A spot node or a Kueue preemption sends SIGTERM and waits a grace period before SIGKILL. In a
training worker the signal only sets a flag; every optimizer step the ranks agree on it (one
one-float all-reduce on a host-side gloo group, started as the step starts and read at its end,
so it overlaps the step and never syncs the GPU), so the checkpoint starts at most one step
after the step the signal arrived in, whatever `progress_every` is. All ranks save a
checkpoint with `reason: "preemption"`, wait until Ray Train has registered it (at most the
worker's share of the grace period, submitter.contract.shutdown) and raise `Preempted`: Ray
Train's failure policy retries the worker group from that checkpoint (and a RayJob whose
driver fails is retried by its backoffLimit), so at most the steps in flight are redone.

Ray installs its own SIGTERM handler (exit at once) in every worker process's main loop, after
the runtime env's setup hook runs; the hook (`worker_setup`) wraps Ray's installer so our
handler goes in its place and calls Ray's whenever the process is not training (Ray Data
tasks, the controller, idle workers keep Ray's behaviour).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any, Callable, Optional

#: Set by a SIGTERM while a training loop runs in this process.
_requested = threading.Event()
#: When this process learned of the preemption (time.monotonic), for its deadline.
_requested_at: list[float] = []
#: True while a training loop that can act on the flag runs in this process.
_armed = threading.Event()
_fallback: Optional[Callable[..., Any]] = None
#: Why a stop was asked for, when it is a limit of the job (submitter.contract.run_limits), not
#: SIGTERM: such a stop saves its checkpoint and ends training normally (no retry).
_limit: list[str] = []
#: The flag each rank sends in the step's max-reduce: 1 a preemption, higher a limit (a limit
#: wins when both come at once: the run ends either way, and a limit's end is not retried).
LIMIT_FLAGS = {"deadline": 2.0, "max_cost": 3.0}


#: The val_loss of a checkpoint that was not validated (ranks last, stays finite in JSON).
UNSCORED = sys.float_info.max


class Preempted(RuntimeError):
    """Raised by every rank after the preemption checkpoint was registered: a retryable exit."""


def _on_sigterm(signum: int, frame: Any) -> None:
    if _armed.is_set():
        request()
        return
    if callable(_fallback):
        _fallback(signum, frame)
    else:
        raise SystemExit(128 + signum)


def install(set_handler: Callable[[int, Callable[..., Any]], Any] = signal.signal) -> None:
    """Our SIGTERM handler, with whatever was installed before as the fallback (main thread)."""
    global _fallback
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not _on_sigterm:
        _fallback = previous if callable(previous) else None
    set_handler(signal.SIGTERM, _on_sigterm)


def install_in_ray_worker() -> None:
    """From Ray's `worker_process_setup_hook` (`training.driver.worker_setup`): SIGTERM routed
    through `_on_sigterm` even after Ray's worker main loop installs its own handler."""
    try:
        install()
    except ValueError:  # not the main thread: nothing to do here
        return
    try:
        import ray._private.utils as ray_utils
    except ImportError:
        return
    original = ray_utils.set_sigterm_handler

    def set_sigterm_handler(handler: Callable[..., Any]) -> None:
        global _fallback
        _fallback = handler  # Ray's "exit now" stays the behaviour outside training
        original(_on_sigterm)

    ray_utils.set_sigterm_handler = set_sigterm_handler


def requested() -> bool:
    return _requested.is_set()


def request() -> None:
    """Ask for a preemption checkpoint (what SIGTERM does; also for a driver's request)."""
    if not _requested.is_set():
        _requested_at[:] = [time.monotonic()]
    _requested.set()


def request_limit_stop(reason: str) -> None:
    """A limit of the job passed (rank 0 measures it): stop at the next step boundary."""
    if not _limit:
        _limit[:] = [reason]
    request()


def limit_reason() -> Optional[str]:
    """The limit a requested stop is for; None for a preemption (or no stop)."""
    return _limit[0] if _limit else None


def clear_limit_stop() -> None:
    """After the limit's checkpoint: the loop returns normally; SIGTERM means "exit" again."""
    _limit.clear()
    _requested.clear()
    _requested_at.clear()
    _armed.clear()


def _flag_value() -> float:
    return LIMIT_FLAGS.get(limit_reason() or "", 1.0) if requested() else 0.0


def _learn_flag(value: float) -> None:
    """What another rank's flag says, here: a limit's reason too."""
    if not _limit:
        _limit[:] = [r for r, v in LIMIT_FLAGS.items() if v == value][:1]
    request()


def seconds_left(budget_s: float, now: Optional[float] = None) -> float:
    """What is left of a worker's budget (ExitChain.worker_save_s) counted from when this
    process learned of the preemption (now, if it has not)."""
    now = time.monotonic() if now is None else now
    start = _requested_at[0] if _requested.is_set() and _requested_at else now
    return max(0.0, start + budget_s - now)


def follow_driver(hub: Any, done: threading.Event, every: float = 1.0) -> None:
    """Until `done`: ask the run's hub every `every` seconds whether the driver got SIGTERM (a
    preemption of the head pod alone, whose preStop hook reaches no worker on another pod),
    and request the checkpoint here when it did."""
    import ray

    while not done.wait(every):
        try:
            if ray.get(hub.preemption_requested.remote(), timeout=10):
                request()
                return
        except ray.exceptions.GetTimeoutError:
            continue  # a busy node answers late: a missed request costs the checkpoint
        except Exception:  # noqa: BLE001 - the driver is going away; SIGTERM still works
            return


class StepGate:
    """The loop's view: `begin()` before a step, `stop()` after it. In a distributed group the
    flag is max-reduced asynchronously during the step, on a gloo group of its own (host memory:
    no GPU sync, and never queued behind the gradients' all-reduce), so every rank stops at the
    same step boundary: the end of the first step that starts after the signal. No rank waits
    for a collective of its own: by the step's end the one-float reduce has long finished."""

    def __init__(self, hub: Any = None, poll_s: float = 1.0) -> None:
        import torch.distributed as dist

        self.dist = dist if dist.is_available() and dist.is_initialized() else None
        # every rank builds the gate at the same point of the loop: new_group is collective
        self.group = self.dist.new_group(backend="gloo") if self.dist is not None else None
        self._work, self._flag = None, None
        self._done = threading.Event()
        _armed.set()
        if hub is not None:  # the driver got SIGTERM: it tells the run's emitter actor
            threading.Thread(target=follow_driver, args=(hub, self._done, poll_s),
                             name="preemption", daemon=True).start()

    def begin(self) -> None:
        if self.dist is None:
            return
        import torch

        self._flag = torch.tensor([_flag_value()])
        self._work = self.dist.all_reduce(self._flag, op=self.dist.ReduceOp.MAX,
                                          group=self.group, async_op=True)

    def stop(self) -> bool:
        if self.dist is None:
            return requested()
        if self._work is None:
            return False
        self._work.wait()
        self._work = None
        if self._flag.item() > 0:
            _learn_flag(self._flag.item())  # a rank that learns it starts its deadline now
            return True
        return False

    def close(self) -> None:
        """Leaving the loop: drain a pending reduce, SIGTERM means "exit" again."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        self._done.set()
        _armed.clear()


def registered(name: str, timeout_s: float) -> bool:
    """Wait (at most timeout_s) until Ray Train has registered every checkpoint this worker
    reported (what a retry resumes from); True if the checkpoint `name` is among them."""
    import ray.train

    found = ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED,
        timeout_s=max(timeout_s, 0.001))
    return any(str(c.checkpoint.path).rstrip("/").endswith("/" + name) for c in found)


def preemption_metrics(epoch: int, step: int, train_loss: float) -> dict[str, Any]:
    """What the preemption checkpoint reports: no validation pass (the grace period is short);
    the largest finite val_loss ranks it last for `num_to_keep` (Ray Train always keeps the
    latest; +inf would not survive its JSON run snapshot), and its event says null."""
    return {"epoch": epoch + 1, "step": step, "val_loss": UNSCORED,
            "train_loss": train_loss, "reason": "preemption"}


def leave(step: int, name: str, budget_s: float,
          wait_upload: Callable[[float], bool] = lambda timeout: True) -> None:
    """After the preemption checkpoint `name` was handed over: wait for its upload
    (`wait_upload`, rank 0's) and its registration within what is left of `budget_s`, then exit
    retryably, saying whether it counts. A save that outlasts the budget is left behind
    unregistered: a retry resumes from the last registered checkpoint, and export skips it."""
    done = wait_upload(seconds_left(budget_s)) and registered(name, seconds_left(budget_s))
    _requested.clear()
    _requested_at.clear()
    _armed.clear()  # a second SIGTERM now ends the process (Ray's handler)
    if done:
        raise Preempted(f"preempted (SIGTERM) at step {step}: checkpoint saved and registered; "
                        "Ray Train retries from it")
    raise Preempted(f"preempted (SIGTERM) at step {step}: its checkpoint was not registered "
                    f"within {budget_s:g}s of the signal (the grace period's share for it); a "
                    "retry resumes from the last registered checkpoint")


class DriverPreempted(KeyboardInterrupt):
    """Raised in the driver's main thread once the preemption checkpoint is registered."""


class DriverPreemption:
    """SIGTERM in the driver (`python -m training`, `python -m training.run_script`): ask every
    worker, through the run's emitter actor, for a preemption checkpoint; once it is registered
    (or after `wait_s`, ExitChain.driver_wait_s: longer than the workers' save, shorter than
    the preStop hook's wait), interrupt `fit()` in the main thread; the driver then records
    run_failed with reason preemption and exits 143, which the RayJob retries (backoffLimit).

    `find_hub` gives the actor when the signal comes (a script's run has one only once its
    fit() started); with none the main thread is interrupted at once."""

    def __init__(self, hub: Any, wait_s: float,
                 find_hub: Optional[Callable[[], Any]] = None) -> None:
        self.wait_s = wait_s
        self.find_hub = find_hub or (lambda: hub)
        self.fired = False
        self.ready = False
        self.step: Optional[int] = None
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        """In the main thread (elsewhere Python refuses a handler, and Ray keeps its own);
        again after ray.init, which puts its own SIGTERM handler (exit 1 at once) there."""
        try:
            previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:
            return
        if not self._installed:
            self._previous = previous
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None
                          else signal.SIG_DFL)
            self._installed = False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.ready:  # our own wake-up call, in the main thread: leave fit()
            self.ready = False
            raise DriverPreempted()
        if self.fired:
            return
        self.fired = True
        threading.Thread(target=self._wait_then_interrupt, name="preemption", daemon=True).start()

    def _wait_then_interrupt(self) -> None:
        import _thread

        hub = self.find_hub()
        saved = wait_for_preemption_checkpoint(hub, self.wait_s) if hub is not None else None
        if saved is not None:
            self.step = saved.get("step")
        # Not SIGINT: during fit() Ray Train's Ctrl-C handler aborts and sys.exit()s. Our own
        # handler, called in the main thread, raises DriverPreempted out of fit() instead.
        self.ready = True
        _thread.interrupt_main(signal.SIGTERM)

    def message(self) -> str:
        if self.step is not None:
            return (f"preempted (SIGTERM): checkpoint at step {self.step} saved and registered; "
                    "a retry (or the same command again) resumes from it")
        return ("preempted (SIGTERM) before a preemption checkpoint was registered; a retry "
                "resumes from the last checkpoint")


def wait_for_preemption_checkpoint(hub: Any, wait_s: float) -> Optional[dict[str, Any]]:
    """Ask the run's emitter actor for a preemption (the workers poll it) and wait for the
    checkpoint_saved with reason preemption (returned), or for `wait_s` (None)."""
    import ray

    deadline = time.monotonic() + wait_s
    try:
        ray.get(hub.request_preemption.remote(), timeout=wait_s)
        while time.monotonic() < deadline:
            events = ray.get(hub.since.remote(0), timeout=max(deadline - time.monotonic(), 0.001))
            saved = [e for e in events
                     if e["type"] == "checkpoint_saved" and e.get("reason") == "preemption"]
            if saved:
                return saved[-1]
            time.sleep(0.2)
    except Exception:  # noqa: BLE001 - a lost actor, or the deadline: leave now
        pass
    return None
