"""A fake KubeRay operator and training entrypoint for the API emulator.

It writes what the real ones write, with KubeRay v1.7's own values (ray-operator/apis/ray/v1/
rayjob_types.go): `jobDeploymentStatus` "" -> Initializing -> Running -> Complete | Failed |
Retrying, `jobStatus` "" -> PENDING -> RUNNING -> SUCCEEDED | FAILED | STOPPED, failure reasons
SubmissionFailed / DeadlineExceeded / AppFailed, and the inconsistent pair users report (the
deployment Failed while jobStatus still says RUNNING). Progress goes into the job's ConfigMap
exactly as the training entrypoint's ConfigMap sink writes it (`state.json` + `events.jsonl`,
built with `submitter.contract.events`), and the submitter Job's pod gets a log.
"""

from __future__ import annotations

import json

from tests.support.kube_emulator import RAYJOBS, ApiEmulator
from submitter.contract.events import ProgressState, apply, make_event, to_json, to_stdout_line
from submitter.contract.naming import CONFIGMAP_EVENTS_KEY, CONFIGMAP_MAX_EVENTS, CONFIGMAP_STATE_KEY

CONFIGMAPS = "v1/configmaps"


class FakeOperator:
    def __init__(self, emulator: ApiEmulator, name: str, namespace: str = "default") -> None:
        self.emu, self.name, self.namespace = emulator, name, namespace
        self.seq = 0
        self.events: list[dict] = []
        self.progress = ProgressState()

    # --- KubeRay ------------------------------------------------------------------------------
    def set(self, deployment: str, job: str = "", **extra: object) -> dict:
        status = {"jobDeploymentStatus": deployment, "jobStatus": job, **extra}
        return self.emu.patch_status(RAYJOBS, self.namespace, self.name, status)

    def initialize(self) -> None:
        self.set("Initializing", "", rayClusterName=f"{self.name}-raycluster-abcde",
                 startTime="2026-11-22T01:00:00Z")

    def run(self) -> None:
        self.set("Running", "PENDING", jobId=f"{self.name}-xyz")
        self.set("Running", "RUNNING")

    def succeed(self) -> None:
        self.set("Running", "SUCCEEDED")
        self.set("Complete", "SUCCEEDED", endTime="2026-11-22T02:00:00Z", succeeded=1)

    def fail(self, reason: str = "AppFailed", message: str = "Job entrypoint command failed with exit code 1") -> None:
        self.set("Running", "FAILED")
        self.set("Failed", "FAILED", reason=reason, message=message, failed=1)

    def stop(self) -> None:
        self.set("Complete", "STOPPED", endTime="2026-11-22T02:00:00Z")

    def deadline_exceeded_while_running(self) -> None:
        """The inconsistent status: KubeRay gave up, Ray's last word was RUNNING."""
        self.set("Failed", "RUNNING", reason="DeadlineExceeded",
                 message="The RayJob has passed the activeDeadlineSeconds. DeletionTimestamp is set.")

    # --- the training entrypoint's ConfigMap sink ----------------------------------------------
    def emit(self, type: str, **fields: object) -> dict:
        self.seq += 1
        event = make_event(type, seq=self.seq, **fields)
        self.events.append(event)
        self.progress = apply(self.progress, event)
        data = {CONFIGMAP_STATE_KEY: json.dumps(self.progress.to_dict()),
                CONFIGMAP_EVENTS_KEY: "\n".join(to_json(e) for e in self.events[-CONFIGMAP_MAX_EVENTS:]) + "\n"}
        self.emu.merge(CONFIGMAPS, self.namespace, f"{self.name}-progress", {"data": data})
        return event

    def step(self, epoch: int, step: int, loss: float = 3.5, tokens_per_sec: float = 40000.0) -> dict:
        return self.emit("progress", epoch=epoch, step=step, loss=loss, tokens_per_sec=tokens_per_sec, lr=6e-4)

    # --- the submitter Job's pod -----------------------------------------------------------------
    def submitter_pod(self, lines: list[str], suffix: str = "x7k2p", *, legacy_labels: bool = False) -> str:
        """A pod of the submitter Job (labelled as the Job controller does; before Kubernetes
        1.27 only with `job-name`)."""
        pod = f"{self.name}-{suffix}"
        labels = {"job-name": self.name} if legacy_labels else \
            {"batch.kubernetes.io/job-name": self.name, "job-name": self.name}
        self.emu.put("v1", "pods", {"metadata": {"name": pod, "namespace": self.namespace, "labels": labels}})
        self.emu.pod_logs[(self.namespace, pod)] = list(lines)
        return pod

    def driver_lines(self) -> list[str]:
        return ["2026-11-22 01:00:00,000 INFO -- Job submitted", *(to_stdout_line(e) for e in self.events)]


# --- the cluster around the job: pods, events, claims, the RayCluster ---------------------------
# (shapes from tests/support/pod_fixtures.py; what the kubelet, the scheduler and KubeRay write)

class FakeCluster:
    """Puts the job's pods, their events, claims and the RayCluster into the emulator."""

    def __init__(self, emulator: ApiEmulator, name: str, namespace: str = "default") -> None:
        self.emu, self.name, self.namespace = emulator, name, namespace
        self.ray_cluster = f"{name}-raycluster-abcde"  # FakeOperator.initialize()'s rayClusterName
        self._events = 0

    def pod(self, node_type: str = "head", **kwargs: object) -> dict:
        from tests.support import pod_fixtures

        obj = pod_fixtures.pod(self.name, node_type, namespace=self.namespace, **kwargs)  # type: ignore[arg-type]
        return self.emu.put("v1", "pods", obj)

    def remove_pod(self, pod: dict) -> None:
        self.emu.remove("v1/pods", self.namespace, pod["metadata"]["name"])

    def event(self, obj: dict, reason: str, message: str, **kwargs: object) -> dict:
        from tests.support import pod_fixtures

        self._events += 1
        return self.emu.put("v1", "events", pod_fixtures.event(obj, reason, message, n=self._events, **kwargs))  # type: ignore[arg-type]

    def pvc(self, name: str, phase: str = "Pending", **kwargs: object) -> dict:
        from tests.support import pod_fixtures

        return self.emu.put("v1", "persistentvolumeclaims",
                            pod_fixtures.pvc(name, phase, namespace=self.namespace, **kwargs))  # type: ignore[arg-type]

    def raycluster(self, conditions: list[dict]) -> dict:
        from tests.support import pod_fixtures

        return self.emu.put("ray.io/v1", "rayclusters",
                            pod_fixtures.raycluster(self.ray_cluster, conditions, namespace=self.namespace))
