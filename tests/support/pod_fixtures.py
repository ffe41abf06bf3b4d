"""Pods, events, claims and RayClusters as the cluster reports them, for diagnosis tests.

The shapes and words are Kubernetes' and KubeRay's own (kubelet container waiting reasons, the
scheduler's PodScheduled=False/Unschedulable condition and FailedScheduling event, the
DisruptionTarget condition of Kubernetes >= 1.26, KubeRay 1.7's `ray.io/cluster` and
`ray.io/node-type` pod labels and its RayCluster condition types), so the pure tests of
`submitter.diagnose` and the emulator tests share one vocabulary.
"""

from __future__ import annotations

from typing import Any

from submitter.contract import naming

IMAGE = "registry.example.com/submitter-gpt2:0.1.0"
GPU_MESSAGE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
PVC_MESSAGE = "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."


def pod(job: str, node_type: str = "head", *, cluster: str | None = None, suffix: str = "abcde",
        phase: str = "Pending", containers: list[dict] | None = None, conditions: list[dict] | None = None,
        reason: str | None = None, message: str | None = None, claim: str | None = None,
        namespace: str = "default") -> dict:
    """A head/worker pod of the job's RayCluster, or (node_type "submitter") its submitter pod."""
    labels = dict(naming.labels(job))
    if node_type == "submitter":
        labels.update({"batch.kubernetes.io/job-name": job, "job-name": job})
        name = f"{job}-{suffix}"
    else:
        cluster = cluster or f"{job}-raycluster-abcde"
        labels.update({"ray.io/cluster": cluster, "ray.io/node-type": node_type,
                       "ray.io/is-ray-node": "yes"})
        name = f"{cluster}-{'head' if node_type == 'head' else 'workers-worker'}-{suffix}"
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if containers is not None:
        status["containerStatuses"] = containers
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    volumes = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}}] if claim else []
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"volumes": volumes, "containers": [{"name": "ray-head", "image": IMAGE}]},
            "status": status}


def waiting(reason: str, message: str = "", *, name: str = "ray-head", restarts: int = 0,
            last: dict | None = None) -> dict:
    cs = {"name": name, "image": IMAGE, "ready": False, "restartCount": restarts,
          "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}
    if last:
        cs["lastState"] = {"terminated": last}
    return cs


def running(name: str = "ray-head", restarts: int = 0, last: dict | None = None) -> dict:
    cs = {"name": name, "image": IMAGE, "ready": True, "restartCount": restarts,
          "state": {"running": {"startedAt": "2026-11-22T01:00:00Z"}}}
    if last:
        cs["lastState"] = {"terminated": last}
    return cs


def unschedulable(message: str = GPU_MESSAGE) -> list[dict]:
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]


def scheduled() -> list[dict]:
    return [{"type": "PodScheduled", "status": "True"}]


def event(obj: dict, reason: str, message: str, *, type: str = "Warning", n: int = 1,
          time: str = "2026-11-22T01:00:00Z") -> dict:
    meta = obj["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{reason.lower()}{n}", "namespace": meta.get("namespace", "default")},
            "involvedObject": {"kind": obj.get("kind", "Pod"), "name": meta["name"],
                               "namespace": meta.get("namespace", "default")},
            "reason": reason, "message": message, "type": type, "count": n,
            "lastTimestamp": time}


def pvc(name: str, phase: str = "Pending", storage_class: str = "nfs", namespace: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": storage_class,
                     "resources": {"requests": {"storage": "100Gi"}}},
            "status": {"phase": phase}}


def raycluster(name: str, conditions: list[dict], namespace: str = "default") -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {}, "status": {"conditions": conditions}}


def replica_failure(message: str = 'pods "x-head-abcde" is forbidden: exceeded quota: gpu-quota, '
                                   "requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, "
                                   "limited: requests.nvidia.com/gpu=8") -> list[dict]:
    return [{"type": "RayClusterReplicaFailure", "status": "True", "reason": "FailedCreateHeadPod",
             "message": message},
            {"type": "HeadPodReady", "status": "False", "reason": "HeadPodNotFound", "message": "Head Pod not found"}]
