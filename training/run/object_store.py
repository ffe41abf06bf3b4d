"""events.jsonl in an object store (`s3://`, `gs://`, ...), beside the checkpoints Ray Train writes.

Objects cannot be appended to, so the sink keeps the run's events and rewrites the whole object:
at once for the events a reader must not miss (start, checkpoints, restarts, epochs, the end) and
otherwise at most every `min_interval` seconds, so a fast progress cadence costs a few PUTs a
minute, not one per event. The filesystem is pyarrow's, the one Ray Train itself writes with, so
the same credentials and endpoint (`AWS_ENDPOINT_URL`, IRSA, Workload Identity) apply.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional

from submitter.contract import events as ev

#: Events written through at once: what `watch`, `report` and a resumed driver must see.
URGENT = frozenset({"run_started", "run_resumed", "worker_group_restarted", "checkpoint_saved",
                    "epoch_finished", "run_finished", "run_failed", "run_stopped"})


def split_uri(uri: str) -> tuple[Any, str]:
    """(pyarrow filesystem, path inside it) for an object-store URI.

    S3 with `allow_delayed_open`: a small object is one PutObject instead of a multipart upload
    (three requests; and S3-compatible servers differ most in their multipart answers)."""
    from pyarrow import fs

    if uri.startswith("s3://"):
        uri += ("&" if "?" in uri else "?") + "allow_delayed_open=true"
    return fs.FileSystem.from_uri(uri)


def as_uri(storage_path: str, path: str) -> str:
    """A checkpoint path as the run's events name it. Ray Train hands back paths inside its
    filesystem (`bucket/runs/x/checkpoint_...`); events carry the URI (`s3://bucket/...`) that
    `checkpoint_saved` printed and a user can pass to another tool."""
    scheme = storage_path.split("://", 1)[0] if "://" in storage_path else ""
    if not scheme or scheme == "file" or "://" in path:
        return path
    return f"{scheme}://{path.lstrip('/')}"


class ObjectStoreSink:
    """`<storage_path>/<run>/events.jsonl` as one object, rewritten as events arrive."""

    def __init__(self, uri: str, *, min_interval: float = 15.0,
                 clock: Callable[[], float] = time.monotonic, filesystem: Any = None) -> None:
        self.uri = uri
        self.min_interval = min_interval
        self.clock = clock
        self._fs, self._path = (filesystem, uri.split("://", 1)[-1]) if filesystem else split_uri(uri)
        self._lines: list[str] = []
        self._last_flush: Optional[float] = None
        self._dirty = False

    def read(self) -> list[dict[str, Any]]:
        """The events already in the object (a resumed run continues its seq from them)."""
        from pyarrow import fs

        if self._fs.get_file_info(self._path).type != fs.FileType.File:
            return []
        with self._fs.open_input_stream(self._path) as f:
            events = ev.parse_lines(f.read().decode("utf-8", errors="replace"))
        self._lines = [ev.to_json(e) for e in events]
        return events

    def continue_from(self, history: list[Mapping[str, Any]]) -> None:
        """Keep the run's earlier events when another sink held more of them."""
        self._lines = [ev.to_json(e) for e in history]

    def write(self, event: Mapping[str, Any], state: ev.ProgressState) -> None:
        self._lines.append(ev.to_json(event))
        self._dirty = True
        now = self.clock()
        if (event.get("type") in URGENT or self._last_flush is None
                or now - self._last_flush >= self.min_interval):
            self.flush()

    def flush(self) -> None:
        if not self._dirty:
            return
        with self._fs.open_output_stream(self._path) as f:
            f.write(("\n".join(self._lines) + "\n").encode("utf-8"))
        self._last_flush = self.clock()
        self._dirty = False
