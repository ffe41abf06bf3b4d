"""Reads what a diagnosis needs (pods, their events, claims, the RayCluster) and asks
`submitter.diagnose` for the first blocking reason. The I/O half of diagnosis.

Why a class with caches: `watch` re-diagnoses on every pod or RayJob change, and must stay
within a few API requests per minute while nothing changes. Events and claims are read only for
pods that are not running and do not explain themselves, and again only when such a pod changes
(its resourceVersion); the RayCluster (whose conditions matter when KubeRay cannot even create
pods, e.g. a quota) is read only while the job is starting and at most once per `cluster_every`
seconds (60: at most one request a minute while nothing changes).
Every read is optional: RBAC that forbids it (or an object that is gone) leaves that part out.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from submitter.contract.errors import ClusterError
from submitter.contract.naming import JOB_LABEL
from submitter.diagnose import CLUSTER_LABEL, diagnose, job_pods, needs_events, pending_claims
from submitter.kube import Kube
from submitter.contract.naming import object_names
from submitter.state import JobState, configmap_events, progress_unavailable, stalled, utcnow

#: States in which a missing pod or a RayCluster condition can be what holds the job.
STARTING_STATES = frozenset({"PENDING", "STARTING", "RETRYING", "UNKNOWN"})
#: Read the events of at most this many troubled pods per diagnosis (head first).
MAX_EVENT_READS = 2


def pod_selector(name: str) -> str:
    """Every pod of the job carries the job label (the RayJob's head, worker and submitter pod
    templates set it); which of them belong to the current attempt is decided by KubeRay's labels."""
    return f"{JOB_LABEL}={name}"


class Observer:
    def __init__(self, kube: Kube, namespace: str, name: str, *,
                 clock: Callable[[], float] = time.monotonic, cluster_every: float = 60.0) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.clock, self.cluster_every = clock, cluster_every
        self._events: dict[str, tuple[str, list[dict]]] = {}   # "Pod/x" -> (pod rv, events)
        self._claims: dict[str, tuple[str, dict | None, list[dict]]] = {}  # claim -> (pods rv, pvc, events)
        self._cluster: tuple[float, str, dict | None] | None = None  # (read at, name, object)

    def pods(self, ray_cluster: str) -> list[dict]:
        """List the job's pods (one request; `status` only, `watch` has them from its stream)."""
        pods = self._read(lambda: self.kube.list_pods(self.namespace, pod_selector(self.name))) or []
        if not pods and ray_cluster:  # a RayJob made without our pod labels: KubeRay's label
            pods = self._read(lambda: self.kube.list_pods(self.namespace, f"{CLUSTER_LABEL}={ray_cluster}")) or []
        return pods

    def diagnosis(self, pods: list[dict], state: JobState) -> str:
        if state.state in ("SUCCEEDED", "DELETED"):
            return ""
        mine = job_pods(pods, self.name, state.ray_cluster or None)
        events: dict[str, list[dict]] = {}
        troubled = [p for p in mine if needs_events(p)][:MAX_EVENT_READS]
        for pod in troubled:
            meta = pod["metadata"]
            key, rv = f"Pod/{meta['name']}", meta.get("resourceVersion", "")
            cached = self._events.get(key)
            if cached is None or cached[0] != rv:
                cached = (rv, self._read(lambda: self.kube.events_for(self.namespace, "Pod", meta["name"])) or [])
                self._events[key] = cached
            events[key] = cached[1]
        pvcs: dict[str, dict] = {}
        version = ",".join(p["metadata"].get("resourceVersion", "") for p in troubled)
        for claim in pending_claims(mine):
            cached_claim = self._claims.get(claim)
            if cached_claim is None or cached_claim[0] != version:
                pvc = self._read(lambda: self.kube.find("PersistentVolumeClaim", self.namespace, claim))
                said = self._read(lambda: self.kube.events_for(self.namespace, "PersistentVolumeClaim", claim)) \
                    if pvc is not None and (pvc.get("status") or {}).get("phase") != "Bound" else []
                cached_claim = (version, pvc, said or [])
                self._claims[claim] = cached_claim
            if cached_claim[1] is not None:
                pvcs[claim] = cached_claim[1]
                events[f"PersistentVolumeClaim/{claim}"] = cached_claim[2]
        raycluster = self._raycluster(state, mine)
        finding = diagnose(mine, name=self.name, ray_cluster=state.ray_cluster or None, events=events,
                           raycluster=raycluster, pvcs=pvcs)
        return finding.line() if finding else ""

    def _raycluster(self, state: JobState, mine: list[dict]) -> dict | None:
        if not state.ray_cluster or state.state not in STARTING_STATES:
            return None
        now = self.clock()
        if self._cluster is not None and self._cluster[1] == state.ray_cluster and \
                now - self._cluster[0] < self.cluster_every:
            return self._cluster[2]
        found = self._read(lambda: self.kube.get_raycluster(self.namespace, state.ray_cluster))
        self._cluster = (now, state.ray_cluster, found)
        return found

    @staticmethod
    def _read(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ClusterError:  # forbidden, gone, unreachable: diagnosis is best effort
            return None


def explain(kube: Kube, state: JobState, configmap: dict | None) -> JobState:
    """`submitter status`: the job's state with its blocking reason and a stall warning (one
    pod list, plus events/claims/the RayCluster only when a pod or KubeRay shows a problem)."""
    import dataclasses

    observer = Observer(kube, state.namespace, state.name)
    diagnosis = "" if state.terminal and state.state != "FAILED" else \
        observer.diagnosis(observer.pods(state.ray_cluster), state)
    events = configmap_events(configmap)
    return dataclasses.replace(state, diagnosis=diagnosis,
                               stalled=stalled(state, events, utcnow()),
                               no_progress=progress_unavailable(
                                   state, events, utcnow(),
                                   object_names(state.name)["progress"]))
