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
    "scheduling": dict(name="sched", replicas=2, gpu_per_pod=4, cpu_per_pod="16",
                       gpu_type="NVIDIA-A100-SXM4-80GB", node_selector={"pool": "gpu"},
                       toleration=["dedicated=ml:NoSchedule", "spot:NoExecute", "x.io/y=:PreferNoSchedule"],
                       gpu_toleration="sku=gpu:NoSchedule", priority_class="high",
                       runtime_class="nvidia", image_pull_secret=["regcred"],
                       label={"team": "ml"}, annotation={"example.com/owner": "ml team: x"},
                       termination_grace_period=0),
    "kueue": dict(name="queued", queue="team-a", service_account="irsa-ml"),
    "credentials": dict(name="creds", secret_env={"AWS_SECRET_ACCESS_KEY": "aws:secret"},
                        env_from_secret=["hf", "wandb"], env={"WANDB_MODE": "offline"}),
    "unlocked": dict(name="open", ray_auth="disabled", network_policy=False),
    "elastic": dict(name="elastic", replicas="2:4", gpu_per_pod=1, global_batch_size=96),
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


def test_a_fixed_group_has_no_autoscaler():
    cluster = by_kind(plan_for(name="fixed", replicas=3))["RayJob"]["spec"]["rayClusterSpec"]
    group = cluster["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 3)
    assert "enableInTreeAutoscaling" not in cluster and "autoscalerOptions" not in cluster


def test_an_elastic_group_gets_min_max_and_a_restricted_autoscaler():
    spec = JobSpec.build(name="elastic", replicas="2:8", gpu_per_pod=1)
    rayjob = by_kind(render(spec))["RayJob"]
    cluster = rayjob["spec"]["rayClusterSpec"]
    group = cluster["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 2, 8)
    assert cluster["enableInTreeAutoscaling"] is True
    autoscaler = cluster["autoscalerOptions"]
    assert autoscaler["idleTimeoutSeconds"] >= 60  # longer than a worker-group restart
    head_container = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert autoscaler["securityContext"] == head_container["securityContext"]
    assert autoscaler["securityContext"]["allowPrivilegeEscalation"] is False
    assert autoscaler["resources"]["limits"] and autoscaler["resources"]["requests"]
    assert validate_plan(list(render(spec))) == []
    pod_job = job_document(render(spec))
    assert (pod_job.min_train_workers, pod_job.num_train_workers, pod_job.elastic) == (2, 8, True)


def test_no_gpu_keys_on_cpu():
    rayjob = by_kind(plan_for(name="cpu-job", gpu_type_label="x.io/gpu"))["RayJob"]
    for _, template in pod_templates(rayjob):
        pod = template["spec"]
        assert "tolerations" not in pod and "nodeSelector" not in pod
        assert all("nvidia.com/gpu" not in c["resources"].get("limits", {}) for c in pod["containers"])


@pytest.mark.parametrize("replicas, gpus, workers, use_gpu", [
    (8, 1, 8, True), (4, 8, 32, True), (3, 0, 3, False), (1, 0, 1, False), ("1:3", 2, 6, True)])
def test_the_pod_gets_the_worker_count_and_storage(replicas, gpus, workers, use_gpu):
    spec = JobSpec.build(name="job", replicas=replicas, gpu_per_pod=gpus, max_failures=5,
                         cpu_per_pod=str(2 * gpus + 4), memory_per_pod=f"{4 * gpus + 16}Gi")
    pod_job = job_document(render(spec))
    assert pod_job.num_train_workers == workers and (pod_job.gpu_per_pod > 0) is use_gpu
    assert pod_job.max_failures == 5
    assert pod_job.run_name == "job"  # the run name derives from the job name
    assert pod_job.resolved_storage_path == "/mnt/checkpoints"


@pytest.mark.parametrize("replicas, gpus", [(8, 1), (4, 8), (3, 0), ("1:2", 0), ("1:3", 2)])
def test_each_worker_pod_offers_exactly_its_train_worker_slots(replicas, gpus):
    """A pod never holds more Ray Train workers than it was rendered for: its `ray start`
    (bash, as KubeRay runs it) gets one train slot per worker, the head none, and all pods at
    full size give exactly the group's workers."""
    import json
    import shlex

    from submitter.contract.naming import TRAIN_SLOT_RESOURCE

    spec = JobSpec.build(name="job", replicas=replicas, gpu_per_pod=gpus,
                         cpu_per_pod=str(2 * gpus + 4), memory_per_pod=f"{4 * gpus + 16}Gi")
    cluster = by_kind(render(spec))["RayJob"]["spec"]["rayClusterSpec"]
    assert "resources" not in cluster["headGroupSpec"]["rayStartParams"]
    [group] = cluster["workerGroupSpecs"]
    [arg] = shlex.split(f"--resources={group['rayStartParams']['resources']}")
    slots = json.loads(arg.split("=", 1)[1])
    assert slots == {TRAIN_SLOT_RESOURCE: spec.workers_per_pod}
    assert slots[TRAIN_SLOT_RESOURCE] * group["maxReplicas"] == job_document(render(spec)).num_train_workers


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


# --- #10 item 4 / #13 item 4: scheduling on every pod ------------------------------------------

def _pods(plan):
    return dict(pod_templates(by_kind(plan)["RayJob"]))


def test_scheduling_settings_reach_every_pod_and_gpu_ones_only_gpu_workers():
    pods = _pods(plan_for(**VARIANTS["scheduling"]))
    assert set(pods) == {"head", "worker workers", "submitter"}
    user_tolerations = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                        {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
                        {"key": "x.io/y", "operator": "Equal", "value": "", "effect": "PreferNoSchedule"}]
    for role, template in pods.items():
        pod = template["spec"]
        assert pod["priorityClassName"] == "high" and pod["runtimeClassName"] == "nvidia"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        if role == "worker workers":
            assert pod["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
            assert pod["tolerations"] == user_tolerations + [
                {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
        else:
            assert pod["nodeSelector"] == {"pool": "gpu"}
            assert pod["tolerations"] == user_tolerations


def test_gpu_type_label_is_settable_and_gpu_toleration_can_be_dropped():
    pods = _pods(plan_for(name="g", gpu_per_pod=1, gpu_type="tesla-t4",
                          gpu_type_label="cloud.google.com/gke-accelerator", gpu_toleration=None))
    worker = pods["worker workers"]["spec"]
    assert worker["nodeSelector"] == {"cloud.google.com/gke-accelerator": "tesla-t4"}
    assert "tolerations" not in worker


def test_a_gpu_type_without_gpus_is_refused():
    with pytest.raises(SpecError, match="--gpu-type.*--gpu-per-pod"):
        JobSpec.build(name="g", gpu_type="T4")


@pytest.mark.parametrize("text", ["a", "a=b", "a:Never", ":NoSchedule", "a b:NoSchedule", "a=b=c:NoSchedule"])
def test_a_malformed_toleration_is_one_line_with_the_form(text):
    with pytest.raises(SpecError) as info:
        JobSpec.build(name="t", toleration=[text])
    message = str(info.value)
    assert "\n" not in message and "KEY[=VALUE]:EFFECT" in message and info.value.exit_code == 2


def test_queue_labels_the_rayjob_for_kueue_and_suspends_it():
    rayjob = by_kind(plan_for(**VARIANTS["kueue"]))["RayJob"]
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert rayjob["spec"]["suspend"] is True
    plain = by_kind(plan_for(name="plain"))["RayJob"]
    assert "suspend" not in plain["spec"] and "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]


def test_an_existing_service_account_is_used_not_rendered_and_the_role_binds_to_it():
    objs = by_kind(plan_for(**VARIANTS["kueue"]))
    assert "ServiceAccount" not in objs
    assert objs["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "irsa-ml",
                                                "namespace": "default"}]
    for template in _pods(plan_for(**VARIANTS["kueue"])).values():
        assert template["spec"]["serviceAccountName"] == "irsa-ml"


# --- #9 item 1 (render side): identity on every object and pod template -----------------------

@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_and_pod_template_carries_the_job_identity(variant):
    from submitter.contract import naming

    spec = JobSpec.build(VARIANTS[variant])
    labels = {**spec.label, **naming.labels(spec.name)}
    annotations = {**spec.annotation, **naming.annotations(spec.namespace, spec.name)}
    plan = list(render(spec))
    metas = [o["metadata"] for o in plan]
    metas += [t["metadata"] for _, t in pod_templates(by_kind(plan)["RayJob"])]
    for meta in metas:
        assert labels.items() <= meta["labels"].items()
        assert annotations.items() <= meta["annotations"].items()


@pytest.mark.parametrize("key", ["submitter.dev/job", "app.kubernetes.io/name", "ray.io/node-type",
                                 "kueue.x-k8s.io/queue-name"])
def test_user_labels_cannot_fake_the_jobs_own(key):
    with pytest.raises(SpecError, match="choose another"):
        JobSpec.build(name="x", label={key: "y"})
    with pytest.raises(SpecError, match="choose another"):
        JobSpec.build(name="x", annotation={key: "y"})


def test_other_well_known_labels_stay_the_users():
    rayjob = by_kind(plan_for(name="x", label={"app.kubernetes.io/part-of": "llm"}))["RayJob"]
    assert rayjob["metadata"]["labels"]["app.kubernetes.io/part-of"] == "llm"


# --- #9 item 6: a locked-down Ray cluster ------------------------------------------------------

def test_only_the_head_mounts_the_service_account_token():
    objs = by_kind(plan_for(name="t"))
    assert objs["ServiceAccount"]["automountServiceAccountToken"] is False
    tokens = {role: t["spec"]["automountServiceAccountToken"] for role, t in _pods(list(objs.values())).items()}
    assert tokens == {"head": True, "worker workers": False, "submitter": False}


def test_ray_token_auth_is_on_by_default_and_can_be_turned_off():
    assert by_kind(plan_for(name="t"))["RayJob"]["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    assert "authOptions" not in by_kind(plan_for(**VARIANTS["unlocked"]))["RayJob"]["spec"]["rayClusterSpec"]


def test_network_policy_admits_only_the_jobs_pods_and_the_operator():
    objs = by_kind(plan_for(name="np"))
    policy = objs["NetworkPolicy"]["spec"]
    selector = policy["podSelector"]["matchLabels"]
    for template in _pods(list(objs.values())).values():  # it selects every pod of the job
        assert selector.items() <= template["metadata"]["labels"].items()
    own, operator, metrics = policy["ingress"]  # what each admits: tests/submitter/test_network_policy.py
    assert metrics["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert own == {"from": [{"podSelector": {"matchLabels": selector}}]}
    assert operator["ports"] == [{"protocol": "TCP", "port": 8265}]
    assert operator["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/component": "kuberay-operator"}}
    assert policy["policyTypes"] == ["Ingress"]
    other = by_kind(plan_for(name="other"))["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"]
    assert other != selector
    assert "NetworkPolicy" not in by_kind(plan_for(**VARIANTS["unlocked"]))


@pytest.mark.parametrize("image, policy", [
    (None, "IfNotPresent"), ("img", "Always"), ("img:latest", "Always"), ("reg.io:5000/img", "Always"),
    ("reg.io:5000/img:1.2", "IfNotPresent"), ("img@sha256:abc", "IfNotPresent"),
    ("img:latest@sha256:abc", "IfNotPresent")])
def test_mutable_image_tags_are_always_pulled(image, policy):
    for template in _pods(plan_for(name="i", image=image)).values():
        assert {c["imagePullPolicy"] for c in template["spec"]["containers"]} == {policy}
    explicit = _pods(plan_for(name="i", image=image, image_pull_policy="Never"))
    assert {c["imagePullPolicy"] for t in explicit.values() for c in t["spec"]["containers"]} == {"Never"}


def test_every_pod_stays_restricted():
    for variant in VARIANTS:
        for _, template in _pods(plan_for(**VARIANTS[variant])).items():
            pod = template["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            for c in pod["containers"]:
                assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                                "capabilities": {"drop": ["ALL"]}}


# --- #10 item 1: the default image follows the job -----------------------------------------------

def test_default_image_follows_the_job_and_is_pinned_to_the_version():
    from submitter import __version__

    def images(**kw):
        return {c["image"] for t in _pods(plan_for(**kw)).values() for c in t["spec"]["containers"]}

    assert images(name="c") == {f"ghcr.io/submitter-dev/submitter-gpt2:{__version__}"}
    assert images(name="g", gpu_per_pod=1) == {f"ghcr.io/submitter-dev/submitter-gpt2:{__version__}-gpu"}
    assert images(name="o", gpu_per_pod=1, image="mine:1") == {"mine:1"}


# --- #10 item 5: credentials from Secrets, never in plain text ---------------------------------

def test_secret_env_and_env_from_secret_reach_every_ray_container():
    pods = _pods(plan_for(**VARIANTS["credentials"]))
    for role in ("head", "worker workers"):
        (container,) = pods[role]["spec"]["containers"]
        ref = next(e for e in container["env"] if e["name"] == "AWS_SECRET_ACCESS_KEY")
        assert ref == {"name": "AWS_SECRET_ACCESS_KEY",
                       "valueFrom": {"secretKeyRef": {"name": "aws", "key": "secret"}}}
        assert container["envFrom"] == [{"secretRef": {"name": "hf"}}, {"secretRef": {"name": "wandb"}}]
    assert "secret" not in str(pods["submitter"]["spec"]["containers"][0].get("env", ""))


@pytest.mark.parametrize("key", ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN",
                                 "DB_PASSWORD", "OPENAI_API_KEY", "my_apikey", "GITHUB_TOKEN"])
def test_env_refuses_credentials_with_the_fix(key):
    with pytest.raises(SpecError) as info:
        JobSpec.build(name="c", env={key: "x"})
    assert "--secret-env" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("ref", ["aws", "aws:", ":key", "Aws:key", "aws:key:x"])
def test_a_malformed_secret_env_is_refused(ref):
    with pytest.raises(SpecError, match="NAME=SECRET:KEY"):
        JobSpec.build(name="c", secret_env={"A": ref})


# --- #10 item 7: no laptop paths in the pod ------------------------------------------------------

@pytest.mark.parametrize("field", ["data", "bpe_file"])
@pytest.mark.parametrize("path", ["corpus.txt", "./data/", "~/gpt2.tiktoken"])
def test_laptop_paths_are_refused_at_render_but_the_spec_takes_them(field, path):
    spec = JobSpec.build({"name": "p", field: path})  # submit --local runs them where they are
    with pytest.raises(StoragePolicyError, match="copy it to the checkpoint volume"):
        render(spec)


# --- #12 item 2: time for a last checkpoint -------------------------------------------------------

def test_termination_grace_period_on_the_ray_pods():
    pods = _pods(plan_for(name="t", termination_grace_period=300))
    assert pods["head"]["spec"]["terminationGracePeriodSeconds"] == 300
    assert pods["worker workers"]["spec"]["terminationGracePeriodSeconds"] == 300
    assert _pods(plan_for(name="d"))["head"]["spec"]["terminationGracePeriodSeconds"] == 120
