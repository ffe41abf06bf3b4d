"""The run's stored logs (`<run>/logs/`) and the redaction every stored text goes through.

Both sides agree here: the pod writes (training.run.logs), `submitter logs` reads
(submitter.stored_logs) when the pods are gone. Stdlib only.

- `driver-<UTC stamp>-<pid>.log`: one driver session's output (a RayJob retry is a new session),
  size-capped: at MAX_BYTES the file rotates to `.1`, `.2` ... and the oldest beyond BACKUPS goes.
  Only the last MAX_SESSIONS sessions are kept.
- `worker-<rank>.err.log`: each failure of a Ray Train worker (its traceback), appended, the
  oldest text dropped beyond MAX_ERR_BYTES.

Redaction: what a log or an event may carry of the pod's environment. A value of a variable
whose name says it is a credential (the pattern `--env` refuses in plain text), or that the job
takes from a Secret (`secret_env`), becomes `***`; so do a URL's password and a bearer token.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Optional

from submitter.contract.naming import CREDENTIAL_ENV

LOGS_DIR = "logs"
DRIVER_PREFIX, DRIVER_SUFFIX = "driver-", ".log"
WORKER_ERR_SUFFIX = ".err.log"
#: One driver log file's size before it rotates, and the rotated files kept per session.
MAX_BYTES = 8 * 1024 * 1024
BACKUPS = 2
#: Driver sessions kept (the oldest are deleted when a new one starts).
MAX_SESSIONS = 20
#: A worker's error log keeps this much of its newest text.
MAX_ERR_BYTES = 1024 * 1024
#: Seconds between uploads of a session's log to an object store (and at its end).
UPLOAD_EVERY_S = 15.0

MASK = "***"
#: Variable names that hold credentials: the pattern `--env` refuses in plain text.
CREDENTIAL_NAME = re.compile(CREDENTIAL_ENV)
#: Values shorter than this are not masked ("1", "true" would mask half the log).
MIN_SECRET_LEN = 6
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@")
_BEARER = re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}")


def driver_log_name(stamp: str, pid: int) -> str:
    """A session's log file: `stamp` is UTC `YYYYmmddTHHMMSSZ`, so names sort by time."""
    return f"{DRIVER_PREFIX}{stamp}-{pid}{DRIVER_SUFFIX}"


def worker_err_name(rank: int) -> str:
    return f"worker-{rank}{WORKER_ERR_SUFFIX}"


def _part(name: str) -> tuple[str, int]:
    """('driver-...log', n) for 'driver-...log.n' (n = 0 for the live file)."""
    base, _, n = name.rpartition(".")
    return (base, int(n)) if n.isdigit() and base.endswith(DRIVER_SUFFIX) else (name, 0)


def driver_sessions(names: Iterable[str]) -> list[list[str]]:
    """The driver log files of a logs directory grouped by session, oldest session first, and
    within a session in the order they were written (`.2`, `.1`, then the live file)."""
    sessions: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        base, n = _part(name)
        if base.startswith(DRIVER_PREFIX) and base.endswith(DRIVER_SUFFIX):
            sessions.setdefault(base, []).append((n, name))
    return [[name for _, name in sorted(parts, reverse=True)] for _, parts in sorted(sessions.items())]


def worker_err_logs(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if n.startswith("worker-") and n.endswith(WORKER_ERR_SUFFIX))


class Redactor:
    """`redactor(text)`: the text with every secret value, URL password and bearer token
    masked. Built from an environment (`from_environ`), so a pod masks its own secrets."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)
        self._values = re.compile("|".join(re.escape(v) for v in values)) if values else None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str],
                     secret_names: Iterable[str] = ()) -> "Redactor":
        """Masks the values of credential-named variables and of `secret_names` (the job's
        `secret_env` keys: a Secret's value under any name)."""
        names = set(secret_names)
        return cls(v for k, v in environ.items() if k in names or CREDENTIAL_NAME.search(k))

    def __call__(self, text: str) -> str:
        if self._values is not None:
            text = self._values.sub(MASK, text)
        text = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + "@", text)
        return _BEARER.sub(lambda m: m.group(1) + MASK, text)


def secret_names_of(job: Optional[Mapping[str, object]]) -> list[str]:
    """The variables a job document takes from Secrets (`secret_env`)."""
    secret_env = (job or {}).get("secret_env")
    return sorted(secret_env) if isinstance(secret_env, dict) else []
