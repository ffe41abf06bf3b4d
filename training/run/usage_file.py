"""The run writes what it took, `usage.json` (submitter.contract.usage), beside its events.

A sink of the run's emitter: it keeps every event of the run (earlier segments' too, from
events.jsonl) and rewrites usage.json at each registered checkpoint and at the run's end
(finished, failed, preempted, stopped by a limit), so a run that never ends cleanly still has
the record of its last checkpoint. A local path is replaced atomically; an object store gets one
PUT (pyarrow, the filesystem Ray Train writes with).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from submitter.contract import events as ev
from submitter.contract.usage import USAGE_FILE, measure

#: Events after which usage.json is rewritten.
WRITE_ON = frozenset({"checkpoint_saved", "run_finished", "run_failed", "run_stopped"})


def storage_kind(storage_path: str, environ: Mapping[str, str]) -> str:
    """usage.json's storage_kind: an object store, a shared volume in a pod, or a local run's
    directory (submitter.contract.usage.STORAGE_KINDS)."""
    from submitter.contract.storage import OBJECT_STORE_SCHEMES, scheme_of

    if scheme_of(storage_path) in OBJECT_STORE_SCHEMES:
        return "object-store"
    return "shared-mount" if environ.get("KUBERNETES_SERVICE_HOST") else "local"


def write_text(path: str, text: str) -> None:
    """A whole small file at a local path (atomic replace) or an object-store URI."""
    from training.run.identity import is_local, local_path

    if is_local(path):
        target = local_path(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
        return
    from training.run.object_store import split_uri

    filesystem, inner = split_uri(path)
    with filesystem.open_output_stream(inner) as f:
        f.write(text.encode("utf-8"))


class UsageSink:
    """Rewrites `<run>/usage.json` from the run's whole event history."""

    def __init__(self, run_dir: str, history: list[Mapping[str, Any]], *, storage_kind: str,
                 price: Optional[float] = None) -> None:
        from training.run.identity import join

        self.path = join(run_dir, USAGE_FILE)
        self.events: list[Mapping[str, Any]] = list(history)
        self.storage_kind, self.price = storage_kind, price

    def write(self, event: Mapping[str, Any], state: ev.ProgressState) -> None:
        self.events.append(dict(event))
        if event.get("type") in WRITE_ON:
            usage = measure(self.events, storage_kind=self.storage_kind, price=self.price,
                            now=event.get("time"))
            write_text(self.path, usage.to_json() + "\n")
