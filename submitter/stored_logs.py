"""`submitter logs NAME` once the pods are gone: the run's stored logs (`<run>/logs/`, written by
the driver in the pod: training.run.logs), from a local path, a mounted PVC or an object store.

What is shown, in order: each driver session's output (a RayJob retry is a new session), then
each worker's error log. `-f` follows the newest session until the run's events say it ended.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, TextIO

from submitter.contract import events as ev
from submitter.contract import naming
from submitter.contract import run_logs as names
from submitter.contract.errors import NotFound, UsageError
from submitter.contract.storage import OBJECT_STORE_SCHEMES, scheme_of
from submitter.report import first_line

#: Seconds between two reads of the stored logs when following them.
FOLLOW_POLL_S = 2.0


@dataclass
class RunFiles:
    """One run directory's files: a local directory, or a prefix in an object store."""

    where: str  # the run directory as the user would write it (a path or a URI)
    fs: Any = None  # pyarrow filesystem for an object store; None for a local directory
    path: str = ""  # the run directory inside `fs` (or the local path)
    logs: Optional[list[str]] = None  # `logs/` as find_run listed it (one LIST on a bucket)

    def log_names(self) -> list[str]:
        """The files under `logs/`: as listed when the run was found, else listed now."""
        return self.logs if self.logs is not None else self.names(names.LOGS_DIR)

    def names(self, sub: str) -> list[str]:
        if self.fs is None:
            directory = os.path.join(self.path, sub)
            return sorted(os.listdir(directory)) if os.path.isdir(directory) else []
        from pyarrow import fs

        infos = self.fs.get_file_info(fs.FileSelector(f"{self.path}/{sub}", allow_not_found=True))
        return sorted(os.path.basename(i.path) for i in infos if i.type == fs.FileType.File)

    def read(self, relative: str) -> Optional[bytes]:
        try:
            if self.fs is None:
                with open(os.path.join(self.path, relative), "rb") as f:
                    return f.read()
            with self.fs.open_input_stream(f"{self.path}/{relative}") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError):
            return None
        except OSError as e:
            if self.fs is not None and "not found" in str(e).lower():
                return None
            raise


def find_run(storage_path: str, name: str, namespace: Optional[str]) -> RunFiles:
    """The run's directory under `storage_path`: `<storage>/<namespace>/<name>` (a cluster run),
    `<storage>/<name>` (a local run), or STORAGE itself; one that has `logs/` or events."""
    candidates = ([f"{namespace}/{name}"] if namespace else []) + [name, ""]
    if scheme_of(storage_path) in OBJECT_STORE_SCHEMES:
        from submitter.report import need_pyarrow

        fs = need_pyarrow()
        try:
            filesystem, root = fs.FileSystem.from_uri(storage_path.rstrip("/"))
        except (ValueError, OSError) as e:
            raise UsageError(f"cannot open --storage-path {storage_path}: {first_line(e)}") from None
        root = root.rstrip("/")
        runs = [RunFiles(f"{storage_path.rstrip('/')}/{c}".rstrip("/"), filesystem,
                         f"{root}/{c}".rstrip("/")) for c in candidates]
    else:
        base = os.path.expanduser(storage_path)
        runs = [RunFiles(os.path.join(base, c).rstrip("/"), None, os.path.join(base, c).rstrip("/"))
                for c in candidates]
    try:
        for run in runs:
            run.logs = run.names(names.LOGS_DIR)
            if run.logs or run.read(naming.EVENTS_FILE) is not None:
                return run
    except OSError as e:  # access denied, no such bucket, endpoint unreachable
        raise UsageError(f"cannot read {storage_path}: {first_line(e)}") from None
    raise NotFound(f"no stored logs for run {name} under {storage_path}; give the --storage-path "
                   "the run used (its run directory is <storage-path>/<namespace>/<name> for a "
                   "cluster run, <storage-path>/<name> for a local one)")


def summary(run: RunFiles) -> str:
    """The one line that says what is shown."""
    listed = run.log_names()
    sessions, workers = names.driver_sessions(listed), names.worker_err_logs(listed)
    return (f"the run's stored logs at {run.where}/{names.LOGS_DIR}/: {len(sessions)} driver "
            f"session(s), {len(workers)} worker error log(s)")


def show(run: RunFiles, out: TextIO) -> dict[str, int]:
    """Print every stored log; returns how much of each file was printed (for `follow`)."""
    listed = run.log_names()
    printed: dict[str, int] = {}
    for session in names.driver_sessions(listed):
        for part in session:
            data = run.read(f"{names.LOGS_DIR}/{part}") or b""
            _write(out, data)
            printed[part] = len(data)
    for err in names.worker_err_logs(listed):
        data = run.read(f"{names.LOGS_DIR}/{err}") or b""
        out.write(f"--- {err} ---\n")
        _write(out, data)
        printed[err] = len(data)
    return printed


def follow_logs(run: RunFiles, out: TextIO, printed: dict[str, int], poll: float = FOLLOW_POLL_S,
           sleep: Callable[[float], None] = time.sleep) -> None:
    """Print what the newest driver session adds (a new session too) until the run's events
    end it (run_finished, or run_failed but for a preemption, which a retry follows) and one
    more read brings nothing new."""
    while True:
        ended = _ended(run)
        grew = False
        sessions = names.driver_sessions(run.names(names.LOGS_DIR))
        for part in (sessions[-1] if sessions else [])[-1:]:
            data = run.read(f"{names.LOGS_DIR}/{part}") or b""
            start = printed.get(part, 0)
            if len(data) < start:  # rotated: the live file started again
                start = 0
            if len(data) > start:
                _write(out, data[start:])
                grew = True
            printed[part] = len(data)
        if ended and not grew:
            return
        sleep(poll)


def _ended(run: RunFiles) -> bool:
    events = ev.parse_lines((run.read(naming.EVENTS_FILE) or b"").decode("utf-8", "replace"))
    last = next((e for e in reversed(events) if e.get("type") in
                 ("run_started", "run_finished", "run_failed")), {})
    return last.get("type") == "run_finished" or \
        (last.get("type") == "run_failed" and last.get("reason") != "preemption")


def _write(out: TextIO, data: bytes) -> None:
    out.write(data.decode("utf-8", errors="replace"))
    out.flush()


# --- `submitter logs NAME`: the pods while they exist, else the stored logs ------------------

def job_logs(kube: Callable[[], Any], namespace: str, name: str, *, storage_path: Optional[str],
             follow: bool, out: TextIO, err: TextIO) -> int:
    """The submitter pod's log (the driver's output) while the pod exists; else (the cluster
    torn down, the RayJob deleted, or a run only on storage) the run's stored logs, from
    `storage_path` or the RayJob's own storage path. One line on `err` says which is shown."""
    from submitter import cluster
    from submitter.contract.errors import Unobservable
    from submitter.state import job_state

    rayjob = None
    try:
        client = kube()
        rayjob = client.find("RayJob", namespace, name)
        try:
            pod = cluster.submitter_pod(client, namespace, name)
        except NotFound:
            pod = None
            state = job_state(rayjob, None, name=name, namespace=namespace) if rayjob else None
            if state is not None and not state.terminal and storage_path is None:
                raise  # not started yet: the pod comes (its message says so)
        if pod is not None:
            err.write(f"logs: the submitter pod {pod} (the driver's output, from the cluster)\n")
            for line in client.log_lines(namespace, pod, follow=follow):
                out.write(line + "\n")
                out.flush()
            return 0
    except (Unobservable, UsageError) as e:
        if storage_path is None:
            raise
        err.write(f"logs: cannot ask the cluster ({first_line(e)}); reading --storage-path\n")
    where = storage_path or _storage_of(rayjob)
    if where is None:
        raise NotFound(f"no RayJob {name} and no submitter pod in namespace {namespace}; for a run "
                       "kept on storage give its --storage-path (e.g. s3://bucket/runs)")
    try:
        run = find_run(where, name, namespace)
    except NotFound:
        if storage_path is None and scheme_of(where) not in OBJECT_STORE_SCHEMES:
            raise NotFound(f"{name}'s pods are gone and its logs are kept on its volume "
                           f"({where}/{namespace}/{name}/{names.LOGS_DIR}/): give --storage-path "
                           "where that volume is mounted here") from None
        raise
    gone = "no RayJob" if rayjob is None else "the pods are gone"
    err.write(f"logs: {gone}; {summary(run)}\n")
    printed = show(run, out)
    if follow:
        follow_logs(run, out, printed)
    return 0


def _storage_of(rayjob: Optional[dict]) -> Optional[str]:
    """The storage path in a RayJob's job document (where its driver keeps the run)."""
    from submitter.contract.errors import SubmitterError
    from submitter.contract.spec import JobSpec
    from submitter.ownership import rayjob_document

    document = rayjob_document(rayjob) if rayjob else None
    try:
        return JobSpec.from_document(document).resolved_storage_path if document else None
    except (SubmitterError, ValueError):
        return None
