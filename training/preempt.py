"""Preemption: SIGTERM means "checkpoint at the next step boundary, then go".

A spot node or a Kueue preemption sends SIGTERM and waits a grace period before SIGKILL. In a
training worker the signal only sets a flag; at the next step boundary every rank learns it
(one async all-reduce per step, overlapped with the step), all save a checkpoint with
`reason: "preemption"`, wait until Ray Train has registered it, and raise `Preempted`: Ray
Train's failure policy retries the worker group from that checkpoint (and a RayJob whose
driver fails is retried by its backoffLimit), so at most the step in flight is redone.

Ray installs its own SIGTERM handler (exit at once) in every worker process's main loop, after
the runtime env's setup hook runs; the hook (`worker_setup`) wraps Ray's installer so our
handler goes in its place and calls Ray's whenever the process is not training (Ray Data
tasks, the controller, idle workers keep Ray's behaviour).
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any, Callable, Optional

#: Set by a SIGTERM while a training loop runs in this process.
_requested = threading.Event()
#: True while a training loop that can act on the flag runs in this process.
_armed = threading.Event()
_fallback: Optional[Callable[..., Any]] = None


#: The val_loss of a checkpoint that was not validated (ranks last, stays finite in JSON).
UNSCORED = sys.float_info.max


class Preempted(RuntimeError):
    """Raised by every rank after the preemption checkpoint was registered: a retryable exit."""


def _on_sigterm(signum: int, frame: Any) -> None:
    if _armed.is_set():
        _requested.set()
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
    _requested.set()


class StepGate:
    """The loop's view: `begin()` before a step, `stop()` after it. In a distributed group the
    flag is max-reduced asynchronously during the step, so every rank stops at the same step
    boundary and no rank waits for a collective of its own."""

    def __init__(self, device: Any = None, hub: Any = None, poll_s: float = 1.0,
                 every: int = 1) -> None:
        """`every`: agree on the flag every N steps only (on a GPU the flag's read is a host
        sync; a loop that avoids per-step syncs may check every few steps, at the cost of up
        to N-1 more steps before the preemption checkpoint, none of them lost)."""
        import torch.distributed as dist

        self.dist = dist if dist.is_available() and dist.is_initialized() else None
        self.device = device
        self.every, self._n = max(1, every), 0
        self._work, self._flag = None, None
        self._done = threading.Event()
        _armed.set()
        if hub is not None:  # the driver got SIGTERM: it tells the run's emitter actor
            threading.Thread(target=self._poll, args=(hub, poll_s), name="preemption",
                             daemon=True).start()

    def _poll(self, hub: Any, every: float) -> None:
        import ray

        while not self._done.wait(every):
            try:
                if ray.get(hub.preemption_requested.remote(), timeout=10):
                    request()
                    return
            except ray.exceptions.GetTimeoutError:
                continue  # a busy node answers late: a missed request costs the checkpoint
            except Exception:  # noqa: BLE001 - the driver is going away; SIGTERM still works
                return

    def begin(self) -> None:
        self._n += 1
        if self.dist is None or self._n % self.every:
            return
        import torch

        self._flag = torch.tensor([1.0 if requested() else 0.0], device=self.device)
        self._work = self.dist.all_reduce(self._flag, op=self.dist.ReduceOp.MAX, async_op=True)

    def stop(self) -> bool:
        if self.dist is None:
            return requested()
        if self._work is None:
            return False  # not a checking step
        self._work.wait()
        self._work = None
        return bool(self._flag.item() > 0)

    def close(self) -> None:
        """Leaving the loop: drain a pending reduce, SIGTERM means "exit" again."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        self._done.set()
        _armed.clear()


def confirm_registered() -> None:
    """Block until Ray Train has registered every checkpoint this worker reported (what a
    retry resumes from); then raising is safe."""
    import ray.train

    ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED)


def preemption_metrics(epoch: int, step: int, train_loss: float) -> dict[str, Any]:
    """What the preemption checkpoint reports: no validation pass (the grace period is short);
    the largest finite val_loss ranks it last for `num_to_keep` (Ray Train always keeps the
    latest; +inf would not survive its JSON run snapshot), and its event says null."""
    return {"epoch": epoch + 1, "step": step, "val_loss": UNSCORED,
            "train_loss": train_loss, "reason": "preemption"}


def leave(step: int) -> None:
    """After the preemption checkpoint: make sure it counts, then exit retryably."""
    confirm_registered()
    _requested.clear()
    _armed.clear()  # a second SIGTERM now ends the process (Ray's handler)
    raise Preempted(f"preempted (SIGTERM) at step {step}: checkpoint saved and registered; "
                    "Ray Train retries from it")


class DriverPreempted(KeyboardInterrupt):
    """Raised in the driver's main thread once the preemption checkpoint is registered."""


#: How long a driver that got SIGTERM waits for the workers' preemption checkpoint.
DRIVER_WAIT_S = 120.0


class DriverPreemption:
    """SIGTERM in the driver (`python -m training`): ask every worker, through the run's
    emitter actor, for a preemption checkpoint; once it is registered (or after `wait_s`),
    interrupt `fit()` in the main thread; the driver then records run_failed with
    reason preemption and exits 143, which the RayJob retries (backoffLimit)."""

    def __init__(self, hub: Any, wait_s: float = DRIVER_WAIT_S) -> None:
        self.hub, self.wait_s = hub, wait_s
        self.fired = False
        self.ready = False
        self.step: Optional[int] = None
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
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
        self.hub.request_preemption.remote()
        threading.Thread(target=self._wait_then_interrupt, name="preemption", daemon=True).start()

    def _wait_then_interrupt(self) -> None:
        import _thread
        import time

        import ray

        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            try:
                saved = [e for e in ray.get(self.hub.since.remote(0))
                         if e["type"] == "checkpoint_saved" and e.get("reason") == "preemption"]
            except Exception:  # noqa: BLE001
                break
            if saved:
                self.step = saved[-1].get("step")
                break
            time.sleep(0.2)
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
