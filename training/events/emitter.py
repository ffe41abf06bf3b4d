"""Status events: one emitter per run, fanning out to sinks.

Who emits what:
- the driver (`python -m training`, or `submit --local`): run_started, run_finished, run_failed;
- the rank-0 worker: progress, epoch_finished, checkpoint_saved, and at each start of its
  worker group `worker_group_started(...)`, from which the emitter derives
  worker_group_restarted (2nd and later starts in one driver session: a Ray Train retry) or
  run_resumed (1st start that found a checkpoint: a re-submitted or restarted job).
The emitter lives in one process (a Ray actor owned by the driver), so `seq` is monotonic; it
continues from the events already in `events.jsonl` (or the ConfigMap), across restarts. Where
the events file is a file (a PVC, a local run), the file numbers each event under its lock, so
it never holds one seq twice even while another emitter writes to it.
Stdlib only; the ConfigMap sink (`training.events.progress_configmap`) is the one place here that
talks to the Kubernetes API.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from typing import Any, Callable, Mapping, Optional, Protocol

from submitter.contract import events as ev
from submitter.contract import naming
from submitter.contract.run_logs import Redactor

log = logging.getLogger("submitter.contract.events")
class Sink(Protocol):
    def write(self, event: Mapping[str, Any], state: ev.ProgressState) -> None: ...


class StdoutSink:
    """`SUBMITTER_EVENT {...}` lines: the driver log `submitter logs`/`watch` parse."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream

    def write(self, event: Mapping[str, Any], state: ev.ProgressState) -> None:
        import sys

        stream = self.stream or sys.stdout
        stream.write(ev.to_stdout_line(event) + "\n")
        stream.flush()


class FileSink:
    """Append-only `<storage_path>/<run_name>/events.jsonl` next to the checkpoints.

    The file is the run's seq authority: `append_next` takes an exclusive lock on it (flock:
    other processes, other emitters of this one, and NFS clients of a shared PVC alike), reads
    the last seq it holds and appends the next one. Two writers on one run (a stale driver
    still draining beside a retried one, a tracker's thread) so never write one seq twice."""

    #: How much of the file's end is read for its last seq (events are well under 4 KiB).
    TAIL_BYTES = 64 * 1024

    def __init__(self, path: str) -> None:
        self.path = path

    def append_next(self, floor: int, build: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
        """Under the file's lock: the event `build(seq)` with seq = max(floor, the file's last
        seq) + 1, appended. Returns the event."""
        import fcntl

        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                start = max(0, f.seek(0, os.SEEK_END) - self.TAIL_BYTES)
                f.seek(start)
                tail = f.read()
                # a torn last line (a node crashed mid-write) is ended, so this event starts
                # a line of its own instead of being glued onto the fragment and lost; the
                # fragment stays (evidence: readers skip lines that are not events)
                if tail and not tail.endswith(b"\n"):
                    f.write(b"\n")
                event = build(max(floor, _tail_seq(tail, start > 0)) + 1)
                f.write((ev.to_json(event) + "\n").encode("utf-8"))
                f.flush()
                return event
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def write(self, event: Mapping[str, Any], state: ev.ProgressState) -> None:
        """An event numbered elsewhere, appended as it is (under the lock)."""
        self.append_next(0, lambda _seq: dict(event))

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return ev.parse_lines(f.read())
        except FileNotFoundError:
            return []


def _tail_seq(tail: bytes, cut: bool) -> int:
    """The highest seq among the event lines of the file's end (0 if none); `cut`: the tail
    starts mid-file, so its first line is a fragment."""
    lines = tail.decode("utf-8", errors="replace").splitlines()
    return _last_seq(ev.parse_lines("\n".join(lines[1:] if cut else lines)))


class Emitter:
    """Assigns seq, folds the state, writes every event to every sink (a failing sink is
    logged and skipped), and keeps this session's events for `since()` polling."""

    def __init__(self, sinks: list[Any], history: list[Mapping[str, Any]] = (),
                 clock: Callable[[], str] = ev.now_iso) -> None:
        self.sinks = list(sinks)
        self.clock = clock
        self.state = ev.fold(list(history))
        self.seq = _last_seq(history)
        self.session: list[dict[str, Any]] = []
        self.starts = 0
        self._lock = threading.RLock()  # the trackers' thread emits too (training.events.trackers)
        self.redact = Redactor.from_environ(os.environ)
        for sink in self.sinks:
            if hasattr(sink, "bind"):
                sink.bind(self.emit)

    def emit(self, etype: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            return self._emit(etype, **fields)

    def _emit(self, etype: str, **fields: Any) -> dict[str, Any]:
        # no secret of this process's environment in an event's free text (an error may quote
        # one): the redaction the run's stored logs get too (submitter.contract.run_logs)
        fields = {k: self.redact(v) if isinstance(v, str) and _free_text(k) else v
                  for k, v in _finite(fields).items()}

        def build(seq: int) -> dict[str, Any]:
            return ev.make_event(etype, time=self.clock(), seq=seq, **fields)

        numbered_by = next((s for s in self.sinks if hasattr(s, "append_next")), None)
        event = None
        if numbered_by is not None:  # the events file numbers it: no seq twice, whoever writes
            try:
                event = numbered_by.append_next(self.seq, build)
            except OSError as e:  # a bad event still raises, as before any sink saw it
                log.warning("event sink %s failed: %s", type(numbered_by).__name__, e)
                # not tried again below: one warning per event, not two
        if event is None:
            event = build(self.seq + 1)
        self.seq = event["seq"]
        self.state = ev.apply(self.state, event)
        self.session.append(event)
        for sink in self.sinks:
            if sink is numbered_by:
                continue
            try:
                sink.write(event, self.state)
            except Exception as e:  # noqa: BLE001
                log.warning("event sink %s failed: %s", type(sink).__name__, e)
        return event

    def worker_group_started(self, resumed_from: Optional[str], epoch: int,
                             step: int, **group: Any) -> Optional[dict[str, Any]]:
        """Called by rank 0 each time a worker group starts training. `attempt` counts the
        run's worker-group restarts across driver sessions (it continues from the history).
        `group` (training.gpt2.elastic.group_batch: world_size, accumulation_steps, ...) rides on
        these events; a start with another world size than the last also gets
        worker_group_resized (from, to)."""
        self.starts += 1
        before, now = self.state.world_size, group.get("world_size")
        out = None
        if self.starts > 1:
            out = self.emit("worker_group_restarted", attempt=self.state.restarts + 1,
                            resumed_from=resumed_from, epoch=epoch, step=step, **group)
        elif resumed_from is not None:
            out = self.emit("run_resumed", resumed_from=resumed_from, epoch=epoch, step=step,
                            **group)
        if now is not None and before is not None and now != before:
            out = self.emit("worker_group_resized", **{"from": before, "to": now}, epoch=epoch,
                            step=step, resumed_from=resumed_from, **group)
        if now is not None:  # known from now on, also when no event said it
            self.state = dataclasses.replace(self.state, world_size=now)
        return out

    def request_preemption(self) -> None:
        """The driver got SIGTERM: the workers (polling) checkpoint at their next step."""
        self.preempt = True

    def preemption_requested(self) -> bool:
        return getattr(self, "preempt", False)

    def stop_for_limit(self, reason: str, step: int) -> None:
        """Rank 0 stopped the run for a limit of the job (its checkpoint is saved): the driver
        records run_stopped once fit() returns."""
        self.limit = {"reason": reason, "step": step}

    def limit_stop(self) -> Optional[dict[str, Any]]:
        return getattr(self, "limit", None)

    def since(self, seq: int) -> list[dict[str, Any]]:
        """This session's events with a seq above `seq` (for the driver's live output)."""
        return [e for e in self.session if e["seq"] > seq]

    def snapshot(self) -> dict[str, Any]:
        return self.state.to_dict()

    def problems(self) -> list[str]:
        """One line per sink that could not write (its first failure and why): the driver
        prints each once into the job's log."""
        return [p for p in (getattr(s, "problem", None) for s in self.sinks) if p]


def _free_text(field: str) -> bool:
    """Fields that carry text from elsewhere (an exception's message), not our own values."""
    return field in ("error", "message") or field.endswith("_error")


def _finite(fields: Mapping[str, Any]) -> dict[str, Any]:
    """NaN/inf are not JSON: send null (the schema asks for it)."""
    import math

    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in fields.items()}


class RunEmitter(Emitter):
    """The emitter of one run, built where it lives (in the driver's Ray actor)."""

    def __init__(self, run_dir: Optional[str], environ: Mapping[str, str],
                 usage: Optional[Mapping[str, Any]] = None) -> None:
        sinks, history = run_sinks(run_dir, environ)
        if run_dir is not None and usage is not None:  # usage.json (training.run.usage_file)
            from training.run.usage_file import UsageSink

            sinks.append(UsageSink(run_dir, history, **usage))
        super().__init__(sinks, history)


def run_sinks(run_dir: Optional[str], environ: Mapping[str, str],
              trackers: bool = True) -> tuple[list[Any], list[dict[str, Any]]]:
    """The run's sinks and its event history: events.jsonl under run_dir (a filesystem
    storage path), the ConfigMap if the environment names one; seq continues from whichever
    holds the most history. `trackers`: the metrics trackers too (a training run's)."""
    sinks: list[Any] = []
    history: list[dict[str, Any]] = []
    if run_dir is not None:
        fs = events_sink(run_dir)
        history = fs.read()
        sinks.append(fs)
    cm_name = environ.get(naming.ENV_PROGRESS_CONFIGMAP)
    if cm_name:
        from training.events.progress_configmap import ConfigMapSink

        cm = ConfigMapSink(cm_name, environ.get(naming.ENV_NAMESPACE) or "default")
        cm_history = cm.read()
        if _last_seq(cm_history) > _last_seq(history):
            history = cm_history
        cm.continue_from(history)
        sinks.append(cm)
    if run_dir is not None and trackers:  # TensorBoard always; MLflow, W&B by their variables
        from training.events.trackers import TrackerSink

        sinks.append(TrackerSink(run_dir, {**os.environ, **environ}, history))
    return sinks, history


def events_sink(run_dir: str) -> Any:
    """events.jsonl under the run directory: a file, or an object in an object store."""
    from submitter.contract.storage import scheme_of

    if scheme_of(run_dir) not in ("", "file"):
        from training.run.object_store import ObjectStoreSink

        return ObjectStoreSink(f"{run_dir.rstrip('/')}/{naming.EVENTS_FILE}")
    return FileSink(os.path.join(run_dir, naming.EVENTS_FILE))


def _last_seq(events: list[Mapping[str, Any]]) -> int:
    return max((int(e.get("seq", 0)) for e in events), default=0)
