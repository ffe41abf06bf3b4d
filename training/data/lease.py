"""One prepare of a corpus at a time: a lease file in the corpus directory.

Two prepares of one name would write the same `.partial` files and, from different sources,
leave a mixed corpus whose checks pass. So a prepare first takes `<corpus>/prepare.lease`: a
small JSON document naming its holder (host, process, job, a random id) and the time of its
last heartbeat, rewritten every BEAT_SECONDS while it works and removed when it ends.

- On a volume the lease is created exclusively: written beside it, then hard-linked to its
  name (`link` fails when the name exists: one creator wins, on NFS too, and no reader sees
  it half-written); a stale one is first renamed aside (`rename` is atomic: one taker wins).
- In a bucket pyarrow has no conditional write, so the lease is written whole, left to settle
  for SETTLE_SECONDS and read back: of two writers in that window both read the later one's
  and the earlier refuses. (S3 reads after writes are consistent.)

A second prepare meets a lease whose holder still beats: CorpusBusy (exit 8, one line naming
the holder). A lease silent for STALE_SECONDS (a killed pod beats no more) is taken over, and
the prepare says whose it took.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Mapping, Optional

from submitter.contract.errors import CONFLICT, SubmitterError

LEASE = "prepare.lease"
#: A holder rewrites its lease this often.
BEAT_SECONDS = 15.0
#: A lease not rewritten for this long (8 beats) belongs to a prepare that stopped: it may be
#: taken over. Short enough that a RayJob retry after a pod was killed (no release) waits
#: little; a prepare that ends or gets SIGTERM releases its lease at once.
STALE_SECONDS = 120.0
#: A bucket lease is read back this long after it is written (no conditional write there).
SETTLE_SECONDS = 2.0


class CorpusBusy(SubmitterError):
    """Another prepare holds the corpus's lease and still beats (exit 8: a conflict)."""

    exit_code = CONFLICT


def holder(job: str, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Who this prepare is: host (the pod's name in a cluster), process, job, a random id."""
    return {"id": uuid.uuid4().hex, "host": environ.get("HOSTNAME") or socket.gethostname(),
            "pid": os.getpid(), "job": job}


def describe(doc: Mapping[str, Any], now: float) -> str:
    """A holder in words: `job <job> on <host> (pid N), last beat Ns ago`."""
    ago = max(0.0, now - float(doc.get("beat", 0)))
    return (f"job {doc.get('job')} on {doc.get('host')} (pid {doc.get('pid')}), last beat "
            f"{ago:.0f}s ago")


class Lease:
    """The corpus's lease for one prepare (`with Lease(...) as lease:` takes it, beats and
    releases it). `took_over`: the stale holder it replaced, if any."""

    def __init__(self, fs: Any, root: str, me: dict[str, Any], *,
                 clock: Callable[[], float] = time.time, beat_s: float = BEAT_SECONDS,
                 stale_s: float = STALE_SECONDS, settle_s: float = SETTLE_SECONDS,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.fs, self.path, self.me = fs, f"{root.rstrip('/')}/{LEASE}", dict(me)
        self.clock, self.beat_s, self.stale_s, self.settle_s = clock, beat_s, stale_s, settle_s
        self.sleep = sleep
        self.local = type(fs).__name__ == "LocalFileSystem"
        self.took_over: Optional[dict[str, Any]] = None
        self.lost: Optional[dict[str, Any]] = None  # the holder that took it from us
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # --- the file ------------------------------------------------------------------------
    def _doc(self) -> bytes:
        now = self.clock()
        return json.dumps({**self.me, "started": self.me.setdefault("started", now),
                           "beat": now}, sort_keys=True).encode()

    def read(self) -> Optional[dict[str, Any]]:
        """The lease as it is now (None: no lease; an unreadable one counts as stale)."""
        try:
            with self.fs.open_input_stream(self.path) as f:
                raw = f.read()
        except (FileNotFoundError, OSError):
            return None
        try:
            doc = json.loads(raw.decode("utf-8"))
        except ValueError:
            return {"id": None, "beat": 0}
        return doc if isinstance(doc, dict) else {"id": None, "beat": 0}

    def _create(self) -> bool:
        """Create the lease unless one exists; True when this prepare holds it."""
        if self.local:  # written beside it, then linked: never seen half-written
            tmp = f"{self.path}.new-{self.me['id']}"
            with open(tmp, "wb") as f:
                f.write(self._doc())
            try:
                os.link(tmp, self.path)  # fails when it exists (NFS too)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            return True
        if self.read() is not None:
            return False
        self._put()
        self.sleep(self.settle_s)
        return (self.read() or {}).get("id") == self.me["id"]

    def _put(self) -> None:
        from training.data.shards import write_whole

        write_whole(self.fs, self.path, self._doc())  # local: beside it, then moved

    def _set_aside(self, stale: Mapping[str, Any]) -> None:
        """Remove a stale lease so that one taker can create its own."""
        if self.local:
            aside = f"{self.path}.stale-{self.me['id']}"
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return  # another taker was first: its lease decides below
            os.unlink(aside)
            return
        self._delete()

    def _delete(self) -> None:
        """Remove the lease object; gone already (or a store that fails) is no error: the
        next reader decides by what it finds."""
        try:
            self.fs.delete_file(self.path)
        except (FileNotFoundError, OSError):
            pass

    # --- the protocol --------------------------------------------------------------------
    def acquire(self) -> None:
        for _ in range(3):
            if self._create():
                return
            current = self.read()
            if current is None:
                continue  # released meanwhile: try again
            if current.get("id") == self.me["id"]:
                return
            now = self.clock()
            if now - float(current.get("beat", 0)) < self.stale_s:
                raise CorpusBusy(
                    f"{self.path}: another prepare holds this corpus ({describe(current, now)}): "
                    f"wait for it to end (submitter watch {current.get('job')}), or stop it; a "
                    f"lease without a heartbeat for {self.stale_s:.0f}s is taken over")
            self.took_over = current
            self._set_aside(current)
        current = self.read() or {}
        raise CorpusBusy(f"{self.path}: another prepare took this corpus meanwhile "
                         f"({describe(current, self.clock())}): prepare again once it ends")

    def beat(self) -> bool:
        """Rewrite the lease's heartbeat; False (and `lost` set) when another holds it now."""
        current = self.read()
        if current is not None and current.get("id") != self.me["id"]:
            self.lost = current
            return False
        if self.local:
            tmp = f"{self.path}.beat-{self.me['id']}"
            with open(tmp, "wb") as f:
                f.write(self._doc())
            os.replace(tmp, self.path)
        else:
            self._put()
        return True

    def release(self) -> None:
        """Remove the lease if it is still this prepare's."""
        if (self.read() or {}).get("id") != self.me["id"]:
            return
        self._delete()

    def _beating(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                if not self.beat():
                    return
            except OSError:
                continue  # a flaky store: the next beat tries again

    def __enter__(self) -> "Lease":
        self.acquire()
        self._thread = threading.Thread(target=self._beating, name="prepare-lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.release()
