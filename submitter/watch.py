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
- Why a job is stuck: a third watch follows the job's pods (by the job label), and every pod or
  RayJob change is diagnosed (`submitter.observe`, `submitter.diagnose`): the first blocking
  reason (image pull, Unschedulable, OOMKilled, CrashLoopBackOff, evicted/preempted, an unbound
  claim, a RayCluster ReplicaFailure) is part of the state. Events, claims and the RayCluster are
  read only when a pod shows a problem (or the job is starting without pods), and cached, so a
  quiet job still costs no request at all between stream reconnects.
- Stalls: no training progress for max(5 min, 10x the run's median progress interval) while
  RUNNING adds a warning to the state; `--stall-timeout` exits 5 (WatchStalled) after that long
  without progress or a state change.
- "Could not observe" is not "failed": a watch ERROR event is a dropped stream (reopened);
  an API that stays unreachable, rejects the credentials (401) or does not answer within
  `--request-timeout` raises `Unobservable` (exit 4). The deadline is renewed whenever the API
  answers, so a long quiet watch is fine and a hung server costs at most that long.
- A job suspended by `submitter stop` is stopped (exit 1); one suspended by Kueue is waiting
  in a queue, and the watch waits with it.
- A RayJob deleted after it ended (KubeRay's `ttlSecondsAfterFinished` / deletion policy) is
  reported by how it ended: gone after success is success (exit 0), said so in a note.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Protocol, TextIO

from submitter.contract.errors import ApiUnavailable, Forbidden, NotFound, WatchStalled, WatchTimeout
from submitter.kube import Expired, Kube, StreamDropped
from submitter.ownership import stopped_by_us
from submitter.state import (
    JobState, cadence, configmap_events, duration, job_state, parse_time, stall_warning, utcnow,
)

#: Consecutive dropped streams without a single event before we give up.
MAX_DROPS = 6


class Follower(threading.Thread):
    """Follows one object through successive watch requests and puts its events on a queue."""

    def __init__(self, kube: Kube, kind: str, namespace: str, name: str,
                 resource_version: str | None, out: "queue.Queue[tuple[str, Any]]", *,
                 optional: bool = False, labels: str | None = None) -> None:
        super().__init__(name=f"watch-{kind}-{name}", daemon=True)
        self.kube, self.kind, self.namespace, self.obj_name = kube, kind, namespace, name
        self.resource_version = resource_version
        self.optional = optional  # when RBAC forbids it, carry on without it (a warning)
        self.labels = labels  # watch every object with these labels instead of one by name
        self.out = out
        self._stop = threading.Event()
        self._stream: Any = None

    def run(self) -> None:
        drops = 0
        while not self._stop.is_set():
            try:
                self.kube.renew()  # each reopen gets the whole deadline
                self._stream = self.kube.watch(self.kind, self.namespace, self.obj_name,
                                               resource_version=self.resource_version, labels=self.labels)
                if self._stop.is_set():
                    break
                for event in self._stream:
                    drops = 0
                    self.kube.renew()
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
                self._stop.wait(min(_backoff() * 2 ** drops, 5.0))
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


def _backoff() -> float:
    """The first reconnect delay: a fifth of the API retry backoff (tests shorten both)."""
    return float(os.environ.get("SUBMITTER_API_BACKOFF", "0.5")) / 5


class Sink(Protocol):
    def status(self, state: JobState) -> None: ...
    def event(self, event: dict[str, Any], state: JobState) -> None: ...
    def done(self, state: JobState) -> None: ...


#: The longest the watch loop sleeps without an event (stall checks need a heartbeat; no request).
TICK = 1.0


def follow(kube: Kube, namespace: str, name: str, progress_name: str, sink: Sink, *,
           timeout: float | None = None, clock: Callable[[], float] = time.monotonic,
           warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
           stall_timeout: float | None = None) -> JobState:
    """Watch until the job is terminal; returns its final state. Raises WatchTimeout, and
    WatchStalled when `stall_timeout` passes without training progress or a state change."""
    from submitter.observe import STARTING_STATES, Observer, pod_selector

    deadline = None if timeout is None else clock() + timeout
    dedupe = _Dedupe(sink)
    kube.renew()  # after `submit --watch` or `resume --watch`: the watch gets a whole deadline
    try:
        rayjob = kube.get("RayJob", namespace, name)
    except NotFound:
        gone = _gone_after_success(kube, namespace, name, progress_name, dedupe)
        if gone is None:
            raise
        sink.done(gone)
        return gone
    configmap: dict[str, Any] | None = None
    state = job_state(rayjob, None, name=name, namespace=namespace)
    stopped = state.state == "SUSPENDED" and stopped_by_us(rayjob)
    if state.terminal or stopped:  # nothing to wait for: show the final progress too
        configmap = kube.find("ConfigMap", namespace, progress_name)
        state = dedupe.update(rayjob, configmap, name, namespace)
        if stopped:
            state = replace(state, note=STOPPED_NOTE.format(name=name, namespace=namespace))
        sink.done(state)
        return state
    observer = Observer(kube, namespace, name, clock=clock)
    stall = _Stall(clock, stall_timeout)
    pods: dict[str, dict] = {}
    dedupe.update(rayjob, None, name, namespace)
    events: "queue.Queue[tuple[str, Any]]" = queue.Queue()
    followers = [Follower(kube, "RayJob", namespace, name, rayjob["metadata"].get("resourceVersion"), events),
                 Follower(kube, "ConfigMap", namespace, progress_name, None, events, optional=True)]
    for f in followers:
        f.start()

    def watch_pods(current: JobState) -> None:
        """Open the pod stream once the job needs explaining: while it is starting (or retrying),
        or when training stalls. A job that runs and reports progress costs no pod stream."""
        if len(followers) == 2 and (current.state in STARTING_STATES or current.stalled):
            pod_follower = Follower(kube, "Pod", namespace, None, None, events,  # type: ignore[arg-type]
                                    optional=True, labels=pod_selector(name))
            followers.append(pod_follower)
            pod_follower.start()

    watch_pods(state)
    try:
        while True:
            now = clock()
            if deadline is not None and deadline - now <= 0:
                raise WatchTimeout(f"{name} is still {state.state} after {_seconds(timeout)}; it keeps "
                                   f"running: submitter watch {name} -n {namespace} to continue")
            if stall.expired(now):
                raise WatchStalled(f"{name} made no progress for {duration(stall.limit or 0)} "
                                   f"({state.state}{': ' + state.why if state.why else ''}); it keeps "
                                   f"running: submitter status {name} -n {namespace}")
            waits = [TICK] + ([deadline - now] if deadline is not None else [])
            try:
                source, event = events.get(timeout=max(0.0, min(waits)))
            except queue.Empty:
                # No event. The stall warning can change; and a job starting without pods may be
                # held by KubeRay itself (a RayCluster condition, e.g. a quota): the observer
                # re-reads the RayCluster at most once per minute, and only then.
                diagnosis = observer.diagnosis(list(pods.values()), state) \
                    if state.state in STARTING_STATES else None
                state = dedupe.refresh(stalled=stall.warning(state), diagnosis=diagnosis)
                watch_pods(state)
                continue
            if source == "error":
                raise event
            if source == "warning":
                what = "diagnosis from the pods" if "pods" in str(event) else "training progress"
                warn(f"warning: no {what}: {event}")
                continue
            obj = event.get("object")
            if source == "RayJob" and event["type"] == "DELETED":
                # its last status says how it ended (deleted after the end), or it had not
                ended = job_state(obj, configmap, name=name, namespace=namespace).terminal
                state = _final_progress(kube, events, dedupe, obj if ended else None, configmap,
                                        progress_name)
                if ended:
                    state = replace(state, note=DELETED_AFTER_END)
                sink.done(state)
                return state
            if source == "RayJob":
                rayjob = obj
            elif source == "Pod":
                pod_name = ((obj or {}).get("metadata") or {}).get("name", "")
                if event["type"] == "DELETED":
                    pods.pop(pod_name, None)
                else:
                    pods[pod_name] = obj
            else:
                configmap = None if event["type"] == "DELETED" else obj
            base = job_state(rayjob, configmap, name=name, namespace=namespace)
            if source == "ConfigMap":
                stall.saw_events(configmap_events(configmap))
            stall.saw_state(base.state)
            diagnosis = dedupe.diagnosis if source == "ConfigMap" else observer.diagnosis(list(pods.values()), base)
            state = dedupe.update(rayjob, configmap, name, namespace, diagnosis=diagnosis,
                                  stalled=stall.warning(base))
            if state.state == "SUSPENDED" and stopped_by_us(rayjob):
                state = replace(state, note=STOPPED_NOTE.format(name=name, namespace=namespace))
                sink.done(state)
                return state  # exit 1: stopped; a Kueue-held suspend is waited out instead
            if state.terminal:
                state = _final_progress(kube, events, dedupe, rayjob, configmap, progress_name)
                sink.done(state)
                return state
            watch_pods(state)
    finally:
        for f in followers:
            f.stop()


class _Stall:
    """When training last showed progress (on our clock), its cadence (from the events' own
    timestamps: no clock skew between pod and laptop), and the last state change."""

    def __init__(self, clock: Callable[[], float], limit: float | None) -> None:
        self.clock, self.limit = clock, limit
        self.times: list = []
        self.last_seq = -1
        self.last_progress: float | None = None
        self.last_change = clock()
        self.state = ""

    def saw_events(self, events: list[dict[str, Any]]) -> None:
        fresh = [e for e in events if e.get("type") == "progress"
                 and isinstance(e.get("seq"), int) and e["seq"] > self.last_seq]
        if not fresh:
            return
        self.last_seq = max(e["seq"] for e in fresh)
        times = [t for t in (parse_time(e.get("time")) for e in fresh) if t is not None]
        now = self.clock()
        if self.last_progress is None and times:
            # the first look: the newest event may already be old
            now -= max(0.0, (utcnow() - max(times)).total_seconds())
        self.times = sorted(self.times + times)[-200:]
        self.last_progress = now
        self.last_change = max(self.last_change, now)

    def saw_state(self, state: str) -> None:
        if state != self.state:
            self.state, self.last_change = state, self.clock()

    def warning(self, state: JobState) -> str:
        if state.state != "RUNNING" or self.last_progress is None:
            return ""
        return stall_warning(self.clock() - self.last_progress, cadence(self.times))

    def expired(self, now: float) -> bool:
        return self.limit is not None and now - self.last_change > self.limit
STOPPED_NOTE = "stopped with submitter stop; submitter resume {name} -n {namespace} continues it"
DELETED_AFTER_END = ("the RayJob was deleted after it ended (KubeRay's ttlSecondsAfterFinished / "
                     "deletion policy); the checkpoints and progress are kept")


def _gone_after_success(kube: Kube, namespace: str, name: str, progress_name: str,
                        dedupe: "_Dedupe") -> JobState | None:
    """No RayJob: if training reported its end in the progress ConfigMap (which outlives the
    RayJob), the job finished and KubeRay cleaned it up: that is a success, not "not found"."""
    try:
        configmap = kube.find("ConfigMap", namespace, progress_name)
    except Forbidden:
        return None
    state = job_state(None, configmap, name=name, namespace=namespace)
    if state.progress.status != "finished":
        return None
    dedupe.update(None, configmap, name, namespace)
    return replace(state, state="SUCCEEDED", note=f"no RayJob {name} any more, but training "
                   f"reported its end: {DELETED_AFTER_END}")


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
    if state.progress.status in ("finished", "failed", "stopped"):
        return state
    try:
        kube.renew()
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
        self.rayjob: dict | None = None
        self.configmap: dict | None = None
        self.diagnosis = self.stalled = ""

    def update(self, rayjob: dict | None, configmap: dict | None, name: str, namespace: str, *,
               diagnosis: str | None = None, stalled: str | None = None) -> JobState:
        self.name, self.namespace = name, namespace
        self.rayjob, self.configmap = rayjob, configmap
        if diagnosis is not None:
            self.diagnosis = diagnosis
        if stalled is not None:
            self.stalled = stalled
        state = dataclasses.replace(job_state(rayjob, configmap, name=name, namespace=namespace),
                                    diagnosis=self.diagnosis, stalled=self.stalled)
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
        key = (state.state, state.job_status, state.deployment_status, state.reason, state.message,
               state.diagnosis, state.stalled)
        if key != self.last_status:
            self.last_status = key
            self.sink.status(state)
        return state

    def refresh(self, *, stalled: str, diagnosis: str | None = None) -> JobState:
        """Re-show the last snapshot with a new stall warning or diagnosis (a status line only
        if one changed)."""
        return self.update(self.rayjob, self.configmap, self.name, self.namespace, stalled=stalled,
                           diagnosis=diagnosis)


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
                     "exitCode": state.exit_code, **({"note": state.note} if state.note else {})})


class TextLines:
    """Plain text when stdout is not a terminal (CI logs): one line per change."""

    def __init__(self, out: TextIO) -> None:
        from submitter.pace import PaceWarning

        self.out = out
        self.pace = PaceWarning()  # measured far from the estimate: said once

    def _write(self, text: str) -> None:
        self.out.write(f"{time.strftime('%H:%M:%S')} {text}\n")
        self.out.flush()

    def status(self, state: JobState) -> None:
        extra = ", ".join(x for x in (state.reason, state.message, state.note, state.why) if x)
        self._write(f"{state.name} {state.state} (jobStatus {state.job_status or '-'}, deployment "
                    f"{state.deployment_status or '-'}){': ' + extra if extra else ''}")

    def event(self, event: dict[str, Any], state: JobState) -> None:
        eta = eta_text(state.progress, utcnow()) if event.get("type") == "progress" else None
        self._write(f"{state.name} {describe(event)}{'  ' + eta if eta else ''}")
        if event.get("type") == "progress":
            warning = self.pace.check(state.estimate, state.measured(utcnow()))
            if warning:
                self._write(f"{state.name} {warning}")
        if event.get("type") in ("run_finished", "run_stopped", "epoch_finished"):
            lines = state.pace_lines(utcnow())  # measured vs estimated, at the milestones
            if lines:
                self._write(f"{state.name} measured vs estimated: " + "; ".join(lines))

    def done(self, state: JobState) -> None:
        self._write(f"{state.name} finished: {state.state}")


class Live:
    """A rich live table in a terminal, with the latest training event under it."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live as RichLive

        from submitter.pace import PaceWarning

        self._live = RichLive(console=Console(file=out), auto_refresh=False, transient=False)
        self._last_event = ""
        self._pace = PaceWarning()
        self._pace_warning = ""  # kept under the table once said
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
        eta = eta_text(state.progress, utcnow())
        detail = " · ".join(x for x in (state.reason, state.message, state.note, state.why,
                                        self._last_event, eta) if x)
        if detail:
            lines.append(detail)  # type: ignore[arg-type]
        lines.extend(state.pace_lines(utcnow()))  # type: ignore[arg-type]
        warning = self._pace.check(state.estimate, state.measured(utcnow()))
        self._pace_warning = warning or self._pace_warning
        if self._pace_warning:
            lines.append(self._pace_warning)  # type: ignore[arg-type]
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


def eta_text(progress: Any, now: Any) -> str | None:
    from submitter.event_text import eta_text as text

    return text(progress, now)


def describe(event: dict[str, Any]) -> str:
    """One short human line for a training event (the same wording as `submit --local`)."""
    from submitter.event_text import describe as describe_event

    return describe_event(event) or str(event.get("type")).replace("_", " ")


def _seconds(timeout: float | None) -> str:
    return f"{timeout:g}s"



# `submitter.watch(name)` (the Python API, yielding states) is this module called: see
# submitter/_callable.py.
from submitter._callable import make_callable  # noqa: E402

make_callable(__name__, "submitter.api:watch")
