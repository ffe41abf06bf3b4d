"""The first blocking reason of a job from its pods, events, claims and RayCluster (pure)."""

from __future__ import annotations

import pytest

from submitter.diagnose import diagnose, job_pods, needs_events, pending_claims
from tests.support.pod_fixtures import (
    GPU_MESSAGE, IMAGE, PVC_MESSAGE, event, pod, pvc, raycluster, replica_failure, running, scheduled,
    unschedulable, waiting,
)

JOB = "gpt2-demo"
RC = f"{JOB}-raycluster-abcde"
HEAD = f"{RC}-head-abcde"
WORKER = f"{RC}-workers-worker-abcde"

OOM = {"reason": "OOMKilled", "exitCode": 137}
PULL_MSG = f'Back-off pulling image "{IMAGE}"'


def _run(pods, events=None, cluster=None, pvcs=None):
    found = diagnose(pods, name=JOB, ray_cluster=RC, events=events, raycluster=cluster, pvcs=pvcs)
    return found.line() if found else None


CASES = [
    ("healthy", [pod(JOB, phase="Running", containers=[running()], conditions=scheduled())], {}, None, None,
     None),
    ("image pull backoff with the image",
     [pod(JOB, containers=[waiting("ImagePullBackOff", PULL_MSG)], conditions=scheduled())], {}, None, None,
     f"ImagePullBackOff: pod/{HEAD}: image {IMAGE} cannot be pulled: {PULL_MSG}"),
    ("err image pull",
     [pod(JOB, containers=[waiting("ErrImagePull", "manifest unknown")], conditions=scheduled())], {}, None, None,
     f"ErrImagePull: pod/{HEAD}: image {IMAGE} cannot be pulled: manifest unknown"),
    ("unschedulable with the scheduler's message", [pod(JOB, conditions=unschedulable())], {}, None, None,
     f"Unschedulable: pod/{HEAD}: {GPU_MESSAGE}"),
    ("unschedulable only in an event",
     [pod(JOB)], {f"Pod/{HEAD}": [event(pod(JOB), "FailedScheduling", GPU_MESSAGE)]}, None, None,
     f"Unschedulable: pod/{HEAD}: {GPU_MESSAGE}"),
    ("oomkilled, restarted", [pod(JOB, phase="Running", containers=[running(restarts=2, last=OOM)])], {}, None, None,
     f"OOMKilled: pod/{HEAD}: container ray-head ran out of memory (exit code 137, restarts 2); "
     "give the pods more memory or use smaller batches"),
    ("crash loop", [pod(JOB, phase="Running", containers=[
        waiting("CrashLoopBackOff", "back-off 5m0s", restarts=6, last={"exitCode": 1, "reason": "Error"})])],
     {}, None, None,
     f"CrashLoopBackOff: pod/{HEAD}: container ray-head keeps crashing (last exit code 1, Error), restarts 6: "
     f"submitter logs or kubectl logs {HEAD} --previous"),
    ("evicted", [pod(JOB, "worker", phase="Failed", reason="Evicted",
                     message="The node was low on resource: memory.")], {}, None, None,
     f"Evicted: pod/{WORKER}: The node was low on resource: memory."),
    ("preempted", [pod(JOB, "worker", phase="Running", conditions=[
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
         "message": "default-scheduler: preempting to accommodate a higher priority pod"}])], {}, None, None,
     f"Preempted: pod/{WORKER}: default-scheduler: preempting to accommodate a higher priority pod"),
    ("pvc not bound beats the scheduler's vague message",
     [pod(JOB, conditions=unschedulable(PVC_MESSAGE), claim=f"{JOB}-checkpoints")],
     {f"PersistentVolumeClaim/{JOB}-checkpoints": [event(pvc(f"{JOB}-checkpoints"), "ProvisioningFailed",
                                                         'storageclass.storage.k8s.io "nfs" not found')]},
     None, {f"{JOB}-checkpoints": pvc(f"{JOB}-checkpoints")},
     f'PVCNotBound: pvc/{JOB}-checkpoints: Pending: storageclass.storage.k8s.io "nfs" not found'),
    ("pvc pending without events", [pod(JOB, claim="c")], {}, None, {"c": pvc("c")},
     "PVCNotBound: pvc/c: Pending: no volume of StorageClass 'nfs' is available for ReadWriteMany"),
    ("bound pvc is fine", [pod(JOB, phase="Running", containers=[running()], claim="c")], {}, None,
     {"c": pvc("c", "Bound")}, None),
    ("failed mount from events", [pod(JOB, conditions=scheduled(), claim="c")],
     {f"Pod/{HEAD}": [event(pod(JOB), "FailedMount", "MountVolume.SetUp failed for volume \"pvc-1\": mount failed: exit status 32")]},
     None, {"c": pvc("c", "Bound")},
     f'FailedMount: pod/{HEAD}: MountVolume.SetUp failed for volume "pvc-1": mount failed: exit status 32'),
    ("quota: KubeRay could not create the head pod", [], {}, raycluster(RC, replica_failure()), None,
     "FailedCreateHeadPod: raycluster/" + RC + ': pods "x-head-abcde" is forbidden: exceeded quota: gpu-quota, '
     "requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8"),
    ("head first: the worker's problem comes after the head's",
     [pod(JOB, "worker", conditions=unschedulable()),
      pod(JOB, containers=[waiting("ImagePullBackOff", PULL_MSG)], conditions=scheduled())], {}, None, None,
     f"ImagePullBackOff: pod/{HEAD}: image {IMAGE} cannot be pulled: {PULL_MSG}"),
    ("submitter pod (labelled by the Job controller)",
     [pod(JOB, "submitter", containers=[waiting("CreateContainerConfigError", 'secret "hf-token" not found')])],
     {}, None, None,
     f'CreateContainerConfigError: pod/{JOB}-abcde: container ray-head: secret "hf-token" not found'),
    ("a pod of an older attempt's RayCluster is not the job's any more",
     [pod(JOB, cluster=f"{JOB}-raycluster-old11", conditions=unschedulable())], {}, None, None, None),
    ("head pod not ready with KubeRay's reason",
     [], {}, raycluster(RC, [{"type": "HeadPodReady", "status": "False", "reason": "ContainersNotReady",
                              "message": "containers with unready status: [ray-head]"}]), None,
     f"ContainersNotReady: raycluster/{RC}: containers with unready status: [ray-head]"),
    ("provisioning is not a problem",
     [], {}, raycluster(RC, [{"type": "HeadPodReady", "status": "False", "reason": "RayClusterPodsProvisioning"}]),
     None, None),
]


@pytest.mark.parametrize("pods, events, cluster, pvcs, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_first_blocking_reason(pods, events, cluster, pvcs, expected):
    assert _run(pods, events, cluster, pvcs) == expected


def test_job_pods_by_kuberay_labels_head_first():
    pods = [pod(JOB, "submitter"), pod(JOB, "worker"), pod(JOB), pod("other-job"),
            pod(JOB, cluster=f"{JOB}-raycluster-old11")]
    names = [p["metadata"]["name"] for p in job_pods(pods, JOB, RC)]
    assert names == [HEAD, WORKER, f"{JOB}-abcde"]


def test_events_are_wanted_only_for_pods_that_do_not_explain_themselves():
    assert not needs_events(pod(JOB, phase="Running", containers=[running()]))
    assert needs_events(pod(JOB))  # Pending, no condition yet: the events may say FailedMount
    assert not needs_events(pod(JOB, phase="Failed", reason="Evicted", message="low memory"))
    assert needs_events(pod(JOB, conditions=unschedulable()))  # Pending: a claim may be the cause


def test_only_claims_of_unscheduled_pods_are_suspects():
    assert pending_claims([pod(JOB, claim="c"), pod(JOB, "worker", claim="c")]) == ["c"]
    assert pending_claims([pod(JOB, conditions=scheduled(), claim="c")]) == []
    assert pending_claims([pod(JOB, phase="Running", claim="c")]) == []
