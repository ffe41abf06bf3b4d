"""A run's identity: where it lives, what it is, and who is driving it now.

- **Where**: a cluster run lives in `<storage_path>/<namespace>/<name>` (two namespaces on one
  bucket or PVC never share a run); a local run in `<storage_path>/<name>`. Ray Train sees the
  namespace as part of its storage path (`RunConfig(storage_path=<storage>/<ns>, name=<name>)`),
  so checkpoints, `events.jsonl` and `run.json` all sit in that one directory.
- **What**: `run.json` beside the checkpoints, written once by the run's first driver, records
  the settings that decide what the checkpoints mean (model, data, tokenizer). A later driver
  (resume, RayJob retry, a second `submit --local` with the same name) whose settings differ is
  refused, naming each difference; more epochs is allowed (it extends the run).
- **Who**: `run.lock` (pid, host, heartbeat) stops two live drivers on one run directory. A lock
  whose holder is gone (same host, dead pid) or silent for `STALE_AFTER_S` is taken over.

Stdlib only (pyarrow, always present with Ray, for object-store paths).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from submitter.contract import naming
from submitter.contract.errors import UsageError
from submitter.contract.storage import local_path, namespace_root, scheme_of

RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
#: A lock without a heartbeat for this long belongs to a driver that is gone.
STALE_AFTER_S = 120.0
HEARTBEAT_EVERY_S = 20.0
#: The settings that decide what a checkpoint means: a resume must not change them.
IDENTITY_KEYS = ("model", "block_size", "tokenizer", "vocab_size", "dataset", "dataset_config",
                 "data", "data_format", "text_column", "val_percent")


class RunMismatch(UsageError):
    """The run directory holds another run (different model, data or tokenizer)."""


class RunFinished(UsageError):
    """The run already trained all the epochs asked for."""


class RunLocked(UsageError):
    """Another live driver holds the run directory."""


# --- where -----------------------------------------------------------------------------------

def in_cluster(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("KUBERNETES_SERVICE_HOST"))


def run_storage_path(storage_path: str, namespace: str, environ: Mapping[str, str]) -> str:
    """Ray Train's storage_path for the run: `<storage>/<namespace>` in a pod (the namespace
    the pod really runs in, `SUBMITTER_NAMESPACE`, over the document's), `<storage>` locally."""
    if not in_cluster(environ):
        return storage_path
    return namespace_root(storage_path, environ.get(naming.ENV_NAMESPACE) or namespace)


def join(base: str, *parts: str) -> str:
    """Join a path or URI (object stores use `/`)."""
    if scheme_of(base) in ("", "file"):
        return os.path.join(local_path(base), *parts)
    return "/".join([base.rstrip("/"), *parts])


def is_local(path: str) -> bool:
    return scheme_of(path) in ("", "file")


# --- what --------------------------------------------------------------------------------------

def identity(job: Mapping[str, Any], tokenizer: str, vocab_size: int, block_size: int) -> dict[str, Any]:
    """The run's identity from its job settings and what the driver resolved (the tokenizer
    `auto` became, the vocabulary, the block size the preset gave)."""
    out = {k: job.get(k) for k in IDENTITY_KEYS}
    out.update(tokenizer=tokenizer, vocab_size=vocab_size, block_size=block_size)
    return out


def differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """`key: stored -> current` for every identity setting that changed."""
    return [f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in IDENTITY_KEYS
            if k in stored and stored.get(k) != current.get(k)]


def check_same_run(stored: Optional[Mapping[str, Any]], current: Mapping[str, Any],
                   run_dir: str) -> None:
    """Refuse a driver whose model/data/tokenizer differ from the run's (RunMismatch)."""
    if not stored:
        return
    diff = differences(stored.get("identity", {}), current)
    if diff:
        raise RunMismatch(
            f"{run_dir} holds a run with other settings ({'; '.join(diff)}); its checkpoints "
            "would not fit: use another --name (or --storage-path), or the run's own settings")


def check_not_finished(history_state: Any, epochs: int, run_dir: str, name: str) -> None:
    """Refuse re-running a finished run with no more epochs; say how to extend it."""
    if getattr(history_state, "status", None) != "finished":
        return
    done = (history_state.metrics or {}).get("epoch") or 0
    if epochs <= done:
        raise RunFinished(
            f"run {name} already finished {done} epoch(s) ({run_dir}); to train it further pass "
            f"--epochs {done + 1} or more (it continues from its last checkpoint), or start a "
            "new run with another --name; export its model with `submitter export`")


def record(job: Mapping[str, Any], ident: Mapping[str, Any], clock: Callable[[], float] = time.time,
           extra: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    return {"v": 1, "created": clock(), "identity": dict(ident), "job": dict(job), **(extra or {})}


def estimate_extra(environ: Mapping[str, str]) -> dict[str, Any]:
    """The estimate `submit --local` passed (ENV_ESTIMATE) as run.json's RUN_ESTIMATE_KEY, so
    watch/status/report compare the run against it (#38); {} without one or when unreadable."""
    from submitter.contract.naming import ENV_ESTIMATE, RUN_ESTIMATE_KEY

    try:
        value = json.loads(environ.get(ENV_ESTIMATE) or "null")
    except ValueError:
        return {}
    return {RUN_ESTIMATE_KEY: value} if isinstance(value, dict) else {}


def read_json(path: str) -> Optional[dict[str, Any]]:
    """A JSON file at a path or URI, or None when absent."""
    try:
        if is_local(path):
            with open(local_path(path), encoding="utf-8") as f:
                return json.load(f)
        import pyarrow.fs as pafs

        fs, p = pafs.FileSystem.from_uri(path)
        with fs.open_input_stream(p) as f:
            return json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        if "not found" in str(e).lower() or "does not exist" in str(e).lower():
            return None
        raise UsageError(f"{path} is unreadable ({type(e).__name__}: {e}); fix or remove it") from None


def write_json_once(path: str, data: Mapping[str, Any]) -> bool:
    """Write the file unless it exists (True if written). Locally atomic (O_EXCL)."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if is_local(path):
        p = local_path(path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return True
    if read_json(path) is not None:
        return False
    import pyarrow.fs as pafs

    fs, p = pafs.FileSystem.from_uri(path)
    fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(p) as f:
        f.write(text.encode("utf-8"))
    return True


def claim_run(run_dir: str, job: Mapping[str, Any], ident: Mapping[str, Any],
              extra: Optional[Mapping[str, Any]] = None) -> str:
    """Check `run.json` against this driver's identity, or write it for a new run.
    Returns a line for the output."""
    path = join(run_dir, RUN_FILE)
    stored = read_json(path)
    try:
        check_same_run(stored, ident, run_dir)
    except RunMismatch:
        if not is_local(run_dir) or has_checkpoints(run_dir):
            raise
        # a run that never saved a checkpoint (a typo in --data, a failed start) has nothing
        # its settings must protect: the corrected start records its own
        os.replace(local_path(path), local_path(path) + ".replaced")
        stored = None
    if stored is None and write_json_once(path, record(job, ident, extra=extra)):
        return f"run: new, settings recorded in {path}"
    return f"run: continuing {run_dir} (same model, data and tokenizer)"


def has_checkpoints(run_dir: str) -> bool:
    try:
        return any(n.startswith("checkpoint_") for n in os.listdir(local_path(run_dir)))
    except OSError:
        return False


# --- who -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    heartbeat: float
    token: str

    @classmethod
    def parse(cls, text: str) -> Optional["Holder"]:
        try:
            d = json.loads(text)
            return cls(int(d["pid"]), str(d["host"]), float(d["heartbeat"]), str(d["token"]))
        except (ValueError, KeyError, TypeError):
            return None  # torn or foreign: treated as stale

    def text(self) -> str:
        return json.dumps({"pid": self.pid, "host": self.host, "heartbeat": self.heartbeat,
                           "token": self.token})


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder_is_gone(h: Optional[Holder], now: float, host: str, stale_after: float,
                   alive: Callable[[int], bool] = pid_alive) -> bool:
    """A lock may be taken over when unreadable, silent for `stale_after`, or held by a dead
    process on this very host (a killed `submit --local`, a restarted container)."""
    if h is None or now - h.heartbeat > stale_after:
        return True
    return h.host == host and not alive(h.pid)


class RunLock:
    """`run.lock` in a local run directory: one live driver per run."""

    def __init__(self, run_dir: str, *, stale_after: float = STALE_AFTER_S,
                 heartbeat_every: float = HEARTBEAT_EVERY_S, clock: Callable[[], float] = time.time,
                 host: Optional[str] = None, pid: Optional[int] = None,
                 alive: Callable[[int], bool] = pid_alive) -> None:
        self.path = os.path.join(run_dir, LOCK_FILE)
        self.stale_after, self.every, self.clock, self.alive = stale_after, heartbeat_every, clock, alive
        self.me = Holder(pid or os.getpid(), host or socket.gethostname(), clock(), uuid.uuid4().hex)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _read(self) -> Optional[Holder]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return Holder.parse(f.read())
        except FileNotFoundError:
            return None

    def _write(self) -> None:
        """Replace the lock with ours (atomic rename: readers never see half a file)."""
        me = Holder(self.me.pid, self.me.host, self.clock(), self.me.token)
        tmp = f"{self.path}.{self.me.token}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(me.text())
        os.replace(tmp, self.path)

    def acquire(self, wait_s: float = 0.0, sleep: Callable[[float], None] = time.sleep,
                on_wait: Callable[[str], None] = lambda line: None) -> None:
        """Take the lock, or raise RunLocked naming the holder. A holder on another host that
        is still fresh is waited for up to `wait_s` (a RayJob retry while the old head pod
        winds down); a live process on this host is refused at once."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        deadline = self.clock() + wait_s
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.close(fd)
                self._write()
                break
            except FileExistsError:
                pass
            holder, now = self._read(), self.clock()
            if holder is not None and holder.token == self.me.token:
                break
            if holder_is_gone(holder, now, self.me.host, self.stale_after, self.alive):
                self._write()
                sleep(0.05)  # two takers: the later rename wins; check it was us
                mine = self._read()
                if mine is not None and mine.token == self.me.token:
                    break
                continue
            if holder.host == self.me.host or now >= deadline:
                age = max(0.0, now - holder.heartbeat)
                raise RunLocked(
                    f"{os.path.dirname(self.path)} is in use by another driver (pid {holder.pid} "
                    f"on {holder.host}, heartbeat {age:.0f}s ago): wait for it to end, stop it, "
                    "or use another --name")
            if not getattr(self, "_told", False):
                self._told = True
                on_wait(f"run lock: held by pid {holder.pid} on {holder.host} (heartbeat "
                        f"{max(0.0, now - holder.heartbeat):.0f}s ago); waiting up to "
                        f"{max(0.0, deadline - now):.0f}s for it to end or go stale")
            sleep(min(5.0, max(0.0, deadline - now)))
        self._thread = threading.Thread(target=self._beat, name="run-lock", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                holder = self._read()
                if holder is None or holder.token != self.me.token:
                    return  # taken over: a later driver owns the run now
                self._write()
            except OSError:
                pass

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        try:
            holder = self._read()
            if holder is not None and holder.token == self.me.token:
                os.remove(self.path)
        except OSError:
            pass

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_run_dir(run_dir: str, environ: Mapping[str, str],
                 notice: Callable[[str], None]) -> Optional[RunLock]:
    """Take the run's lock before anything is written (one live driver per run directory), for
    both drivers (`python -m training` and `python -m training.run_script`). In a pod a RayJob
    retry may start while the old head still winds down: it waits that out. None on an object
    store, which cannot lock (said in a line)."""
    if not is_local(run_dir):
        notice(f"run lock: none on {run_dir} (object stores cannot lock); run one driver per "
               "name")
        return None
    lock = RunLock(run_dir)
    lock.acquire(wait_s=STALE_AFTER_S + 10 if in_cluster(environ) else 0.0, on_wait=notice)
    return lock
