"""One normalized job state from a RayJob's status and its progress ConfigMap. Pure functions.

Why: KubeRay reports two fields that users must otherwise reconcile in their heads,
`jobStatus` (what Ray's job manager last said: PENDING/RUNNING/STOPPED/SUCCEEDED/FAILED) and
`jobDeploymentStatus` (what the operator did: Initializing/Running/Complete/Failed/Retrying/
Suspended/...), and they disagree in practice: after an `activeDeadlineSeconds` expiry or a
failed submitter Job the deployment is `Failed` while `jobStatus` still says RUNNING. The
deployment status is the operator's final word, so it wins whenever it is terminal; `jobStatus`
only decides between SUCCEEDED/FAILED/STOPPED once the deployment is `Complete`, and a
terminal `jobStatus` under a non-terminal deployment is not the end yet (KubeRay may retry).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

from submitter.contract.events import ProgressState, duration, fold, parse_lines
from submitter.contract.naming import CONFIGMAP_EVENTS_KEY, CONFIGMAP_STATE_KEY

#: The one-word states, in the order a job normally moves through them.
STATES = ("PENDING", "STARTING", "RUNNING", "FINISHING", "RETRYING", "SUSPENDED",
          "SUCCEEDED", "FAILED", "STOPPED", "DELETED", "UNKNOWN")
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED", "DELETED"})
EXIT_CODES = {"SUCCEEDED": 0}  # every other terminal state: 1

_DEPLOYMENT = {
    "": "PENDING", "New": "PENDING", "Waiting": "PENDING", "Scheduling": "PENDING",
    "Scheduled": "PENDING", "Initializing": "STARTING", "Retrying": "RETRYING",
    "Suspending": "SUSPENDED", "Suspended": "SUSPENDED",
}


def normalize(job_status: str, deployment_status: str) -> tuple[str, str | None]:
    """(state, note). The note explains an inconsistent pair; None when the pair agrees."""
    js, ds = job_status or "", deployment_status or ""
    if ds in ("Failed", "ValidationFailed"):
        note = (f"jobStatus still says {js} but KubeRay marked the deployment {ds}"
                if js and js not in ("FAILED", "STOPPED") else None)
        return "FAILED", note
    if ds == "Complete":
        if js in ("SUCCEEDED", "FAILED", "STOPPED"):
            return js, None
        return "FAILED", f"deployment Complete without a final jobStatus ({js or 'none'})"
    if ds == "Running":
        if js == "RUNNING":
            return "RUNNING", None
        if js in ("SUCCEEDED", "FAILED", "STOPPED"):
            return "FINISHING", None
        return "STARTING", None
    if ds in _DEPLOYMENT:
        return _DEPLOYMENT[ds], None
    return "UNKNOWN", f"unknown jobDeploymentStatus {ds!r}"


def progress_from_configmap(configmap: Mapping[str, Any] | None) -> ProgressState:
    """The training progress the entrypoint wrote: `state.json`, else fold `events.jsonl`."""
    data = (configmap or {}).get("data") or {}
    text = data.get(CONFIGMAP_STATE_KEY)
    if text:
        try:
            return ProgressState.from_dict(json.loads(text))
        except (TypeError, ValueError):
            pass
    return fold(parse_lines(data.get(CONFIGMAP_EVENTS_KEY, "")))


def configmap_events(configmap: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The recent training events in the ConfigMap (each has a monotonic `seq`)."""
    return parse_lines(((configmap or {}).get("data") or {}).get(CONFIGMAP_EVENTS_KEY, ""))


@dataclass(frozen=True)
class JobState:
    """What `status`, `list` and `watch` show about one job."""

    name: str
    namespace: str
    state: str
    job_status: str = ""
    deployment_status: str = ""
    reason: str = ""
    message: str = ""
    note: str | None = None
    kuberay_failed: int = 0
    created: str | None = None
    progress: ProgressState = field(default_factory=ProgressState)
    ray_cluster: str = ""
    #: The first blocking reason (`submitter.diagnose`), e.g. "Unschedulable: pod/...: 0/3 nodes..."
    diagnosis: str = ""
    #: A warning when training stopped reporting progress for far longer than its own cadence.
    stalled: str = ""
    #: When this attempt's Ray job started (KubeRay's status.rayJobInfo.startTime; not
    #: status.startTime, which includes the cluster's start-up): how long a RUNNING job has had
    #: to report progress.
    running_since: str | None = None
    #: A warning when a RUNNING job's progress ConfigMap got nothing from this attempt for long.
    no_progress: str = ""
    #: The estimate recorded with the job (naming.ESTIMATE_ANNOTATION; None: none), and the
    #: latest progress event's data wait: measured against estimated (submitter.pace, #38).
    estimate: dict | None = None
    data_wait: float | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.state, 1)

    @property
    def restarts(self) -> int:
        """Ray Train worker-group restarts plus KubeRay attempts that failed and were retried."""
        return self.progress.restarts + self.kuberay_failed

    def to_dict(self) -> dict[str, Any]:
        p = self.progress
        return {"job": self.name, "namespace": self.namespace, "state": self.state,
                "jobStatus": self.job_status, "deploymentStatus": self.deployment_status,
                "reason": self.reason, "message": self.message, "note": self.note,
                "epoch": p.epoch, "step": p.step, "loss": p.loss, "tokensPerSec": p.tokens_per_sec,
                "lastCheckpoint": p.last_checkpoint, "restarts": self.restarts,
                "created": self.created, "rayCluster": self.ray_cluster,
                "diagnosis": self.diagnosis, "stalled": self.stalled,
                "progressUnavailable": self.no_progress,
                "totalSteps": p.total_steps, "etaSeconds": _eta(p),
                "estimate": self.estimate}

    def measured(self, now: datetime) -> Any:
        """What the job measured so far (submitter.pace.Measured): wall-clock since the RayJob
        was created (start-up included: the GPUs are held then too)."""
        from submitter.pace import measured_from_state

        created = parse_time(self.created)
        elapsed = max(0.0, (now - created).total_seconds()) if created is not None else None
        return measured_from_state(self.progress, elapsed, now, self.data_wait)

    def pace_lines(self, now: datetime) -> list[str]:
        """Measured against the recorded estimate ([] without one or before any progress)."""
        from submitter.pace import comparison

        if not self.estimate or self.progress.step is None:
            return []
        return comparison(self.estimate, self.measured(now))

    @property
    def why(self) -> str:
        """The one line to show under the state: the blocking reason, else the stall warning."""
        return self.diagnosis or self.stalled or self.no_progress


def job_state(rayjob: Mapping[str, Any] | None, configmap: Mapping[str, Any] | None, *,
              name: str, namespace: str) -> JobState:
    """Merge the RayJob (None: deleted) and the progress ConfigMap into one JobState."""
    progress = progress_from_configmap(configmap)
    if rayjob is None:
        return JobState(name, namespace, "DELETED", progress=progress)
    status = rayjob.get("status") or {}
    js, ds = status.get("jobStatus", ""), status.get("jobDeploymentStatus", "")
    state, note = normalize(js, ds)
    return JobState(name=name, namespace=namespace, state=state, job_status=js,
                    deployment_status=ds, reason=status.get("reason", ""),
                    message=status.get("message", ""), note=note,
                    kuberay_failed=int(status.get("failed") or 0),
                    created=(rayjob.get("metadata") or {}).get("creationTimestamp"),
                    progress=progress, ray_cluster=status.get("rayClusterName") or "",
                    running_since=(status.get("rayJobInfo") or {}).get("startTime"),
                    estimate=estimate_of(rayjob), data_wait=_data_wait(configmap))


def estimate_of(rayjob: Mapping[str, Any] | None) -> dict | None:
    """The estimate `submit` recorded on the RayJob (compact JSON), None when absent or unreadable."""
    from submitter.contract.naming import ESTIMATE_ANNOTATION

    annotations = ((rayjob or {}).get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ESTIMATE_ANNOTATION)
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _data_wait(configmap: Mapping[str, Any] | None) -> float | None:
    """The latest progress event's share of step time spent waiting for data."""
    for event in reversed(configmap_events(configmap)):
        wait = event.get("data_wait_fraction") if event.get("type") == "progress" else None
        if isinstance(wait, (int, float)):
            return float(wait)
    return None


# --- stall detection ------------------------------------------------------------------------------

#: A run is stalled after max(STALL_FLOOR, STALL_FACTOR x its median progress interval) of silence.
STALL_FLOOR = 300.0
STALL_FACTOR = 10.0


def progress_times(events: Iterable[Mapping[str, Any]]) -> list[datetime]:
    """When each `progress` event was emitted (the pod's clock), in order."""
    times = []
    for ev in events:
        if ev.get("type") == "progress":
            when = parse_time(ev.get("time"))
            if when is not None:
                times.append(when)
    return sorted(times)


def cadence(times: list[datetime]) -> float | None:
    """The run's own step cadence: the median seconds between progress events (None: < 2)."""
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    gaps = [g for g in gaps if g >= 0]
    return statistics.median(gaps) if gaps else None


def stall_threshold(median: float | None) -> float:
    return max(STALL_FLOOR, STALL_FACTOR * (median or 0.0))


def stall_warning(idle: float, median: float | None) -> str:
    """The warning for `idle` seconds without progress, or "" while that is still normal.
    Needs a cadence (two progress events): before the first steps there is nothing to compare."""
    if median is None or idle <= stall_threshold(median):
        return ""
    return (f"stalled? no training progress for {duration(idle)} (the run reported every "
            f"~{duration(median)}); check submitter logs and the pods")


def stalled(state: "JobState", events: Iterable[Mapping[str, Any]], now: datetime) -> str:
    """`status`'s stall check: a RUNNING job whose last progress event is too old."""
    if state.state != "RUNNING":
        return ""
    times = progress_times(events)
    if not times:
        return ""
    return stall_warning((now - times[-1]).total_seconds(), cadence(times))


#: A RUNNING attempt whose progress ConfigMap got no event for this long has a sink that cannot
#: write: the driver emits run_started within a minute or two of the Ray job starting.
PROGRESS_GRACE = 300.0


def progress_unavailable(state: "JobState", events: Iterable[Mapping[str, Any]], now: datetime,
                         configmap: str) -> str:
    """`status`'s check that progress reaches the cluster at all: a job RUNNING for longer than
    PROGRESS_GRACE whose ConfigMap holds no event from this attempt. The sink in the pod says
    why in the job's log (a line starting "progress unavailable:"); this names the likely causes."""
    if state.state != "RUNNING":
        return ""
    since = parse_time(state.running_since)
    if since is None or (now - since).total_seconds() < PROGRESS_GRACE:
        return ""
    times = [t for t in (parse_time(e.get("time")) for e in events) if t is not None]
    if any(t >= since for t in times):
        return ""
    return (f"progress unavailable: running for {duration((now - since).total_seconds())} and "
            f"configmap/{configmap} got no event from this run; the driver cannot write it (the "
            "head pod lacks the service-account token, the Role lacks get/patch on it, or the pod "
            "cannot reach the API server): submitter logs shows the reason (a line starting "
            "\"progress unavailable:\")")


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)




# --- the table --------------------------------------------------------------------------------

COLUMNS = ("JOB", "STATE", "JOBSTATUS", "DEPLOYMENT", "EPOCH", "STEP", "LOSS", "TOKENS/S",
           "LAST CHECKPOINT", "RESTARTS", "AGE")


def row(s: JobState, now: datetime) -> tuple[str, ...]:
    p = s.progress
    return (s.name, s.state, s.job_status or "-", s.deployment_status or "-", _int(p.epoch),
            _int(p.step), "-" if p.loss is None else f"{p.loss:.4f}",
            "-" if p.tokens_per_sec is None else f"{p.tokens_per_sec:,.0f}",
            p.last_checkpoint or "-", str(s.restarts), age(s.created, now))


#: `list -o wide` adds these.
WIDE_COLUMNS = ("RAY CLUSTER", "REASON")


def table(states: list[JobState], now: datetime, *, namespaces: bool = False,
          wide: bool = False) -> list[tuple[str, ...]]:
    """The header and one row per job; NAMESPACE first with `-A` (as kubectl)."""
    header = (("NAMESPACE",) if namespaces else ()) + COLUMNS + (WIDE_COLUMNS if wide else ())
    rows = [header]
    for s in states:
        cells = row(s, now)
        if namespaces:
            cells = (s.namespace,) + cells
        if wide:
            cells += (s.ray_cluster or "-", " ".join(x for x in (s.reason, s.message) if x) or "-")
        rows.append(cells)
    return rows


def age(created: str | None, now: datetime) -> str:
    """kubectl-style age: 45s, 12m, 3h, 5d."""
    if not created:
        return "-"
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def join(rayjobs: list[Mapping[str, Any]], configmaps: list[Mapping[str, Any]],
         progress_name: Callable[[str], str]) -> list[JobState]:
    """Pair each RayJob with its progress ConfigMap (named by `progress_name(job)`)."""
    by_key = {((c.get("metadata") or {}).get("namespace"), (c.get("metadata") or {}).get("name")): c
              for c in configmaps}
    states = []
    for rj in rayjobs:
        meta = rj.get("metadata") or {}
        cm = by_key.get((meta.get("namespace"), progress_name(meta.get("name", ""))))
        states.append(job_state(rj, cm, name=meta.get("name", ""), namespace=meta.get("namespace", "")))
    return sorted(states, key=lambda s: (s.namespace, s.name))


def _eta(progress: ProgressState) -> int | None:
    """Seconds to the last step at the run's step cadence, from now (None: unknown)."""
    from submitter.contract.events import eta_seconds

    left = eta_seconds(progress, utcnow())
    return None if left is None else int(round(left))


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _int(value: Any) -> str:
    return "-" if value is None else str(value)
