"""render(spec) -> Plan: structure, schemas, determinism, and the storage policy in front."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from submitter.contract.errors import SpecError, StoragePolicyError
from submitter.contract.naming import ENV_JOB, object_names
from submitter.render import render
from submitter.contract.spec import JobSpec
from tests.support.schemas import pod_templates, validate_plan

GOLDEN = Path(__file__).parent / "golden"

VARIANTS = {
    "cpu": dict(name="gpt2-cpu"),
    "gpu": dict(name="gpt2-demo", replicas=8, gpu_per_pod=1),
    "multi-gpu": dict(name="big", replicas=4, gpu_per_pod=8, cpu_per_pod="64",
                      memory_per_pod="512Gi", fsdp=True),
    "existing-pvc": dict(name="reuse", existing_pvc="team-checkpoints",
                         storage_path="/mnt/checkpoints/gpt2"),
    "object-store": dict(name="s3job", storage_path="s3://bucket/runs"),
    "storage-class": dict(name="nfs", storage_class="nfs-client", storage_size="2Ti"),
    "namespace": dict(name="ns-job", namespace="ml-team", env={"WANDB_MODE": "offline"}),
    "data-files": dict(name="files", data="s3://bucket/corpus/", bpe_file="/mnt/checkpoints/gpt2.tiktoken",
                       max_steps_per_epoch=100, active_deadline_seconds=86400),
}


def plan_for(**kw):
    return render(JobSpec.build(kw))


def by_kind(plan):
    return {o["kind"]: o for o in plan}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_validates_against_its_schema(variant):
    assert validate_plan(list(plan_for(**VARIANTS[variant]))) == []


def test_golden_gpu_job():
    """The issue's canonical example, compared as data with a reviewed golden file."""
    golden = list(yaml.safe_load_all((GOLDEN / "gpt2-demo-gpu.yaml").read_text()))
    assert list(plan_for(**VARIANTS["gpu"])) == golden


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_output_is_byte_identical_across_renders(variant):
    assert str(plan_for(**VARIANTS[variant])) == str(plan_for(**VARIANTS[variant]))


def test_rayjob_shape():
    rj = by_kind(plan_for(name="gpt2-demo", replicas=8, gpu_per_pod=1))["RayJob"]
    spec = rj["spec"]
    assert rj["apiVersion"] == "ray.io/v1"
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    groups = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert len(groups) == 1 and groups[0]["replicas"] == 8
    res = groups[0]["template"]["spec"]["containers"][0]["resources"]
    assert res["requests"]["nvidia.com/gpu"] == 1 and res["limits"]["nvidia.com/gpu"] == 1
    assert "ownerReferences" not in rj["metadata"]


def test_no_gpu_keys_on_cpu():
    rayjob = by_kind(plan_for(name="cpu-job", gpu_type_label="x.io/gpu"))["RayJob"]
    for _, template in pod_templates(rayjob):
        pod = template["spec"]
        assert "tolerations" not in pod and "nodeSelector" not in pod
        assert all("nvidia.com/gpu" not in c["resources"].get("limits", {}) for c in pod["containers"])


@pytest.mark.parametrize("replicas, gpus, workers, use_gpu", [
    (8, 1, 8, True), (4, 8, 32, True), (3, 0, 3, False), (1, 0, 1, False)])
def test_the_pod_gets_the_worker_count_and_storage(replicas, gpus, workers, use_gpu):
    spec = JobSpec.build(name="job", replicas=replicas, gpu_per_pod=gpus, max_failures=5,
                         cpu_per_pod=str(gpus + 4))
    pod_job = job_document(render(spec))
    assert pod_job.num_train_workers == workers and (pod_job.gpu_per_pod > 0) is use_gpu
    assert pod_job.max_failures == 5
    assert pod_job.run_name == "job"  # the run name derives from the job name
    assert pod_job.resolved_storage_path == "/mnt/checkpoints"


def test_pvc_is_rwx_mounted_at_the_same_path_everywhere_and_never_owned():
    plan = plan_for(name="gpt2-demo", storage_path="/mnt/checkpoints/runs")
    objs = by_kind(plan)
    pvc = objs["PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "ownerReferences" not in pvc["metadata"]
    for label, template in pod_templates(objs["RayJob"]):
        if label == "submitter":
            continue
        pod = template["spec"]
        claim = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claim == [{"name": "checkpoints",
                          "persistentVolumeClaim": {"claimName": "gpt2-demo-checkpoints"}}], label
        mounts = pod["containers"][0]["volumeMounts"]
        assert {"name": "checkpoints", "mountPath": "/mnt/checkpoints"} in mounts, label
    assert job_document(plan).resolved_storage_path == "/mnt/checkpoints/runs"


def test_existing_pvc_is_mounted_not_created():
    objs = by_kind(plan_for(name="reuse", existing_pvc="team-ckpt"))
    assert "PersistentVolumeClaim" not in objs
    head = objs["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "team-ckpt"}} in head["volumes"]


def test_object_store_needs_no_pvc_and_no_mount():
    objs = by_kind(plan_for(name="s3job", storage_path="gs://bucket/runs"))
    assert "PersistentVolumeClaim" not in objs
    assert "persistentVolumeClaim" not in str(objs["RayJob"])
    for _, template in pod_templates(objs["RayJob"]):
        assert "/mnt/checkpoints" not in str(template["spec"]["containers"][0].get("volumeMounts"))


def test_restricted_security_context_on_every_pod():
    rj = by_kind(plan_for(name="gpt2-demo", gpu_per_pod=2))["RayJob"]
    for label, template in pod_templates(rj):
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, label
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, label
        for c in pod["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, label
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], label


def test_rbac_is_least_privilege_on_the_progress_configmap_only():
    objs = by_kind(plan_for(name="gpt2-demo"))
    n = object_names("gpt2-demo")
    (rule,) = objs["Role"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": [n["progress"]], "verbs": ["get", "patch"]}
    assert objs["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": n["progress"], "namespace": "default"}]
    assert objs["ConfigMap"]["metadata"]["name"] == n["progress"]
    assert "data" not in objs["ConfigMap"]  # re-applying must not reset the job's progress
    for _, template in pod_templates(objs["RayJob"]):
        assert template["spec"]["serviceAccountName"] == n["progress"]


def test_namespace_applies_to_every_object():
    for obj in plan_for(name="job", namespace="ml-team"):
        assert obj["metadata"]["namespace"] == "ml-team"


def test_storage_policy_runs_before_rendering():
    with pytest.raises(StoragePolicyError):
        plan_for(name="job", storage_path="/home/ray/ray_results")
    with pytest.raises(StoragePolicyError, match="ReadWriteMany"):
        plan_for(name="job", storage_access_mode="ReadWriteOnce")


def test_access_mode_is_irrelevant_for_object_stores():
    assert "PersistentVolumeClaim" not in by_kind(
        plan_for(name="job", storage_path="s3://b/r", storage_access_mode="ReadWriteOnce"))


def test_env_round_trips_and_cannot_override_the_plans_own():
    rj = by_kind(plan_for(name="job", env={"B": "2", "A": "x: y\n- z"}))["RayJob"]
    env = rj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]
    assert env[-2:] == [{"name": "A", "value": "x: y\n- z"}, {"name": "B", "value": "2"}]
    with pytest.raises(SpecError, match="reserved"):
        JobSpec.build(name="job", env={"SUBMITTER_NAMESPACE": "x"})


def job_document(plan) -> JobSpec:
    """The job as the pod reads it: the head's SUBMITTER_JOB."""
    head = by_kind(plan)["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    return JobSpec.from_document(_env(head["containers"][0])[ENV_JOB])


def _env(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_entrypoint_is_constant_and_the_head_carries_the_job_as_data(variant):
    spec = JobSpec.build(VARIANTS[variant])
    rayjob = by_kind(render(spec))["RayJob"]
    assert rayjob["spec"]["entrypoint"] == "python -m training"  # no per-setting flags
    templates = dict(pod_templates(rayjob))
    head = _env(templates["head"]["spec"]["containers"][0])
    assert JobSpec.from_document(head[ENV_JOB]) == spec
    assert head[ENV_JOB] == spec.document()
    for label, template in templates.items():
        if label != "head":  # only the driver (on the head) reads it
            assert ENV_JOB not in _env(template["spec"]["containers"][0]), label


def test_the_job_document_is_deterministic_and_carries_every_setting():
    spec = JobSpec.build(VARIANTS["data-files"])
    assert spec.document() == JobSpec.build(VARIANTS["data-files"]).document()
    assert JobSpec.from_document(spec.document()).to_dict() == spec.to_dict()
    assert JobSpec.from_document(spec.document(), epochs=9).epochs == 9  # flags override


def test_plan_does_not_share_state_between_renders():
    first = plan_for(name="job")
    mutated = copy.deepcopy(list(first))
    mutated[0]["metadata"]["name"] = "changed"
    assert list(plan_for(name="job")) == list(first)
