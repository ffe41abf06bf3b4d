"""render(spec) -> Plan: structure, schemas, determinism, and the storage policy in front."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from submitter.errors import SpecError, StoragePolicyError
from submitter.render import names, render, training_args
from submitter.spec import JobSpec
from tests.schemas import pod_templates, validate_plan

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
    text = str(plan_for(name="cpu-job"))
    assert "nvidia.com/gpu" not in text


@pytest.mark.parametrize("replicas, gpus, workers, use_gpu", [
    (8, 1, 8, True), (4, 8, 32, True), (3, 0, 3, False), (1, 0, 1, False)])
def test_entrypoint_runs_training_with_worker_count(replicas, gpus, workers, use_gpu):
    spec = JobSpec.build(name="job", replicas=replicas, gpu_per_pod=gpus, max_failures=5)
    entry = by_kind(render(spec))["RayJob"]["spec"]["entrypoint"].split()
    assert entry[:3] == ["python", "-m", "training"]
    assert entry[entry.index("--num-workers") + 1] == str(workers)
    assert ("--use-gpu" in entry) is use_gpu
    assert entry[entry.index("--max-failures") + 1] == "5"
    assert entry[entry.index("--name") + 1] == "job"  # the run name derives from it
    assert entry[entry.index("--storage-path") + 1] == "/mnt/checkpoints"


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
    entry = objs["RayJob"]["spec"]["entrypoint"].split()
    assert entry[entry.index("--storage-path") + 1] == "/mnt/checkpoints/runs"


def test_existing_pvc_is_mounted_not_created():
    objs = by_kind(plan_for(name="reuse", existing_pvc="team-ckpt"))
    assert "PersistentVolumeClaim" not in objs
    head = objs["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "team-ckpt"}} in head["volumes"]


def test_object_store_needs_no_pvc_and_no_mount():
    objs = by_kind(plan_for(name="s3job", storage_path="gs://bucket/runs"))
    assert "PersistentVolumeClaim" not in objs
    assert "persistentVolumeClaim" not in str(objs["RayJob"])
    assert "/mnt/checkpoints" not in str(objs["RayJob"])


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
    n = names(JobSpec.build(name="gpt2-demo"))
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
    env = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert env[-2:] == [{"name": "A", "value": "x: y\n- z"}, {"name": "B", "value": "2"}]
    with pytest.raises(SpecError, match="reserved"):
        JobSpec.build(name="job", env={"SUBMITTER_NAMESPACE": "x"})


def test_training_args_cover_data_choices():
    spec = JobSpec.build(name="j", data="s3://b/c", bpe_file="/mnt/checkpoints/r.tiktoken",
                         max_steps_per_epoch=7)
    args = training_args(spec, "/mnt/checkpoints")
    assert "--dataset" not in args and args[args.index("--data") + 1] == "s3://b/c"
    assert args[args.index("--max-steps-per-epoch") + 1] == "7"
    assert args[args.index("--bpe-file") + 1] == "/mnt/checkpoints/r.tiktoken"
    assert "--allow-ephemeral-storage" not in args


def test_ephemeral_override_reaches_the_entrypoint_and_the_entrypoint_accepts_it():
    from training.args import parse_args

    spec = JobSpec.build(name="j", allow_ephemeral_storage=True)
    args = training_args(spec, "/mnt/checkpoints")
    assert "--allow-ephemeral-storage" in args
    assert parse_args(args[3:]).allow_ephemeral_storage is True


def test_plan_does_not_share_state_between_renders():
    first = plan_for(name="job")
    mutated = copy.deepcopy(list(first))
    mutated[0]["metadata"]["name"] = "changed"
    assert list(plan_for(name="job")) == list(first)
