"""Reads from an object store that survive a flaky bucket: bounded retries with jittered backoff.

Why: the AWS SDK under pyarrow retries a request a few times within a second or so; an outage
a little longer (a throttled prefix, a 503 burst, a reset connection) then kills the training
step, and the worker group restarts from the last checkpoint (a `max_failures` unit, up to a
checkpoint interval of work). And a transient error while reading the manifest at start was
reported as bad input (exit 2). Here every read of a corpus in a bucket is retried on transient
errors (timeouts, connection resets, 5xx, throttling) with "full jitter" exponential backoff
(AWS's advice: a random wait in [0, min(cap, base * 2^attempt)]), and after the budget it ends
in one line (`ReadFailed`, exit 1: not bad input). A missing file, a denied request or a
malformed one is not retried: it is said at once.

`RetryingFileSystem` wraps a pyarrow filesystem (the reader's, for buckets only: a volume is
memory-mapped); its files re-open themselves after an error.
"""

from __future__ import annotations

import random
import re
import threading
import time
from typing import Any, Callable, Optional, TypeVar

from submitter.contract.errors import SubmitterError

T = TypeVar("T")

#: Attempts of one read (each one a request the SDK itself may retry a few times).
ATTEMPTS = 8
#: Backoff: base and cap of the random wait before attempt k (seconds).
BASE_S, CAP_S = 0.2, 20.0

#: What a transient error says (pyarrow's S3/GCS/Azure errors carry the service's words).
_TRANSIENT = re.compile(
    r"(?i)((response code|status( code)?|http)\W{0,3}(5\d\d|429)\b|slow_?down|throttl|"
    r"too many requests|request ?timeout|"
    r"timed? ?out|timeout|connection (reset|refused|aborted|closed)|broken pipe|"
    r"network_connection|service ?unavailable|internal ?(error|failure)|"
    r"temporar(il)?y|try again|curl error|reset by peer|unexpected eof|EOF occurred)")


class ReadFailed(SubmitterError):
    """A read from the bucket kept failing with transient errors past the retry budget."""


def is_transient(error: BaseException) -> bool:
    """An error worth retrying: a timeout or connection error, or the store's 5xx/throttling;
    never a missing file, a denial or bad input."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True
    if not isinstance(error, OSError):
        return False
    text = str(error)
    if re.search(r"(?i)(access ?denied|forbidden|\b403\b|\b404\b|no such (key|bucket)|"
                 r"not ?found|invalid ?access ?key|signature)", text):
        return False
    return _TRANSIENT.search(text) is not None


def backoff(attempt: int, rng: random.Random, base: float = BASE_S, cap: float = CAP_S) -> float:
    """Full jitter: a wait in [0, min(cap, base * 2^attempt)]."""
    return rng.uniform(0.0, min(cap, base * (2 ** attempt)))


def retrying(fn: Callable[[], T], what: str, *, attempts: int = ATTEMPTS,
             base: float = BASE_S, cap: float = CAP_S,
             sleep: Callable[[float], None] = time.sleep,
             rng: Optional[random.Random] = None,
             on_retry: Callable[[int, BaseException], None] = lambda k, e: None) -> T:
    """`fn()`, again after a jittered wait while it fails with a transient error, `attempts`
    times in all; ReadFailed (one line naming `what` and the last error) after that."""
    rng = rng or random.Random()
    waited = 0.0
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - only transient errors are retried
            if not is_transient(e):
                raise
            if attempt == attempts - 1:
                line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ReadFailed(f"{what}: {attempts} attempts over {waited:.1f}s failed with "
                                 f"transient errors (last: {line}); the bucket or the network "
                                 "is failing: the run goes on from its last checkpoint once "
                                 "it answers") from None
            on_retry(attempt + 1, e)
            pause = backoff(attempt, rng, base, cap)
            waited += pause
            sleep(pause)
    raise AssertionError("unreachable")


class RetryingFile:
    """A file of a bucket whose reads are retried; it re-opens itself after an error."""

    def __init__(self, fs: "RetryingFileSystem", path: str) -> None:
        self.fs, self.path, self._f, self.pos = fs, path, None, 0
        self._lock = threading.Lock()  # the reader's fetch threads share a file

    def _file(self) -> Any:
        with self._lock:
            if self._f is None:
                self._f = self.fs.inner.open_input_file(self.path)
            return self._f

    def _do(self, op: Callable[[Any], T]) -> T:
        def attempt() -> T:
            f = self._file()
            try:
                return op(f)
            except Exception:
                self._forget(f)  # the next attempt opens it again
                raise
        return self.fs.call(attempt, f"reading {self.path}")

    def _forget(self, f: Any) -> None:
        """Stop using a handle that failed (not closed here: another thread may be in it)."""
        with self._lock:
            if self._f is f:
                self._f = None

    def _drop(self) -> None:
        with self._lock:
            f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing a broken handle
                pass

    def read_at(self, nbytes: int, offset: int) -> bytes:
        return self._do(lambda f: f.read_at(nbytes, offset))

    def read(self, nbytes: Optional[int] = None) -> bytes:
        pos = self.pos
        size = self.size() if nbytes is None else None
        want = nbytes if nbytes is not None else max(0, (size or 0) - pos)
        data = self._do(lambda f: f.read_at(want, pos)) if want else b""
        self.pos += len(data)
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.size() + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def size(self) -> int:
        return self._do(lambda f: f.size())

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> "RetryingFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RetryingFileSystem:
    """A pyarrow filesystem whose reads (file info, whole reads, ranged reads) are retried on
    transient errors; anything else passes through to the filesystem it wraps."""

    def __init__(self, inner: Any, *, attempts: Optional[int] = None,
                 base: Optional[float] = None, cap: Optional[float] = None,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: Optional[random.Random] = None) -> None:
        self.inner = inner
        self.attempts = ATTEMPTS if attempts is None else attempts
        self.base = BASE_S if base is None else base
        self.cap = CAP_S if cap is None else cap
        self.sleep, self.rng = sleep, rng or random.Random()
        self.retries = 0  # how many times a read was retried (what a test or a benchmark counts)

    def call(self, fn: Callable[[], T], what: str) -> T:
        def counted(k: int, e: BaseException) -> None:
            self.retries += 1
        return retrying(fn, what, attempts=self.attempts, base=self.base, cap=self.cap,
                        sleep=self.sleep, rng=self.rng, on_retry=counted)

    def get_file_info(self, paths: Any) -> Any:
        return self.call(lambda: self.inner.get_file_info(paths), f"listing {paths}")

    def open_input_file(self, path: str) -> RetryingFile:
        return RetryingFile(self, path)

    def open_input_stream(self, path: str, *args: Any, **kwargs: Any) -> Any:
        """The whole object, read with retries (what a manifest or a note is), as a stream."""
        import pyarrow as pa

        def whole() -> bytes:
            with self.inner.open_input_stream(path, *args, **kwargs) as f:
                return f.read()
        return pa.BufferReader(self.call(whole, f"reading {path}"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
