"""What a run took: `usage.json` in each run's folder, written by the run, read by the CLI.

Why a file of its own (not only events.jsonl): the estimate (`submitter estimate`) looks for this
user's own finished runs of the same model and card on the same storage, and a report shows what
a run took beside what was estimated; both need a few numbers, not a replay of every event. The
run rewrites the file at each checkpoint and at its end, so a preempted or stopped run has one too
(`finished` False, `stopped_by` saying why).

Stdlib only: the training process writes it and the CLI reads it. An object store's files are
read by a function the caller passes (submitter.report.usage_texts: pyarrow, as the pod wrote them).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Iterable, Mapping, Optional

#: The file's name in a run's folder (`<storage>/<name>/` locally, `<storage>/<namespace>/<name>/`
#: on a cluster).
USAGE_FILE = "usage.json"

#: storage_kind values: the kinds of submitter.contract.storage.StorageDecision, plus a local
#: run's own directory.
STORAGE_KINDS = ("local", "shared-mount", "object-store")

#: stopped_by values the run writes (None: it ran to its end, or is still running).
STOP_REASONS = ("deadline", "max_cost", "preempted", "failed")


@dataclass(frozen=True)
class RunUsage:
    """What one run took, over all its segments (resumes included)."""

    model: str                  # the model preset (gpt2, gpt2-medium...)
    gpu_type: Optional[str]     # the label of submitter.contract.flops' peak table; None on CPU
    storage_kind: str           # one of STORAGE_KINDS
    workers: int                # training workers (ranks) in the latest segment
    gpus: int                   # GPUs in the latest segment (0 on CPU)
    tokens: int                 # tokens trained so far (all segments)
    wall_s: float               # wall-clock seconds over all segments, start-up included
    gpu_hours: float            # GPU-hours held over all segments (gpus x wall, per segment)
    restarts: int               # worker-group restarts and resumes
    tokens_per_s: float         # steady-state pace over the whole job (timed steps only)
    mfu: Optional[float]        # model FLOPs utilisation at that pace; None without a known peak
    finished: bool              # True once the run trained all its steps
    stopped_by: Optional[str]   # why it stopped short (STOP_REASONS), None otherwise
    finished_at: str            # ISO-8601 UTC time this record was written
    cost: Optional[float]       # gpu_hours x price (a CPU run: its hours x price); None: no price
    name: str = ""              # the run's name (its folder), for listings

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunUsage":
        """Parse a usage.json; keys this version does not know are ignored (a newer writer)."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{USAGE_FILE} is not a JSON object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# --- measuring a run from its events (pure) ------------------------------------------------------

#: Events that begin a worker group's steady run: the window of a progress event right after one
#: holds compiling and the first batch, so it is not the steady pace.
_STARTS = ("run_started", "run_resumed", "worker_group_restarted", "worker_group_resized")


@dataclass(frozen=True)
class Segment:
    """One driver session of a run (submit, resume, a RayJob retry): from its start to its last
    event; `gpus` held meanwhile (workers x GPUs each; 0 on CPU)."""

    start: float   # POSIX seconds
    end: float
    gpus: int


def _seconds(text: Any) -> Optional[float]:
    from submitter.contract.events import parse_time

    when = parse_time(text)
    return when.timestamp() if when is not None else None


def segments(events: Iterable[Mapping[str, Any]]) -> list[Segment]:
    """The run's driver sessions: each begins at a run_started (at its `started_at`, the
    driver's start, when it says so) and ends at the session's last event."""
    out: list[Segment] = []
    start = end = None
    gpus = 0
    gpu_each = 0
    for e in events:
        t = _seconds(e.get("time"))
        if t is None:
            continue
        if e.get("type") == "run_started":
            if start is not None:
                out.append(Segment(start, max(end or start, start), gpus))
            start = _seconds(e.get("started_at")) or t
            gpu_each = 1 if e.get("gpu") else 0
            gpus = gpu_each * int(e.get("num_workers") or 0)
        elif start is None:
            continue
        size = e.get("world_size")
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            gpus = gpu_each * size
        end = t
    if start is not None:
        out.append(Segment(start, max(end or start, start), gpus))
    return out


def steady_pace(events: Iterable[Mapping[str, Any]]) -> Optional[float]:
    """Tokens per second over the run's timed steps: every progress window except the first
    after a (re)start (compiling, the first batch), time-weighted (total tokens over total
    time). Falls back to every window when there is no other (a very short run)."""
    steady, first = [0.0, 0.0], [0.0, 0.0]
    per_step: Optional[int] = None
    last_step: Optional[int] = None
    for e in events:
        etype = e.get("type")
        if etype == "run_started":
            gb, block = e.get("global_batch_size"), e.get("block_size")
            per_step = gb * block if isinstance(gb, int) and isinstance(block, int) else per_step
        if etype in _STARTS:
            last_step = None
            if isinstance(e.get("tokens_per_step"), int):
                per_step = e["tokens_per_step"]
            continue
        if etype != "progress":
            continue
        step, rate = e.get("step"), e.get("tokens_per_sec")
        if not isinstance(step, int) or not isinstance(rate, (int, float)) or rate <= 0:
            continue
        steps = step - last_step if last_step is not None else 1
        tokens = max(steps, 1) * (per_step or 1)
        into = steady if last_step is not None and steps > 0 else first
        into[0] += tokens
        into[1] += tokens / rate
        last_step = step
    chosen = steady if steady[1] > 0 else first
    return chosen[0] / chosen[1] if chosen[1] > 0 else None


def billed_hours(events: list[Mapping[str, Any]]) -> float:
    """What a price is paid for: GPU-hours, or the machine's hours for a CPU run's segments."""
    return sum((s.end - s.start) * (s.gpus or 1) for s in segments(events)) / 3600.0


def measure(events: list[Mapping[str, Any]], *, storage_kind: str,
            price: Optional[float] = None, now: Optional[str] = None,
            stopped_by: Optional[str] = None) -> RunUsage:
    """What the run took, from all its events (every segment: events.jsonl keeps them).
    `price`: per GPU-hour, per hour on CPU (None: no cost); `stopped_by`: why it stopped short,
    when it did (else read from the events)."""
    from submitter.contract import events as ev
    from submitter.contract.flops import mfu, peak_for, preset_flops_per_token

    state = ev.fold(list(events))
    started = next((e for e in reversed(events) if e.get("type") == "run_started"), {})
    segs = segments(events)
    wall = sum(s.end - s.start for s in segs)
    gpu_hours = sum((s.end - s.start) * s.gpus for s in segs) / 3600.0
    billed = billed_hours(events)
    gb, block = started.get("global_batch_size"), started.get("block_size")
    per_step = next((e["tokens_per_step"] for e in reversed(events)
                     if isinstance(e.get("tokens_per_step"), int)), None)
    if per_step is None and isinstance(gb, int) and isinstance(block, int):
        per_step = gb * block
    tokens = (state.step or 0) * (per_step or 0)
    pace = steady_pace(events) or 0.0
    peak = peak_for(str(started["gpu"])) if started.get("gpu") else None
    workers = state.world_size or int(started.get("num_workers") or 0)
    params = started.get("params")
    per_token = (preset_flops_per_token(str(started.get("model")), params, block)
                 if isinstance(params, int) and isinstance(block, int) else None)
    util = (mfu(pace / workers, per_token, peak.tflops)
            if peak is not None and per_token and workers and pace else None)
    resumes = sum(1 for e in events if e.get("type") == "run_resumed")
    if stopped_by is None and state.status in ("failed", "stopped"):
        stopped_by = stop_reason_of(events)
    return RunUsage(
        model=str(started.get("model") or ""), gpu_type=peak.label if peak else None,
        storage_kind=storage_kind, workers=workers, gpus=segs[-1].gpus if segs else 0,
        tokens=tokens, wall_s=round(wall, 3), gpu_hours=round(gpu_hours, 6),
        restarts=state.restarts + resumes, tokens_per_s=round(pace, 1),
        mfu=None if util is None else round(util, 4), finished=state.status == "finished",
        stopped_by=stopped_by if state.status != "finished" else None,
        finished_at=now or ev.now_iso(),
        cost=None if price is None else round(billed * price, 4),
        name=str(started.get("run_name") or state.run_name or ""))


def stop_reason_of(events: list[Mapping[str, Any]]) -> Optional[str]:
    """Why the run's last segment ended short: run_stopped's reason (a limit), "preempted"
    (run_failed with reason preemption), "failed"; None when it did not end short."""
    for e in reversed(events):
        if e.get("type") == "run_stopped":
            return str(e.get("reason"))
        if e.get("type") == "run_failed":
            return "preempted" if e.get("reason") == "preemption" else "failed"
        if e.get("type") in ("run_finished", "run_started"):
            return None
    return None


def newest_first(usages: Iterable[RunUsage]) -> list[RunUsage]:
    """ISO-8601 UTC strings sort as times do."""
    return sorted(usages, key=lambda u: u.finished_at, reverse=True)


def read_usages(storage_path: str,
                object_store: Optional[Callable[[str], list[str]]] = None) -> list[RunUsage]:
    """Every run under a storage path that has a usage.json, newest first: `<storage>/<name>/`
    (local runs) and `<storage>/<namespace>/<name>/` (cluster runs). A file that cannot be parsed
    is skipped (a run may be writing it). An object-store URI is read by `object_store` (the
    contract imports no pyarrow: submitter.report.usage_texts is one); without it, none."""
    from submitter.contract.storage import OBJECT_STORE_SCHEMES, local_path, scheme_of

    if scheme_of(storage_path) in OBJECT_STORE_SCHEMES:
        texts = object_store(storage_path) if object_store is not None else []
    else:
        texts = _local_texts(local_path(storage_path))
    usages = []
    for text in texts:
        try:
            usages.append(RunUsage.from_json(text))
        except (ValueError, TypeError):
            continue
    return newest_first(usages)


def _local_texts(root: str) -> list[str]:
    root = os.path.expanduser(root)
    if not os.path.isdir(root):
        return []
    paths = []
    for entry in os.scandir(root):
        if not entry.is_dir():
            continue
        paths.append(os.path.join(entry.path, USAGE_FILE))
        for sub in os.scandir(entry.path):
            if sub.is_dir():
                paths.append(os.path.join(sub.path, USAGE_FILE))
    texts = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except OSError:
            continue
    return texts
