"""Kueue for the API emulator: its Workload kind, its RayJob webhook rule, and a controller that
acts as Kueue's does on the objects (called step by step by a test, so nothing races).

What it does, after Kueue v0.13+ (pkg/controller/jobframework/reconciler.go, jobs/rayjob):
- a RayJob with the `kueue.x-k8s.io/queue-name` label gets a Workload `rayjob-<name>-<hash>`
  with the `kueue.x-k8s.io/job-uid` label and an ownerReference to the RayJob;
- an active Workload is admitted (status.admission, conditions QuotaReserved and Admitted), and
  the job started: `suspend: false`, the ResourceFlavor's nodeSelector and tolerations merged
  into every pod template;
- a job that is suspended while its Workload is still admitted and active is started again
  (why `submitter stop` must deactivate the Workload);
- an inactive Workload (`spec.active: false`) is evicted: admission cleared, the job suspended;
- the webhook refuses a queued RayJob with `enableInTreeAutoscaling` unless it carries
  `kueue.x-k8s.io/elastic-job: "true"` (and the ElasticJobsViaWorkloadSlices gate is on).
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import kmock

from tests.support.kube_emulator import RAYJOBS, ApiEmulator

WORKLOADS = "kueue.x-k8s.io/v1beta1/workloads"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
#: What the test ResourceFlavor puts on an admitted job's pods.
FLAVOR_NODE_SELECTOR = {"cloud.google.com/gke-nodepool": "gpu-pool"}
FLAVOR_TOLERATION = {"key": "reserved-for", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
WEBHOOK_MESSAGE = "a kueue managed job should only use autoscaling when workload slicing is enabled"


def install_workloads(emulator: ApiEmulator) -> None:
    """Serve kueue.x-k8s.io/v1beta1 workloads (discovery, list, get, patch)."""
    emulator.resources[WORKLOADS] = kmock.ResourceInfo(
        kind="Workload", singular="workload", namespaced=True, subresources={"status"},
        verbs={"get", "list", "watch", "create", "patch", "update", "delete"})


def workload_name(job: str, uid: str) -> str:
    """Kueue's pattern: `<kind>-<owner name>-<5 hex of a hash>` (GetWorkloadNameForOwnerWithGVK)."""
    return f"rayjob-{job}-{hashlib.sha256((job + uid).encode()).hexdigest()[:5]}"


def pod_templates(rayjob: dict) -> list[dict]:
    spec = rayjob.get("spec") or {}
    cluster = spec.get("rayClusterSpec") or {}
    out = [(cluster.get("headGroupSpec") or {}).get("template")]
    out += [g.get("template") for g in cluster.get("workerGroupSpecs") or []]
    out.append(spec.get("submitterPodTemplate"))
    return [t for t in out if t]


class FakeKueue:
    """Kueue's job reconciler and scheduler for queued RayJobs in one emulator."""

    def __init__(self, emulator: ApiEmulator, *, elastic_gate: bool = True) -> None:
        self.emulator = emulator
        self.elastic_gate = elastic_gate
        install_workloads(emulator)
        emulator.validate("rayjobs", self.webhook)

    def webhook(self, rayjob: dict) -> list[str]:
        """Kueue's RayJob validating webhook, the rule that matters here."""
        meta = rayjob.get("metadata") or {}
        if QUEUE_LABEL not in (meta.get("labels") or {}):
            return []
        cluster = (rayjob.get("spec") or {}).get("rayClusterSpec") or {}
        sliced = self.elastic_gate and (meta.get("annotations") or {}).get(ELASTIC_ANNOTATION) == "true"
        if cluster.get("enableInTreeAutoscaling") and not sliced:
            return [f"spec.rayClusterSpec.enableInTreeAutoscaling: Invalid value: true: {WEBHOOK_MESSAGE}"]
        return []

    def workloads(self, namespace: str, job_uid: str) -> list[dict]:
        with self.emulator._tlock:
            return [copy.deepcopy(o) for (gvr, ns, _), o in sorted(self.emulator.store.items())
                    if gvr == WORKLOADS and ns == namespace
                    and (o["metadata"].get("labels") or {}).get(JOB_UID_LABEL) == job_uid]

    def reconcile(self) -> None:
        """One pass over every queued RayJob, as Kueue's controllers would make it."""
        with self.emulator._tlock:
            jobs = [copy.deepcopy(o) for (gvr, _, _), o in sorted(self.emulator.store.items())
                    if gvr == RAYJOBS and QUEUE_LABEL in (o["metadata"].get("labels") or {})]
        for job in jobs:
            self._reconcile(job)

    def _reconcile(self, job: dict) -> None:
        meta = job["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        found = self.workloads(namespace, uid)
        if not found:
            workload = self.emulator.put("kueue.x-k8s.io/v1beta1", "workloads", {
                "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                "metadata": {"name": workload_name(name, uid), "namespace": namespace,
                             "labels": {JOB_UID_LABEL: uid, QUEUE_LABEL: meta["labels"][QUEUE_LABEL]},
                             "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": name,
                                                  "uid": uid, "controller": True}]},
                "spec": {"active": True, "queueName": meta["labels"][QUEUE_LABEL],
                         "podSets": [{"name": "head", "count": 1}]}})
            found = [workload]
        workload = found[-1]
        wmeta = workload["metadata"]
        active = (workload.get("spec") or {}).get("active", True)
        admitted = bool((workload.get("status") or {}).get("admission"))
        suspended = bool((job.get("spec") or {}).get("suspend"))
        if active and not admitted:
            self.emulator.merge(WORKLOADS, namespace, wmeta["name"], {"status": {
                "admission": {"clusterQueue": "cluster-queue"},
                "conditions": [{"type": "QuotaReserved", "status": "True"},
                               {"type": "Admitted", "status": "True"}]}})
            admitted = True
        if active and admitted and suspended:
            self._start(job)
        elif not active and admitted:
            self.emulator.merge(WORKLOADS, namespace, wmeta["name"], {"status": {
                "admission": None, "conditions": [{"type": "Evicted", "status": "True",
                                                   "reason": "InactiveWorkload"}]}})
            if not suspended:
                self.emulator.merge(RAYJOBS, namespace, name, {"spec": {"suspend": True}})

    def _start(self, job: dict) -> None:
        """Unsuspend, with the flavor's nodeSelector and tolerations merged into the pod templates."""
        job = copy.deepcopy(job)
        job["spec"]["suspend"] = False
        for template in pod_templates(job):
            spec = template.setdefault("spec", {})
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **FLAVOR_NODE_SELECTOR}
            tolerations = spec.get("tolerations") or []
            if FLAVOR_TOLERATION not in tolerations:
                spec["tolerations"] = tolerations + [FLAVOR_TOLERATION]
        meta = job["metadata"]
        self.emulator.merge(RAYJOBS, meta["namespace"], meta["name"], {"spec": job["spec"]})


def kueue(emulator: ApiEmulator, **kwargs: Any) -> FakeKueue:
    return FakeKueue(emulator, **kwargs)
