"""Why a job is stuck: its pods, their events and the RayCluster's conditions -> the first
blocking reason, as one line. Pure functions over API objects (plain dicts).

Why: KubeRay reports a job that cannot start as `Initializing` forever (ray-project/kuberay
#1990, #2387): the reason is on the pods (an image that cannot be pulled, a scheduler message
such as `0/3 nodes are available: 3 Insufficient nvidia.com/gpu`, a container OOMKilled or in
CrashLoopBackOff, an evicted or preempted pod), on a PersistentVolumeClaim that is not bound, or
on the RayCluster (`RayClusterReplicaFailure`: KubeRay could not even create the pods, e.g. a
quota). `status` and `watch` show the first of these so nobody has to run five kubectl commands.

Which pods belong to the job is decided with KubeRay's own labels (KubeRay 1.7,
ray-operator/controllers/ray/utils/constant.go): `ray.io/cluster=<RayCluster name>` on the head
and workers, `ray.io/node-type` head|worker, and the Job controller's
`batch.kubernetes.io/job-name` (before Kubernetes 1.27 only `job-name`) on the submitter pod,
whose Job KubeRay names after the RayJob. Pods of an older RayCluster of the same RayJob (a
retried attempt) are not the job's any more and are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")

IMAGE_PULL = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
#: Container waiting reasons that block a pod for good (until someone fixes the spec).
CONFIG_ERRORS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
#: DisruptionTarget condition reasons (Kubernetes 1.26+) and what we call them.
DISRUPTIONS = {"PreemptionByScheduler": "Preempted", "PreemptionByKubeScheduler": "Preempted",
               "TerminationByKubelet": "Evicted", "EvictionByEvictionAPI": "Evicted",
               "DeletionByTaintManager": "Evicted", "DeletionByPodGC": "Evicted"}
#: Event reasons that explain a pod on their own, in the order we trust them.
POD_EVENT_REASONS = ("FailedScheduling", "FailedMount", "FailedAttachVolume", "Preempted",
                     "Evicted", "Failed", "FailedCreatePodSandBox")
#: A scheduler message with this text means a PVC, not the nodes, is the problem.
UNBOUND_PVC = "unbound immediate PersistentVolumeClaims"


@dataclass(frozen=True)
class Finding:
    """One blocking reason: a short word, the object it is about, and the cluster's own words."""

    reason: str
    obj: str
    message: str

    def line(self) -> str:
        return f"{self.reason}: {self.obj}: {self.message}" if self.message else f"{self.reason}: {self.obj}"


# --- which pods ---------------------------------------------------------------------------------

def job_pods(pods: Iterable[Mapping[str, Any]], name: str, ray_cluster: str | None) -> list[dict]:
    """The pods of this attempt of the job, head first, then workers, then the submitter pod."""
    mine = []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if ray_cluster and labels.get(CLUSTER_LABEL) == ray_cluster:
            mine.append(pod)
        elif any(labels.get(key) == name for key in JOB_NAME_LABELS) and CLUSTER_LABEL not in labels:
            mine.append(pod)
    return sorted(mine, key=_pod_order)


def _pod_order(pod: Mapping[str, Any]) -> tuple[int, str]:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    rank = {"head": 0, "worker": 1}.get(labels.get(NODE_TYPE_LABEL, ""), 2)
    return rank, (pod.get("metadata") or {}).get("name", "")


def pod_claims(pod: Mapping[str, Any]) -> list[str]:
    """The PersistentVolumeClaims a pod mounts."""
    return [v["persistentVolumeClaim"]["claimName"] for v in (pod.get("spec") or {}).get("volumes") or []
            if (v.get("persistentVolumeClaim") or {}).get("claimName")]


# --- one object -----------------------------------------------------------------------------------

def pod_problem(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> Finding | None:
    """What keeps this pod from running, or None when it is fine (or still starting normally)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ref = f"pod/{meta.get('name', '?')}"
    if status.get("reason") == "Evicted":
        return Finding("Evicted", ref, status.get("message", ""))
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            word = DISRUPTIONS.get(cond.get("reason", ""), "Evicted")
            return Finding(word, ref, cond.get("message") or cond.get("reason", ""))
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for cs in containers:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL:
            detail = waiting.get("message") or ""
            return Finding(waiting["reason"], ref, f"image {cs.get('image', '?')} cannot be pulled"
                           + (f": {detail}" if detail else ""))
        if waiting.get("reason") in CONFIG_ERRORS:
            return Finding(waiting["reason"], ref, f"container {cs.get('name')}: {waiting.get('message', '')}")
    for cs in containers:
        for when in ("state", "lastState"):
            terminated = (cs.get(when) or {}).get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                return Finding("OOMKilled", ref, f"container {cs.get('name')} ran out of memory (exit code "
                               f"{terminated.get('exitCode', 137)}, restarts {cs.get('restartCount', 0)}); "
                               "give the pods more memory or use smaller batches")
    for cs in containers:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff":
            last = ((cs.get("lastState") or {}).get("terminated") or {})
            exit_text = f" (last exit code {last['exitCode']}{', ' + last['reason'] if last.get('reason') else ''})" \
                if "exitCode" in last else ""
            return Finding("CrashLoopBackOff", ref, f"container {cs.get('name')} keeps crashing{exit_text}, "
                           f"restarts {cs.get('restartCount', 0)}: submitter logs or kubectl logs "
                           f"{meta.get('name', '')} --previous")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and \
                cond.get("reason") == "Unschedulable":
            return Finding("Unschedulable", ref, cond.get("message", ""))
    latest: dict[str, Mapping[str, Any]] = {}
    for ev in events:  # newest last wins per reason
        if ev.get("type") == "Warning" and ev.get("reason") in POD_EVENT_REASONS:
            latest[ev["reason"]] = ev
    for reason in POD_EVENT_REASONS:
        if reason in latest:
            word = {"FailedScheduling": "Unschedulable", "Failed": "FailedToStart"}.get(reason, reason)
            return Finding(word, ref, latest[reason].get("message") or latest[reason].get("note", ""))
    return None


def pvc_problem(pvc: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> Finding | None:
    """A claim that is not Bound blocks every pod that mounts it."""
    meta, status = pvc.get("metadata") or {}, pvc.get("status") or {}
    phase = status.get("phase", "Pending")
    if phase == "Bound":
        return None
    warnings = [ev for ev in events if ev.get("type") == "Warning"]
    said = (warnings[-1].get("message") if warnings else "") or ""
    spec = pvc.get("spec") or {}
    cls = spec.get("storageClassName")
    hint = said or (f"no volume of StorageClass {cls!r} is available for "
                    f"{', '.join(spec.get('accessModes') or [])}" if cls else
                    "no StorageClass given and no matching PersistentVolume")
    return Finding("PVCNotBound", f"pvc/{meta.get('name', '?')}", f"{phase}: {hint}")


def cluster_problem(raycluster: Mapping[str, Any] | None) -> Finding | None:
    """KubeRay's own word (RayCluster status conditions, KubeRay >= 1.2)."""
    if not raycluster:
        return None
    ref = f"raycluster/{(raycluster.get('metadata') or {}).get('name', '?')}"
    conditions = (raycluster.get("status") or {}).get("conditions") or []
    for cond in conditions:
        if cond.get("type") == "RayClusterReplicaFailure" and cond.get("status") == "True":
            return Finding(cond.get("reason") or "ReplicaFailure", ref, cond.get("message", ""))
    for cond in conditions:
        if cond.get("type") == "HeadPodReady" and cond.get("status") == "False" and \
                cond.get("reason") not in (None, "", "RayClusterPodsProvisioning", "HeadPodNotFound"):
            return Finding(cond["reason"], ref, cond.get("message", ""))
    return None


# --- the job ------------------------------------------------------------------------------------

def diagnose(pods: Iterable[Mapping[str, Any]], *, name: str, ray_cluster: str | None,
             events: Mapping[str, list[Mapping[str, Any]]] | None = None,
             raycluster: Mapping[str, Any] | None = None,
             pvcs: Mapping[str, Mapping[str, Any]] | None = None) -> Finding | None:
    """The first blocking reason of the job, or None.

    `events` maps "Pod/NAME" and "PersistentVolumeClaim/NAME" to that object's events; `pvcs`
    maps claim names to the claims the pods mount. Order: KubeRay could not create pods; a
    claim is not bound (the scheduler's message only says "unbound"); then each pod, head
    first: its own state, then its events."""
    events = events or {}
    found = cluster_problem(raycluster)
    if found and found.reason.startswith("Failed"):
        return found
    mine = job_pods(pods, name, ray_cluster)
    for pod in mine:
        for claim in pod_claims(pod):
            pvc = (pvcs or {}).get(claim)
            if pvc is not None:
                problem = pvc_problem(pvc, events.get(f"PersistentVolumeClaim/{claim}", ()))
                if problem:
                    return problem
    for pod in mine:
        pod_name = (pod.get("metadata") or {}).get("name", "")
        problem = pod_problem(pod, events.get(f"Pod/{pod_name}", ()))
        if problem:
            return problem
    return found


def needs_events(pod: Mapping[str, Any]) -> bool:
    """Whether this pod's events could say more than the pod does: it is not running and its
    status does not explain why (a FailedMount, a preemption, a scheduler retry)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded"):
        return False
    return pod_problem(pod) is None or status.get("phase") == "Pending"


def pending_claims(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Claims of pods that are not scheduled yet (only then can a claim be what blocks them)."""
    names: list[str] = []
    for pod in pods:
        status = pod.get("status") or {}
        scheduled = any(c.get("type") == "PodScheduled" and c.get("status") == "True"
                        for c in status.get("conditions") or [])
        if status.get("phase", "Pending") == "Pending" and not scheduled:
            names += [c for c in pod_claims(pod) if c not in names]
    return names
