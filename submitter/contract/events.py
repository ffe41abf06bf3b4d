"""The status-event schema: the one contract between the training entrypoint and `watch`.

The entrypoint (producer) emits these events to several sinks (stdout lines with
`STDOUT_PREFIX`, `<storage_path>/<run_name>/events.jsonl`, and in a cluster the job's progress
ConfigMap); `submitter watch` and the local runner (consumers) parse them and fold them into one
`ProgressState`. Stdlib only, so both sides import it cheaply. Bump `SCHEMA_VERSION` on any
incompatible change; consumers ignore unknown event types and unknown fields.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Mapping

SCHEMA_VERSION = 1
#: Prefix of an event line on stdout (driver logs / `submitter logs`).
STDOUT_PREFIX = "SUBMITTER_EVENT "

#: Event type -> fields it must carry (besides v, type, time, seq).
REQUIRED: dict[str, frozenset[str]] = {
    "run_started": frozenset({"run_name", "num_workers", "storage_path"}),
    "progress": frozenset({"epoch", "step", "loss", "tokens_per_sec", "lr"}),
    "epoch_finished": frozenset({"epoch", "train_loss", "val_loss", "tokens_per_sec"}),
    "checkpoint_saved": frozenset({"epoch", "path"}),
    "worker_group_restarted": frozenset({"attempt", "resumed_from"}),
    # a new driver (re-submit, RayJob retry) picked the run up from a checkpoint
    "run_resumed": frozenset({"resumed_from", "epoch", "step"}),
    "run_finished": frozenset(),
    "run_failed": frozenset({"error"}),
}
EVENT_TYPES = tuple(REQUIRED)


class EventError(ValueError):
    """A line or object is not a valid event of this schema."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_event(type: str, *, time: str | None = None, seq: int | None = None,
               **fields: Any) -> dict[str, Any]:
    """Build a validated event. `seq` (monotonic per run) is assigned by the emitter."""
    event: dict[str, Any] = {"v": SCHEMA_VERSION, "type": type, "time": time or now_iso()}
    if seq is not None:
        event["seq"] = seq
    event.update(fields)
    return validate_event(event)


def validate_event(obj: Any) -> dict[str, Any]:
    """Return `obj` if it is a valid event, else raise EventError saying why."""
    if not isinstance(obj, Mapping):
        raise EventError(f"an event is a JSON object, got {type(obj).__name__}")
    etype, etime = obj.get("type"), obj.get("time")
    if not isinstance(etype, str) or not isinstance(etime, str):
        raise EventError("an event needs string fields 'type' and 'time'")
    if not isinstance(obj.get("v", SCHEMA_VERSION), int):
        raise EventError("'v' must be an integer schema version")
    missing = REQUIRED.get(etype, frozenset()) - set(obj)
    if missing:
        raise EventError(f"{etype} event lacks {', '.join(sorted(missing))}")
    for key, value in obj.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise EventError(f"{etype}.{key} is not finite ({value}); send null instead")
    return dict(obj)


def to_json(event: Mapping[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), sort_keys=True)


def to_stdout_line(event: Mapping[str, Any]) -> str:
    return STDOUT_PREFIX + to_json(event)


def parse_line(line: str) -> dict[str, Any] | None:
    """Parse a stdout line or a JSONL line. Returns None for lines that are not events
    (ordinary log output, torn writes); raises nothing."""
    text = line.strip()
    idx = text.find(STDOUT_PREFIX)
    if idx >= 0:
        text = text[idx + len(STDOUT_PREFIX):]
    if not text.startswith("{"):
        return None
    try:
        return validate_event(json.loads(text))
    except (ValueError, EventError):
        return None


def parse_lines(text: str) -> list[dict[str, Any]]:
    return [e for e in (parse_line(line) for line in text.splitlines()) if e is not None]


@dataclass(frozen=True)
class ProgressState:
    """Everything a user wants to see about a run, folded from its events."""

    run_name: str | None = None
    status: str = "pending"  # pending | running | finished | failed
    num_workers: int | None = None
    epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    tokens_per_sec: float | None = None
    lr: float | None = None
    train_loss: float | None = None
    val_loss: float | None = None
    last_checkpoint: str | None = None
    checkpoints: int = 0
    restarts: int = 0
    resumed_from: str | None = None
    error: str | None = None
    last_seq: int | None = None
    updated: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProgressState":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def apply(state: ProgressState, event: Mapping[str, Any]) -> ProgressState:
    """Fold one event into the state (pure). Unknown types only move `updated`/`last_seq`."""
    e = event
    common = {"updated": e.get("time", state.updated),
              "last_seq": e.get("seq", state.last_seq)}
    etype = e.get("type")
    if etype == "run_started":
        return replace(state, status="running", run_name=e["run_name"],
                       num_workers=e["num_workers"], error=None, **common)
    if etype == "progress":
        return replace(state, status="running", epoch=e["epoch"], step=e["step"], loss=e["loss"],
                       tokens_per_sec=e["tokens_per_sec"], lr=e["lr"], **common)
    if etype == "epoch_finished":
        return replace(state, epoch=e["epoch"], train_loss=e["train_loss"],
                       val_loss=e["val_loss"], tokens_per_sec=e["tokens_per_sec"], **common)
    if etype == "checkpoint_saved":
        return replace(state, last_checkpoint=e["path"], checkpoints=state.checkpoints + 1,
                       **common)
    if etype == "worker_group_restarted":
        return replace(state, status="running", restarts=max(state.restarts, int(e["attempt"])),
                       resumed_from=e["resumed_from"], **common)
    if etype == "run_resumed":
        return replace(state, status="running", resumed_from=e["resumed_from"], epoch=e["epoch"],
                       step=e["step"], **common)
    if etype == "run_finished":
        metrics = {k: v for k, v in e.items() if k not in ("v", "type", "time", "seq")}
        return replace(state, status="finished", metrics=metrics, **common)
    if etype == "run_failed":
        return replace(state, status="failed", error=e["error"], **common)
    return replace(state, **common)


def fold(events: list[Mapping[str, Any]], state: ProgressState | None = None) -> ProgressState:
    state = state or ProgressState()
    for event in events:
        state = apply(state, event)
    return state
