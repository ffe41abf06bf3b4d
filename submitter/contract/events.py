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
    # an elastic group (--replicas MIN:MAX) started with another number of workers than the
    # last one: "from" and "to" are world sizes; global_batch_size/tokens_per_step show that
    # the optimizer step stayed the same
    "worker_group_resized": frozenset({"from", "to"}),
    # a new driver (re-submit, RayJob retry) picked the run up from a checkpoint
    "run_resumed": frozenset({"resumed_from", "epoch", "step"}),
    "run_finished": frozenset(),
    "run_failed": frozenset({"error"}),
    # a limit of the job (--deadline, --max-cost: submitter.contract.run_limits) passed: the
    # run saved a checkpoint and stopped; reason is deadline | max_cost, message says what was
    # measured against the limit and how to continue
    "run_stopped": frozenset({"reason", "message"}),
    # a metrics tracker (tensorboard, mlflow, wandb) failed: training goes on, it is retried
    # with backoff; tracker_recovered says it caught up (down_s: seconds it was failing)
    "tracker_failed": frozenset({"tracker", "error"}),
    "tracker_recovered": frozenset({"tracker"}),
    # a prepare job (python -m training.prepare): a shard of the corpus is written; shards_done
    # counts those of earlier (interrupted) runs too; tokens and tokens_per_sec are this run's
    "prepare_progress": frozenset({"shards_done", "shards", "tokens", "tokens_per_sec"}),
}
EVENT_TYPES = tuple(REQUIRED)
#: Fields some events carry besides the required ones (consumers treat all as optional).
OPTIONAL: dict[str, frozenset[str]] = {
    # run_dir: where the run lives (`<storage>/<namespace>/<name>` for a cluster run)
    "run_started": frozenset({"run_dir", "model", "params", "tokenizer", "data", "epochs",
                              "steps_per_epoch", "block_size", "batch_size_per_worker",
                              "precision", "compile",
                              # a --script run: the script's name in its code bundle
                              "script",
                              # a prepare job: the corpus directory it writes
                              "corpus",
                              # started_at: the driver's start (wall-clock of the segment
                              # counts from it: submitter.contract.usage)
                              "started_at"}),
    # the first progress event of every (re)start says how the workers train; with compile on,
    # compile_s is the seconds the first step spent compiling (a restart that finds the run's
    # compile cache spends a few), and the inductor cache's hits/misses (fxgraph_cache_hit ...)
    # world_size: the group's workers (a fresh run's first start has no event that says it)
    "progress": frozenset({"data_wait_fraction", "precision", "accumulation_steps",
                           "micro_batch_size", "world_size", "parallel",
                           "tf32", "grad_compression", "compile", "compile_s", "compile_cache",
                           "fxgraph_cache_hit", "fxgraph_cache_miss",
                           # a --script run: rank 0's reported metrics, by the script's names;
                           # from_scratch: the checkpoint the run had when its first report
                           # started over (said once; the script ignores get_checkpoint())
                           "metrics", "from_scratch"}),
    # sent by Ray Train's controller once the checkpoint is registered (what a resume uses):
    # registered is true; reason is epoch_end | interval | preemption (SIGTERM); stall_s: the
    # seconds training paused for it (the upload runs behind training)
    "checkpoint_saved": frozenset({"step", "val_loss", "registered", "reason", "stall_s"}),
    # export_dir: the Hugging Face directory; sample: sample_prompt (from the data) continued at a temperature
    "run_finished": frozenset({"epoch", "step", "train_loss", "val_loss", "tokens_per_sec",
                               "checkpoint_dir", "latest_checkpoint", "best_checkpoint",
                               "export_dir", "sample_prompt", "sample", "export_error",
                               # a prepare job: the corpus, its shards and tokens, documents
                               # read; already: it was prepared before and nothing was written;
                               # hold_out: how the validation tokens were chosen (a phrase)
                               "corpus", "shards", "tokens", "val_tokens", "documents",
                               "already", "hold_out"}),
    # reason: preemption when the driver got SIGTERM (the run is retryable)
    "run_failed": frozenset({"reason"}),
    # step and checkpoint: where the run stopped; limit: the limit's value (seconds, money)
    "run_stopped": frozenset({"step", "checkpoint", "limit"}),
    # a --script run: error, one line per failed worker (rank: exception)
    "worker_group_restarted": frozenset({"error"}),
    "tracker_recovered": frozenset({"down_s"}),
    "prepare_progress": frozenset({"documents", "shard"}),
}


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
    status: str = "pending"  # pending | running | finished | failed | stopped (a limit)
    num_workers: int | None = None
    #: workers of the group training now (an elastic group's size changes; see worker_group_resized)
    world_size: int | None = None
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
    #: What the run trains on (run_started's `data`: a corpus, a mixture's shares, ...).
    data: str | None = None
    #: epochs x steps_per_epoch from run_started (None: unknown), for the ETA.
    total_steps: int | None = None
    #: The step cadence: seconds per optimizer step, smoothed over progress events of one
    #: worker-group start (a restart's downtime is not a step), and the last (step, time) seen.
    seconds_per_step: float | None = None
    cadence_step: int | None = None
    cadence_time: str | None = None

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
                       num_workers=e["num_workers"], error=None, total_steps=_total_steps(e),
                       data=e.get("data", state.data),
                       cadence_step=None, cadence_time=None, **common)
    if etype == "progress":
        return replace(state, status="running", epoch=e["epoch"], step=e["step"], loss=e["loss"],
                       tokens_per_sec=e["tokens_per_sec"], lr=e["lr"],
                       world_size=e.get("world_size", state.world_size), **_cadence(state, e),
                       **common)
    if etype == "epoch_finished":
        return replace(state, epoch=e["epoch"], train_loss=e["train_loss"],
                       val_loss=e["val_loss"], tokens_per_sec=e["tokens_per_sec"], **common)
    if etype == "checkpoint_saved":
        return replace(state, last_checkpoint=e["path"], checkpoints=state.checkpoints + 1,
                       **common)
    if etype == "worker_group_restarted":
        return replace(state, status="running", restarts=max(state.restarts, int(e["attempt"])),
                       resumed_from=e["resumed_from"], cadence_step=None, cadence_time=None,
                       world_size=e.get("world_size", state.world_size), **common)
    if etype == "worker_group_resized":
        return replace(state, world_size=e["to"], **common)
    if etype == "run_resumed":
        return replace(state, status="running", resumed_from=e["resumed_from"], epoch=e["epoch"],
                       step=e["step"], cadence_step=None, cadence_time=None,
                       world_size=e.get("world_size", state.world_size), **common)
    if etype == "run_finished":
        metrics = {k: v for k, v in e.items() if k not in ("v", "type", "time", "seq")}
        return replace(state, status="finished", metrics=metrics, **common)
    if etype == "run_failed":
        return replace(state, status="failed", error=e["error"], **common)
    if etype == "run_stopped":
        return replace(state, status="stopped", error=e["message"], **common)
    if etype == "prepare_progress":
        return replace(state, status="running", tokens_per_sec=e["tokens_per_sec"], **common)
    return replace(state, **common)


def fold(events: list[Mapping[str, Any]], state: ProgressState | None = None) -> ProgressState:
    state = state or ProgressState()
    for event in events:
        state = apply(state, event)
    return state


# --- ETA: from the run's own step cadence -----------------------------------------------------

#: Weight of the newest interval in the smoothed seconds per step.
CADENCE_WEIGHT = 0.3


def parse_time(text: Any) -> datetime | None:
    """An event's `time` (ISO 8601, `Z`) as an aware datetime; None if it is not one."""
    if not isinstance(text, str):
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _total_steps(e: Mapping[str, Any]) -> int | None:
    epochs, per_epoch = e.get("epochs"), e.get("steps_per_epoch")
    if isinstance(epochs, int) and isinstance(per_epoch, int) and epochs > 0 and per_epoch > 0:
        return epochs * per_epoch
    return None


def _cadence(state: ProgressState, e: Mapping[str, Any]) -> dict[str, Any]:
    """The cadence fields after a progress event (pure)."""
    step, when = e.get("step"), e.get("time")
    out: dict[str, Any] = {"cadence_step": step, "cadence_time": when}
    then, now = parse_time(state.cadence_time), parse_time(when)
    if (isinstance(step, int) and isinstance(state.cadence_step, int) and step > state.cadence_step
            and then is not None and now is not None and now > then):
        interval = (now - then).total_seconds() / (step - state.cadence_step)
        old = state.seconds_per_step
        out["seconds_per_step"] = interval if old is None else \
            (1 - CADENCE_WEIGHT) * old + CADENCE_WEIGHT * interval
    return out


def duration(seconds: float) -> str:
    """45s, 12m30s, 3h05m, 2d04h: short and exact enough for an ETA or a stall warning."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def eta_seconds(state: ProgressState, now: datetime | None = None) -> float | None:
    """Seconds until the last step at the run's cadence (None: unknown or not running). With
    `now`, the time since the last progress event is already spent."""
    if (state.status != "running" or state.total_steps is None or state.step is None
            or state.seconds_per_step is None):
        return None
    left = max(0, state.total_steps - state.step) * state.seconds_per_step
    last = parse_time(state.cadence_time)
    if now is not None and last is not None:
        left -= max(0.0, (now - last).total_seconds())
    return max(0.0, left)


# --- the curve: a bounded, downsampled record of the whole run ----------------------------------
# The progress ConfigMap keeps only the last events; the curve keeps the whole run in at most
# CURVE_MAX_POINTS points per series, so `submitter report` can draw it from a cluster job.

CURVE_MAX_POINTS = 500
#: Key of the curve (JSON) in the progress ConfigMap.
CURVE_KEY = "curve.json"


def empty_curve() -> dict[str, Any]:
    """progress: [step, loss, tokens_per_sec]; val: [step, epoch, train_loss, val_loss];
    checkpoints: [step, epoch]; restarts: [step, attempt]; resizes: [step, from, to] (an elastic
    group's worker count); `stride`: every how many progress
    events one is kept (doubles whenever the series is halved); `last`: the newest progress
    point, always kept."""
    return {"v": 1, "stride": 1, "seen": 0, "progress": [], "val": [], "checkpoints": [],
            "restarts": [], "resizes": [], "last": None, "step": None, "seq": None}


def curve_apply(curve: Mapping[str, Any], event: Mapping[str, Any],
                max_points: int = CURVE_MAX_POINTS) -> dict[str, Any]:
    """Fold one event into the curve (pure: returns a new curve, bounded by `max_points`)."""
    out = {k: (list(v) if isinstance(v, list) else v) for k, v in curve.items()}
    seq = event.get("seq")
    if isinstance(seq, int):
        if isinstance(out.get("seq"), int) and seq <= out["seq"]:
            return out  # already folded (a new driver continues from the ConfigMap's curve)
        out["seq"] = seq
    etype, step = event.get("type"), event.get("step")
    if isinstance(step, int):
        out["step"] = step
    where = out.get("step")
    if etype == "progress":
        point = [step, event.get("loss"), event.get("tokens_per_sec")]
        out["last"] = point
        if out["seen"] % out["stride"] == 0:
            out["progress"].append(point)
            if len(out["progress"]) > max_points:
                out["progress"] = out["progress"][::2]
                out["stride"] *= 2
        out["seen"] += 1
    elif etype == "epoch_finished":
        out["val"] = _bounded(out["val"] + [[where, event.get("epoch"), event.get("train_loss"),
                                             event.get("val_loss")]], max_points)
    elif etype == "checkpoint_saved":
        out["checkpoints"] = _bounded(out["checkpoints"] + [[where, event.get("epoch")]], max_points)
    elif etype == "worker_group_restarted":
        out["restarts"] = _bounded(out["restarts"] + [[where, event.get("attempt")]], max_points)
    elif etype == "worker_group_resized":  # curves kept before resizes existed lack the key
        out["resizes"] = _bounded(out.get("resizes", []) + [[where, event.get("from"),
                                                             event.get("to")]], max_points)
    return out


def _bounded(points: list[Any], max_points: int) -> list[Any]:
    return points if len(points) <= max_points else points[:1] + points[1:][::2]


def curve_fold(events: list[Mapping[str, Any]], curve: Mapping[str, Any] | None = None,
               max_points: int = CURVE_MAX_POINTS) -> dict[str, Any]:
    out = dict(curve) if curve is not None else empty_curve()
    for event in events:
        out = curve_apply(out, event, max_points)
    return out


def curve_points(curve: Mapping[str, Any]) -> list[list[Any]]:
    """The progress series with the newest point at its end (what a plot draws)."""
    points = list(curve.get("progress") or [])
    last = curve.get("last")
    if last is not None and (not points or points[-1] != last):
        points.append(last)
    return points


def parse_curve(text: Any) -> dict[str, Any] | None:
    """A curve from its JSON text (None when absent or not a curve of this version)."""
    try:
        data = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("v") != 1:
        return None
    base = empty_curve()
    for key, default in base.items():
        if type(data.get(key, default)) is not type(default) and default is not None:
            return None
    return {**base, **{k: data[k] for k in base if k in data}}
