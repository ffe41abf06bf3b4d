"""The driver's view of the run's emitter actor: this session's events as they arrive (the
driver's output, what `submit --local` and `submitter logs` read), and each sink's problem
(a ConfigMap it cannot write, and why) said once. One for both drivers: `python -m training`
and a --script run's (training.script.hooks)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

OnEvent = Callable[[dict[str, Any]], None]
Notice = Callable[[str], None]

#: The polling thread's wait for one drain (the emitter actor answers in milliseconds).
POLL_TIMEOUT_S = 30.0


class EventPoller:
    """Feeds this session's events to `on_event` as they arrive (and drains at the end), and
    prints each sink's problem once via `notice`."""

    def __init__(self, hub: Any, on_event: OnEvent, every: float,
                 notice: Notice = print) -> None:
        self.hub, self.on_event, self.every, self.notice = hub, on_event, every, notice
        self.seen = 0
        self.told: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the thread and a drain at the end: each event once
        self._thread = threading.Thread(target=self._loop, name="events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def drain(self, timeout: Optional[float] = None) -> None:
        """Every event not fed yet, then the sinks' new problems; all of it within `timeout`
        (None: as long as it takes), waiting for the polling thread's drain included."""
        import ray

        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> Optional[float]:
            return None if deadline is None else max(deadline - time.monotonic(), 0.0)

        if not self._lock.acquire(timeout=-1 if deadline is None else left()):
            return  # the thread is still at it (a busy actor): the exit does not wait longer
        try:
            for event in ray.get(self.hub.since.remote(self.seen), timeout=left()):
                self.seen = max(self.seen, event["seq"])
                self.on_event(event)
        finally:
            self._lock.release()
        self.tell_problems(left())

    def tell_problems(self, timeout: Optional[float] = None) -> None:
        import ray

        for line in ray.get(self.hub.problems.remote(), timeout=timeout):
            if line not in self.told:
                self.told.add(line)
                self.notice(line)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.drain(POLL_TIMEOUT_S)  # a hung actor never holds the lock for good
            except Exception:  # noqa: BLE001 - display only
                pass

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop polling and show what is left; `timeout`: on the way out of a preemption the
        actor may be busy closing the trackers, and the exit does not wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 if timeout is None else timeout)
        try:
            self.drain(timeout)
        except Exception:  # noqa: BLE001
            pass
