"""`submitter watch`: follow a RayJob and its progress ConfigMap until the job ends.

Why it is built this way:
- The watch API, not polling: one GET of the RayJob (its resourceVersion, and a clear
  "not found"), then one watch on the RayJob from that resourceVersion and one on the progress
  ConfigMap. A one-hour watch of a quiet job costs a handful of requests.
- Streams die (load balancers, API server restarts). A dropped stream is reopened from the last
  resourceVersion seen, so nothing is missed; a 410 Gone (that version was compacted away)
  reopens the watch without a version, which starts with the object's current state (a relist
  in one request). Output is deduplicated: a status line only when the normalized state
  changes, a training event only once per `seq`.
- Ctrl-C stops watching and leaves the job alone; `--timeout` exits 3 and leaves it alone too.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from typing import Any, Callable, Protocol, TextIO

from submitter.contract.errors import ApiUnavailable, Forbidden, WatchTimeout
from submitter.kube import Expired, Kube, StreamDropped
from submitter.state import JobState, configmap_events, job_state

#: Consecutive dropped streams without a single event before we give up.
MAX_DROPS = 6


class Follower(threading.Thread):
    """Follows one object through successive watch requests and puts its events on a queue."""

    def __init__(self, kube: Kube, kind: str, namespace: str, name: str,
                 resource_version: str | None, out: "queue.Queue[tuple[str, Any]]", *,
                 optional: bool = False) -> None:
        super().__init__(name=f"watch-{kind}-{name}", daemon=True)
        self.kube, self.kind, self.namespace, self.obj_name = kube, kind, namespace, name
        self.resource_version = resource_version
        self.optional = optional  # when RBAC forbids it, carry on without it (a warning)
        self.out = out
        self._stop = threading.Event()
        self._stream: Any = None

    def run(self) -> None:
        drops = 0
        while not self._stop.is_set():
            try:
                self._stream = self.kube.watch(self.kind, self.namespace, self.obj_name,
                                               resource_version=self.resource_version)
                if self._stop.is_set():
                    break
                for event in self._stream:
                    drops = 0
                    version = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
                    if version:
                        self.resource_version = version
                    if event.get("type") != "BOOKMARK":
                        self.out.put((self.kind, event))
                # A clean end: the server's watch timeout. Reopen from where we are.
            except Expired:
                self.resource_version = None  # relist: the new watch starts with the current state
            except StreamDropped as e:
                drops += 1
                if drops >= MAX_DROPS:
                    self.out.put(("error", ApiUnavailable(f"{e} ({drops} times in a row)")))
                    return
                self._stop.wait(min(0.1 * 2 ** drops, 5.0))
            except Forbidden as e:
                if not self._stop.is_set():
                    self.out.put(("warning" if self.optional else "error", e))
                return
            except Exception as e:  # every other failure ends the watch with its message
                if not self._stop.is_set():
                    self.out.put(("error", e))
                return

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.close()


class Sink(Protocol):
    def status(self, state: JobState) -> None: ...
    def event(self, event: dict[str, Any], state: JobState) -> None: ...
    def done(self, state: JobState) -> None: ...


def follow(kube: Kube, namespace: str, name: str, progress_name: str, sink: Sink, *,
           timeout: float | None = None, clock: Callable[[], float] = time.monotonic,
           warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr)) -> JobState:
    """Watch until the job is terminal; returns its final state. Raises WatchTimeout."""
    deadline = None if timeout is None else clock() + timeout
    rayjob = kube.get("RayJob", namespace, name)
    configmap: dict[str, Any] | None = None
    dedupe = _Dedupe(sink)
    state = job_state(rayjob, None, name=name, namespace=namespace)
    if state.terminal:  # nothing to wait for: show the final progress too
        configmap = kube.find("ConfigMap", namespace, progress_name)
        state = dedupe.update(rayjob, configmap, name, namespace)
        sink.done(state)
        return state
    dedupe.update(rayjob, None, name, namespace)
    events: "queue.Queue[tuple[str, Any]]" = queue.Queue()
    followers = [Follower(kube, "RayJob", namespace, name, rayjob["metadata"].get("resourceVersion"), events),
                 Follower(kube, "ConfigMap", namespace, progress_name, None, events, optional=True)]
    for f in followers:
        f.start()
    try:
        while True:
            wait = None if deadline is None else deadline - clock()
            if wait is not None and wait <= 0:
                raise WatchTimeout(f"{name} is still {state.state} after {_seconds(timeout)}; it keeps "
                                   f"running: submitter watch {name} -n {namespace} to continue")
            try:
                source, event = events.get(timeout=wait)
            except queue.Empty:
                continue
            if source == "error":
                raise event
            if source == "warning":
                warn(f"warning: no training progress: {event}")
                continue
            obj = event.get("object")
            if source == "RayJob":
                rayjob = None if event["type"] == "DELETED" else obj
            else:
                configmap = None if event["type"] == "DELETED" else obj
            state = dedupe.update(rayjob, configmap, name, namespace)
            if state.terminal:
                state = _final_progress(kube, events, dedupe, rayjob, configmap, progress_name)
                sink.done(state)
                return state
    finally:
        for f in followers:
            f.stop()


def _final_progress(kube: Kube, events: "queue.Queue[tuple[str, Any]]", dedupe: "_Dedupe",
                    rayjob: dict | None, configmap: dict | None, progress_name: str) -> JobState:
    """The two streams are not ordered with each other: the job can end before its last
    progress arrives. Take what is queued; if training has not reported its end, read the
    ConfigMap once more (one request, after the job ended)."""
    while True:
        try:
            source, event = events.get_nowait()
        except queue.Empty:
            break
        if source == "ConfigMap":
            configmap = None if event["type"] == "DELETED" else event.get("object")
    state = dedupe.update(rayjob, configmap, dedupe.name, dedupe.namespace)
    if state.progress.status in ("finished", "failed"):
        return state
    try:
        configmap = kube.find("ConfigMap", dedupe.namespace, progress_name) or configmap
    except Forbidden:
        return state
    return dedupe.update(rayjob, configmap, dedupe.name, dedupe.namespace)


class _Dedupe:
    """Turns object snapshots into output: each status change once, each training event once."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.name = self.namespace = ""
        self.last_status: tuple | None = None
        self.last_seq = -1
        self.seen_unnumbered: set[str] = set()

    def update(self, rayjob: dict | None, configmap: dict | None, name: str, namespace: str) -> JobState:
        self.name, self.namespace = name, namespace
        state = job_state(rayjob, configmap, name=name, namespace=namespace)
        for ev in configmap_events(configmap):
            seq = ev.get("seq")
            if isinstance(seq, int):
                if seq <= self.last_seq:
                    continue
                self.last_seq = seq
            else:
                key = json.dumps(ev, sort_keys=True)
                if key in self.seen_unnumbered:
                    continue
                self.seen_unnumbered.add(key)
            self.sink.event(ev, state)
        key = (state.state, state.job_status, state.deployment_status, state.reason, state.message)
        if key != self.last_status:
            self.last_status = key
            self.sink.status(state)
        return state


# --- sinks ------------------------------------------------------------------------------------

class JsonLines:
    """`-o json`: one JSON object per line (`kind` = status | event | result)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def _write(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, sort_keys=True) + "\n")
        self.out.flush()

    def status(self, state: JobState) -> None:
        self._write({"kind": "status", **state.to_dict()})

    def event(self, event: dict[str, Any], state: JobState) -> None:
        self._write({"kind": "event", "job": state.name, "event": event})

    def done(self, state: JobState) -> None:
        self._write({"kind": "result", "job": state.name, "state": state.state,
                     "exitCode": state.exit_code})


class TextLines:
    """Plain text when stdout is not a terminal (CI logs): one line per change."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def _write(self, text: str) -> None:
        self.out.write(f"{time.strftime('%H:%M:%S')} {text}\n")
        self.out.flush()

    def status(self, state: JobState) -> None:
        extra = ", ".join(x for x in (state.reason, state.message, state.note) if x)
        self._write(f"{state.name} {state.state} (jobStatus {state.job_status or '-'}, deployment "
                    f"{state.deployment_status or '-'}){': ' + extra if extra else ''}")

    def event(self, event: dict[str, Any], state: JobState) -> None:
        self._write(f"{state.name} {describe(event)}")

    def done(self, state: JobState) -> None:
        self._write(f"{state.name} finished: {state.state}")


class Live:
    """A rich live table in a terminal, with the latest training event under it."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live as RichLive

        self._live = RichLive(console=Console(file=out), auto_refresh=False, transient=False)
        self._last_event = ""
        self._live.start()

    def _render(self, state: JobState) -> Any:
        from rich.console import Group
        from rich.table import Table

        from submitter.state import COLUMNS, row, utcnow

        # One job: a field/value table fits any terminal width.
        table = Table(show_header=False, title=f"{state.namespace}/{state.name}", title_justify="left")
        for column, value in zip(COLUMNS[1:], row(state, utcnow())[1:]):
            table.add_row(column, value)
        lines = [table]
        detail = " · ".join(x for x in (state.reason, state.message, state.note, self._last_event) if x)
        if detail:
            lines.append(detail)  # type: ignore[arg-type]
        return Group(*lines)

    def status(self, state: JobState) -> None:
        self._live.update(self._render(state), refresh=True)

    def event(self, event: dict[str, Any], state: JobState) -> None:
        self._last_event = describe(event)
        self._live.update(self._render(state), refresh=True)

    def done(self, state: JobState) -> None:
        self._live.update(self._render(state), refresh=True)
        self._live.stop()


def make_sink(output: str, out: TextIO | None = None) -> Sink:
    out = out or sys.stdout
    if output == "json":
        return JsonLines(out)
    if out.isatty():
        return Live(out)
    return TextLines(out)


def describe(event: dict[str, Any]) -> str:
    """One short human line for a training event (the same wording as `submit --local`)."""
    from submitter.event_text import describe as describe_event

    return describe_event(event) or str(event.get("type")).replace("_", " ")


def _seconds(timeout: float | None) -> str:
    return f"{timeout:g}s"

