"""The driver's output and the workers' errors, kept under the run (`<run>/logs/`), so they
outlive the pods and the Ray cluster (`submitter logs NAME` reads them when the pods are gone).

- `capture_driver(run_dir, job)`: from the driver's start to its end, everything it writes to
  stdout and stderr (its own lines, the events, what Ray forwards from the workers) also goes,
  line by line and redacted (submitter.contract.run_logs.Redactor), into this session's
  `driver-<stamp>-<pid>.log`, size-capped and rotated. On a PVC or a local path the file is
  written in place; for an object store it is written locally and uploaded every
  UPLOAD_EVERY_S and at the end (objects cannot be appended to).
- `keeping_own_error`: each worker writes its own training function's traceback to
  `worker-<rank>.err.log` before the error leaves it (on the storage before the run can be
  reported failed, whatever the load); `WorkerErrorLogs`, a Ray Train callback in the
  controller, appends what only the controller sees (a worker that died or stopped answering).

Both drivers keep the same logs the same way: `python -m training` and a `--script` job's runner
(`python -m training.run_script`) run under `kept_logs(run_dir, job)` and give every trainer
`worker_error_logs(run_dir, job)`.

Logging never stops training: a storage that cannot be written is said once on stderr.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import traceback
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import cache
from typing import Any, Callable, Iterator, Mapping, Optional

from submitter.contract import run_logs as names
from submitter.contract.run_logs import Redactor, secret_names_of
from training.run.identity import is_local, join


class LogStore:
    """`<run>/logs/` on a filesystem path or in an object store: list, read, write, delete."""

    def __init__(self, run_dir: str) -> None:
        self.uri = join(run_dir, names.LOGS_DIR)
        self.local = is_local(self.uri)
        if self.local:
            self.path = self.uri  # join() gave a plain path
        else:
            from training.run.object_store import split_uri

            self.fs, self.path = split_uri(self.uri)
            self.path = self.path.split("?")[0].rstrip("/")

    def names(self) -> list[str]:
        if self.local:
            return sorted(os.listdir(self.path)) if os.path.isdir(self.path) else []
        from pyarrow import fs

        infos = self.fs.get_file_info(fs.FileSelector(self.path, allow_not_found=True))
        return sorted(os.path.basename(i.path) for i in infos if i.type == fs.FileType.File)

    def read(self, name: str) -> bytes:
        if self.local:
            try:
                with open(os.path.join(self.path, name), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return b""
        try:
            with self.fs.open_input_stream(f"{self.path}/{name}") as f:
                return f.read()
        except (FileNotFoundError, OSError):
            return b""

    def write(self, name: str, data: bytes) -> None:
        if self.local:
            os.makedirs(self.path, exist_ok=True)
            with open(os.path.join(self.path, name), "wb") as f:
                f.write(data)
            return
        with self.fs.open_output_stream(f"{self.path}/{name}") as f:
            f.write(data)

    def delete(self, name: str) -> None:
        if self.local:
            try:
                os.remove(os.path.join(self.path, name))
            except FileNotFoundError:
                pass
        else:
            self.fs.delete_file(f"{self.path}/{name}")


class RotatingFile:
    """A log file of at most `max_bytes`; when full it becomes `.1` (`.1` becomes `.2` ...) and
    files beyond `backups` are deleted. `on_rotate(name)` hears of each file closed for good."""

    def __init__(self, directory: str, name: str, max_bytes: int = names.MAX_BYTES,
                 backups: int = names.BACKUPS,
                 on_rotate: Callable[[str], None] = lambda name: None) -> None:
        self.directory, self.name = directory, name
        self.max_bytes, self.backups, self.on_rotate = max_bytes, backups, on_rotate
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, name)
        self._f = open(self.path, "ab")
        self._size = self._f.tell()

    def write(self, data: bytes) -> None:
        if self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
        self._f.write(data)
        self._f.flush()
        self._size += len(data)

    def _rotate(self) -> None:
        self._f.close()
        if self.backups == 0:
            os.remove(self.path)
        for n in range(self.backups, 0, -1):  # .1 -> .2 ..., the live file -> .1
            source = self.path if n == 1 else f"{self.path}.{n - 1}"
            if os.path.exists(source):
                os.replace(source, f"{self.path}.{n}")
        for n in range(self.backups, 0, -1):
            if os.path.exists(f"{self.path}.{n}"):
                self.on_rotate(f"{self.name}.{n}")
        self._f = open(self.path, "ab")
        self._size = 0

    def close(self) -> None:
        self._f.close()


class LineTee:
    """A text stream that writes through to `stream` and hands each whole line, redacted, to
    `sink` (a secret split across two writes is masked as well)."""

    def __init__(self, stream: Any, sink: Callable[[bytes], None], redact: Redactor) -> None:
        self.stream, self.sink, self.redact = stream, sink, redact
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        with self._lock:
            self._partial += text
            if "\n" in self._partial:
                whole, _, self._partial = self._partial.rpartition("\n")
                self._emit(whole + "\n")
        return written if written is not None else len(text)

    def _emit(self, text: str) -> None:
        try:
            self.sink(self.redact(text).encode("utf-8", errors="replace"))
        except Exception as e:  # noqa: BLE001 - the log never stops the run
            self.sink = _dropped
            self.stream.write(f"run logs: stopped keeping the driver's output ({e})\n")

    def flush_partial(self) -> None:
        with self._lock:
            if self._partial:
                self._emit(self._partial + "\n")
                self._partial = ""

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer ...
        return getattr(self.stream, name)


def _dropped(data: bytes) -> None:
    return None


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class DriverLog:
    """This driver session's output under `<run>/logs/` (see the module's docstring)."""

    def __init__(self, run_dir: str, job: Optional[Mapping[str, Any]] = None,
                 environ: Mapping[str, str] = os.environ,
                 upload_every: float = names.UPLOAD_EVERY_S, **rotation: Any) -> None:
        self.store = LogStore(run_dir)
        self.redact = Redactor.from_environ(environ, secret_names_of(job))
        self.name = names.driver_log_name(_stamp(), os.getpid())
        self.directory = self.store.path if self.store.local else \
            tempfile.mkdtemp(prefix="driver-log-")
        _prune(self.store)
        self.file = RotatingFile(self.directory, self.name, on_rotate=self._rotated, **rotation)
        self.upload_every = upload_every
        self._done = threading.Event()
        self._uploader: Optional[threading.Thread] = None
        self.problem: Optional[str] = None
        self._tees: list[LineTee] = []
        self._saved: tuple[Any, Any] = (None, None)
        self._lock = threading.Lock()

    def start(self) -> "DriverLog":
        self.file.write(f"=== driver session {self.name} on {os.uname().nodename} ===\n".encode())
        self._saved = (sys.stdout, sys.stderr)
        self._tees = [LineTee(s, self._write, self.redact) for s in self._saved]
        sys.stdout, sys.stderr = self._tees
        if not self.store.local:
            self._uploader = threading.Thread(target=self._upload_loop, name="driver-log",
                                              daemon=True)
            self._uploader.start()
        return self

    def _write(self, data: bytes) -> None:
        with self._lock:  # stdout and stderr, from any thread
            self.file.write(data)

    def _rotated(self, name: str) -> None:
        if not self.store.local:  # the rotated parts moved up one: upload each again
            self._upload(name)

    def _upload(self, name: str) -> None:
        try:
            with open(os.path.join(self.directory, name), "rb") as f:
                self.store.write(name, f.read())
        except Exception as e:  # noqa: BLE001
            if self.problem is None:
                self.problem = f"run logs: cannot upload to {self.store.uri}: {e}"
                print(self.problem, file=self._saved[1] or sys.__stderr__)

    def _upload_loop(self) -> None:
        while not self._done.wait(self.upload_every):
            self._upload(self.name)

    def close(self) -> None:
        """Restore stdout/stderr, write the last partial line, upload (object stores)."""
        if self._saved[0] is None:
            return
        for tee in self._tees:
            tee.flush_partial()
        sys.stdout, sys.stderr = self._saved
        self._saved = (None, None)
        self._done.set()
        self.file.close()
        if not self.store.local:
            self._upload(self.name)
            shutil.rmtree(self.directory, ignore_errors=True)


def _prune(store: LogStore) -> None:
    """Keep the newest MAX_SESSIONS - 1 sessions (this one makes MAX_SESSIONS)."""
    try:
        sessions = names.driver_sessions(store.names())
        for session in sessions[:max(0, len(sessions) - names.MAX_SESSIONS + 1)]:
            for name in session:
                store.delete(name)
    except Exception:  # noqa: BLE001 - old logs left behind cost space, not the run
        pass


def capture_driver(run_dir: str, job: Optional[Mapping[str, Any]] = None) -> Optional[DriverLog]:
    """Start keeping the driver's output under the run (None, said once, if it cannot)."""
    try:
        return DriverLog(run_dir, job).start()
    except Exception as e:  # noqa: BLE001 - the log never stops the run
        print(f"run logs: the driver's output is not kept under {run_dir}: {e}", file=sys.stderr)
        return None


@contextmanager
def kept_logs(run_dir: str, job: Optional[Mapping[str, Any]] = None) -> Iterator[None]:
    """The driver's output kept under the run while the block runs (capture_driver), and the
    terminal's streams back, with the last partial line written, however it ends."""
    kept = capture_driver(run_dir, job)
    try:
        yield
    finally:
        if kept is not None:
            kept.close()


def worker_error_text(rank: int, error: BaseException, when: Optional[str] = None) -> str:
    """One failure of one worker, as its log keeps it: a header and the traceback (a Ray
    error's text already holds the worker's own traceback)."""
    when = when or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return f"=== worker rank {rank} failed at {when} ===\n{body.rstrip()}\n"


def append_worker_error(store: LogStore, rank: int, text: str, redact: Redactor,
                        max_bytes: int = names.MAX_ERR_BYTES) -> None:
    """Append to `worker-<rank>.err.log`, keeping its newest `max_bytes`."""
    name = names.worker_err_name(rank)
    data = store.read(name) + redact(text).encode("utf-8", errors="replace")
    if len(data) > max_bytes:  # from the first whole failure (else line) that fits
        cut = data[-max_bytes:]
        start = cut.find(b"=== worker rank ")
        data = cut[start:] if start >= 0 else cut[cut.find(b"\n") + 1:]
    store.write(name, data)


def world_rank() -> int:
    """This Ray Train worker's rank (0 outside a worker group)."""
    try:
        import ray.train

        return int(ray.train.get_context().get_world_rank())
    except Exception:  # noqa: BLE001 - not in a worker: one log, rank 0
        return 0


#: Set on an exception its worker kept (an attribute pickles with the exception's __dict__).
KEPT_MARK = "_submitter_kept_by_worker"


def keeping_own_error(train_fn: Callable[..., Any], run_dir: str,
                      job: Optional[Mapping[str, Any]] = None) -> Callable[..., Any]:
    """`train_fn` as each worker runs it, writing its own traceback to `worker-<rank>.err.log`
    before the error leaves the worker. The controller learns of the error only after that
    (Ray Train polls the workers), so the traceback is on the storage before the run can be
    reported failed, however late the controller's callbacks run under load, and even when
    one of them fails. Same signature as `train_fn` (Ray Train passes the config by it)."""
    import functools

    secret_names = secret_names_of(job)

    @functools.wraps(train_fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return train_fn(*args, **kwargs)
        except BaseException as error:
            rank = world_rank()
            try:
                append_worker_error(LogStore(run_dir), rank, worker_error_text(rank, error),
                                    Redactor.from_environ(os.environ, secret_names))
                setattr(error, KEPT_MARK, True)  # the controller need not write it again
            except Exception as e:  # noqa: BLE001 - the error itself still goes to Ray
                print(f"run logs: cannot keep rank {rank}'s error: {e}", file=sys.stderr)
            raise

    run._keeps_own_error = True  # type: ignore[attr-defined]
    return run


def kept_by_worker(error: BaseException) -> bool:
    """Whether the worker that raised `error` kept it itself (keeping_own_error marks it; the
    mark travels with the pickled exception to the controller)."""
    return bool(getattr(error, KEPT_MARK, False))


@cache
def worker_error_logs_class() -> Any:
    """The callback's class (made once: `isinstance` tells a RunConfig that already has one)."""
    from ray.train import UserCallback

    class WorkerErrorLogs(UserCallback):
        """In Ray Train's controller: the traceback of each worker that failed without
        keeping it itself (a process that died, a worker that stopped answering, a training
        function not wrapped by keeping_own_error) into its error log."""

        def __init__(self, run_dir: str, job: Optional[Mapping[str, Any]] = None) -> None:
            self.run_dir, self.secret_names = run_dir, secret_names_of(job)

        def after_exception(self, run_context: Any, worker_exceptions: dict) -> None:
            try:
                store = LogStore(self.run_dir)
                redact = Redactor.from_environ(os.environ, self.secret_names)
                for rank, error in sorted(worker_exceptions.items()):
                    if kept_by_worker(error):
                        continue
                    append_worker_error(store, int(rank), worker_error_text(int(rank), error),
                                        redact)
            except Exception as e:  # noqa: BLE001 - never in the way of Ray's failure policy
                print(f"run logs: cannot keep the workers' errors: {e}", file=sys.stderr)

    return WorkerErrorLogs


def worker_error_logs(run_dir: str, job: Optional[Mapping[str, Any]] = None) -> Any:
    """The Ray Train callback that keeps each failed worker's traceback under the run (those
    the worker did not keep itself)."""
    return worker_error_logs_class()(run_dir, job)
