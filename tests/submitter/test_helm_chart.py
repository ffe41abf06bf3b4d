"""The Helm chart renders what `submitter render` renders; what render refuses, the chart or the pod refuses.

Rendering is Helm's own Go code (helm-python-sdk), offline. Objects are compared as parsed dicts
keyed by (kind, name), with the job document (env SUBMITTER_JOB) compared as the settings it
carries. The chart holds no copy of the storage policy: its values schema refuses what JSON
Schema can express, and `python -m training` applies the whole policy to the job document
before it trains, as `prepare_run` does here.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from submitter.contract import storage
from submitter.contract.errors import SpecError, StoragePolicyError
from submitter.contract.spec import (_CREDENTIAL_ENV, MAX_NAME_LENGTH, JobSpec, camel, defaults,
                                     field_types, fields, memory_problem)
from submitter.contract.storage import OBJECT_STORE_SCHEMES, check_job_storage
from submitter.plan import to_yaml
from submitter.render import render
from tests.conftest import ROOT
from tests.support.helm import (CHART_DIR, by_key, chart, helm, job_document, normalized,
                                render_chart, render_notes, spec_from_values)

#: `helm uninstall` must keep the PVC too; `submitter render` carries the same annotation.
KEEP = ("helm.sh/resource-policy", "keep")


def _generator() -> Any:
    loader = importlib.util.spec_from_file_location("chart_values", ROOT / "scripts" / "chart_values.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


def expected(spec: JobSpec) -> dict:
    """`submitter render`'s objects, keyed and normalized as the chart's are."""
    return normalized(by_key(copy.deepcopy(render(spec).objects)))


def chart_objects(values: dict[str, Any], **kwargs: Any) -> dict:
    """The chart's objects, installed as a user must: `helm -n` the namespace the values name,
    if they name one (the chart refuses values that name another namespace than the release's)."""
    kwargs.setdefault("namespace", _release_namespace(values))
    return normalized(render_chart(values, **kwargs))


def _release_namespace(values: dict[str, Any]) -> str | None:
    namespace = values.get("namespace")
    return namespace if isinstance(namespace, str) and namespace else None


def refusal(values: dict[str, Any], **kwargs: Any) -> str:
    """The chart's error message for these values (the test fails if the chart renders)."""
    with pytest.raises(helm().HelmError) as err:
        render_chart(values, **kwargs)
    return str(err.value)


def _python_render(values: dict[str, Any]) -> dict | str:
    try:
        return expected(spec_from_values(values, release_name="rel"))
    except (SpecError, StoragePolicyError):
        return "refused"


def _in_the_cluster(values: dict[str, Any]) -> dict | str:
    """What a chart install ends in: refused by Helm, refused by the pod's checks of the job
    document (the policy `python -m training` applies first), or the objects."""
    try:
        objects = render_chart(values, namespace=_release_namespace(values))
    except helm().HelmError:
        return "refused"
    try:
        spec = JobSpec.from_document(job_document(objects))
        check_job_storage(spec.resolved_storage_path, spec.storage_mount, spec.storage_access_mode)
    except (SpecError, StoragePolicyError):
        return "refused"
    return normalized(objects)


# --- parity ------------------------------------------------------------------------------------

PARITY = {
    "cpu-only": dict(name="cpu-demo"),
    "gpus": dict(name="gpt2-demo", replicas=8, gpu_per_pod=1),
    "existing-pvc": dict(name="shared-ckpt", existing_pvc="team-checkpoints"),
    "object-store": dict(name="s3-demo", storage_path="s3://bucket/runs/gpt2"),
    "storage-class": dict(name="nfs-demo", storage_class="nfs-client", storage_size="2Ti"),
    "namespace": dict(name="ns-demo", namespace="team-a"),
    "everything-set": dict(
        name="full", namespace="ml", replicas=4, gpu_per_pod=2, cpu_per_pod="4500m",
        memory_per_pod="2.5Gi", head_cpu="1", head_memory="2Gi", image="reg.io/team/img:1.2",
        image_pull_policy="Always", env={"WANDB_MODE": "offline", "A_B": 'x: "y"\n- z <&>'},
        storage_path="/mnt/ckpt/./runs/../runs/", storage_mount="/mnt/ckpt/", storage_size="5Gi",
        storage_class="efs.csi.aws.com", model="tiny", epochs=7, max_steps_per_epoch=40,
        batch_size_per_worker=3, learning_rate=1e-05, data="gs://bucket/data/train.parquet",
        bpe_file="/mnt/ckpt/gpt2.tiktoken", max_failures=0, num_to_keep=5, seed=0, fsdp=True,
        ttl_seconds_after_finished=0, backoff_limit=0, active_deadline_seconds=86400,
        block_size=64, warmup_steps=0, weight_decay=0.0, grad_clip=0.5, tokenizer="byte",
        val_percent=0.0, val_steps=0, checkpoint_every=100, progress_every=1,
        data_format="parquet", text_column="body"),
    "file-uri-on-mount": dict(name="file-demo", storage_path="file:///mnt/checkpoints/runs"),
    "object-store-existing-pvc": dict(name="mixed", storage_path="gs://b/r", existing_pvc="pvc-1"),
    "no-dataset-config": dict(name="nocfg", dataset="python-stdlib", dataset_config=None),
    "large-learning-rate": dict(name="lr", learning_rate=1234567.5),
    "scheduling": dict(
        name="sched", namespace="ml", replicas=2, gpu_per_pod=4, cpu_per_pod="16",
        gpu_type="NVIDIA-A100-SXM4-80GB", gpu_type_label="cloud.google.com/gke-accelerator",
        gpu_toleration="sku=gpu:NoSchedule", node_selector={"pool": "gpu", "zone": "a"},
        toleration=["dedicated=ml:NoSchedule", "spot:NoExecute", "example.com/x=:PreferNoSchedule"],
        priority_class="high-priority", runtime_class="nvidia", queue="team-a",
        image_pull_secret=["regcred", "other"], service_account="irsa-ml",
        label={"team": "ml", "cost-center": "42"}, annotation={"owner": "a@b.c", "note": 'x: "y"'},
        secret_env={"AWS_SECRET_ACCESS_KEY": "aws:secret-key", "HF_TOKEN": "hf:token"},
        env_from_secret=["wandb", "db-creds"], termination_grace_period=0),
    "unlocked": dict(name="open", ray_auth="disabled", network_policy=False, gpu_toleration=None,
                     replicas=1, gpu_per_pod=1),
    "mutable-image": dict(name="latest", image="reg.io:5000/team/img"),
    "mutable-image-latest": dict(name="latest2", image="img:latest", gpu_per_pod=1),
    "digest-image": dict(name="digest", image="reg.io/img@sha256:abc"),
    "gpu-type-default-label": dict(name="gt", gpu_per_pod=1, gpu_type="Tesla-T4"),
    "elastic": dict(name="elastic", replicas="2:4", gpu_per_pod=1, global_batch_size=96),
    "elastic-cpu": dict(name="elastic-cpu", replicas="1:3", global_batch_size=48),
    "min-equals-max": dict(name="same", replicas="3:3"),
    "queued-elastic": dict(name="qe", replicas="1:3", queue="team-a"),
    "network-policy-settings": dict(name="np", operator_selector="app=op,example.com/tier=ctl",
                                    metrics_selector="", dashboard_cidr=["172.16.0.0/28", "0.0.0.0/0"]),
    "metrics-selector": dict(name="np2", metrics_selector="app.kubernetes.io/name=vmagent,x=y"),
    # GPU workers' NCCL socket settings (submitter.contract.pod_network), overridden by the user
    "nccl-env-override": dict(name="nccl", gpu_per_pod=1, env={"NCCL_SOCKET_NTHREADS": "8",
                                                               "A": "1", "Z": "2"}),
    "nccl-secret-override": dict(name="nccl2", gpu_per_pod=2,
                                 secret_env={"NCCL_NSOCKS_PERTHREAD": "nccl:socks"}),
}


@pytest.mark.parametrize("case", PARITY, ids=list(PARITY))
def test_chart_renders_the_objects_of_submitter_render(case: str) -> None:
    spec = JobSpec.build(PARITY[case])
    assert chart_objects(spec.to_values()) == expected(spec)


@pytest.mark.parametrize("case", PARITY, ids=list(PARITY))
def test_values_file_from_render_helm_values_gives_the_same_objects(case: str) -> None:
    """The user's path: `submitter render --helm-values > v.yaml; helm template -f v.yaml`,
    the YAML parsed by Helm's parser (ints and floats come back as Go float64)."""
    spec = JobSpec.build(PARITY[case])
    values = helm().values_from_yaml(to_yaml(spec.to_values(), stream=False))
    assert chart_objects(values) == expected(spec)


def test_the_issue_workflow_end_to_end(runner) -> None:
    """submitter render ... --helm-values > values.yaml; helm template gpt2-demo -f values.yaml."""
    from submitter.cli import main

    flags = ["render", "--name", "gpt2-demo", "--replicas", "8", "--gpu-per-pod", "1",
             "-n", "team-a", "--learning-rate", "1e-5", "--env", "WANDB_MODE=offline"]
    values = runner.invoke(main, [*flags, "--helm-values"])
    objects = runner.invoke(main, flags)
    assert values.exit_code == 0 and objects.exit_code == 0, values.output + objects.output
    rendered = chart_objects(helm().values_from_yaml(values.stdout), release="gpt2-demo")
    pvc = rendered[("PersistentVolumeClaim", "gpt2-demo-checkpoints")]
    assert pvc["metadata"]["annotations"][KEEP[0]] == KEEP[1]
    assert rendered == normalized(by_key(yaml.safe_load_all(objects.stdout)))


def _script_job(tmp_path, **extra: Any) -> JobSpec:
    (tmp_path / "train.py").write_text("import ray.train\nprint('mine')\n")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    return JobSpec.build(name="mine", script=str(tmp_path / "train.py"),
                         requirements=str(tmp_path / "requirements.txt"),
                         script_args=["--lr", "3"], **extra)


def test_a_script_jobs_helm_values_give_the_objects_of_render_script(tmp_path, runner) -> None:
    """Issue 25's Helm path: `submitter render --script train.py --helm-values > v.yaml` carries
    the code (the ConfigMap's bundle, base64, and SUBMITTER_CODE); `helm template -f v.yaml`
    renders the same objects as `submitter render --script`: the code ConfigMap, its Role rule,
    the runner's entrypoint."""
    from submitter.cli import main

    spec = _script_job(tmp_path)
    out = runner.invoke(main, ["render", "--name", "mine", "--script", str(tmp_path / "train.py"),
                               "--requirements", str(tmp_path / "requirements.txt"),
                               "--helm-values", "--", "--lr", "3"])
    assert out.exit_code == 0, out.output
    values = helm().values_from_yaml(out.stdout)
    assert values["code"]["configmap"] and values["code"]["data"]
    objects = chart_objects(values)
    assert objects == expected(spec)
    assert len([k for k in objects if k[0] == "ConfigMap"]) == 2  # progress and code
    # the values file read back by render (-f) is the same job: its `code` is packed again
    (tmp_path / "values.yaml").write_text(out.stdout)
    again = runner.invoke(main, ["render", "-f", str(tmp_path / "values.yaml")])
    direct = runner.invoke(main, ["render", "--name", "mine", "--script",
                                  str(tmp_path / "train.py"), "--requirements",
                                  str(tmp_path / "requirements.txt"), "--", "--lr", "3"])
    assert again.exit_code == 0 and again.stdout == direct.stdout, again.output


def test_a_bucket_bundle_travels_as_its_uri_in_the_values(tmp_path) -> None:
    """A bundle over the ConfigMap limit goes to the run's bucket: the values carry its URI (no
    data), the chart renders render's objects (no code ConfigMap)."""
    import os

    from submitter.contract import code
    from submitter.helm_code import helm_values, upload_line

    (tmp_path / "weights.bin").write_bytes(os.urandom(code.CONFIGMAP_LIMIT + 1024))
    spec = _script_job(tmp_path, storage_path="s3://bucket/runs")
    values = helm().values_from_yaml(to_yaml(helm_values(spec), stream=False))
    assert values["code"]["configmap"] is None and values["code"]["data"] == ""
    assert "s3://bucket/runs/" in values["code"]["ref"]
    assert chart_objects(values) == expected(spec)
    assert "submitter submit" in upload_line(spec)


def test_script_values_without_their_code_are_refused(tmp_path) -> None:
    from submitter.helm_code import helm_values

    values = helm_values(_script_job(tmp_path))
    assert "--helm-values" in refusal({k: v for k, v in values.items() if k != "code"})
    assert "no script" in refusal({**values, "script": None})


def test_minimal_set_name_equals_render_with_defaults() -> None:
    values = helm().parse_set_string("name=gpt2-demo")
    assert chart_objects(values) == expected(JobSpec.build(name="gpt2-demo"))


def test_empty_name_means_the_release_name() -> None:
    assert chart_objects({}, release="from-release") == expected(JobSpec.build(name="from-release"))


def test_set_flags_parse_like_the_cli() -> None:
    """`--set` gives ints, and a float as a string: both reach the pod like the CLI's flags."""
    values = helm().parse_set_string("name=d,replicas=8,gpuPerPod=1,learningRate=3e-4,"
                                     "cpuPerPod=8")
    spec = JobSpec.build(name="d", replicas=8, gpu_per_pod=1, learning_rate="3e-4", cpu_per_pod="8")
    assert chart_objects(values) == expected(spec)


def test_set_an_elastic_range_like_the_cli() -> None:
    """`--set replicas=2:4` is text for Helm, as `--replicas 2:4` is for the CLI."""
    values = helm().parse_set_string("name=d,replicas=2:4,globalBatchSize=96")
    spec = JobSpec.build(name="d", replicas="2:4", global_batch_size=96)
    objects = chart_objects(values)
    assert objects == expected(spec)
    group = objects[("RayJob", "d")]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert (group["minReplicas"], group["maxReplicas"]) == (2, 4)


# --- namespace: the release namespace (helm -n); values may only name the same one -------------

def test_release_namespace_is_used_while_values_leave_the_default() -> None:
    values = {"name": "demo"}
    got = chart_objects(values, namespace="team-a")
    assert got == expected(spec_from_values(values, "rel", "team-a"))
    assert {obj["metadata"]["namespace"] for obj in got.values()} == {"team-a"}
    # The chart compares against JobSpec's default: this fails if that default moves.
    default = defaults()["namespace"]
    assert chart_objects({"name": "demo", "namespace": default}, namespace="team-a") == got


def test_a_values_namespace_never_beats_helm_install_n() -> None:
    """Issue 33: `render -n team-b --helm-values` then `helm install -n team-a` put the objects in
    team-b. Now the release namespace decides, and values naming another one are refused with
    the fix (never a silent move either way)."""
    spec = JobSpec.build(name="demo", namespace="team-b")
    assert chart_objects(spec.to_values(), namespace="team-b") == expected(spec)
    message = refusal(spec.to_values(), namespace="team-a")
    assert 'namespace "team-b"' in message and '"team-a"' in message and "helm -n team-b" in message


def test_notes_print_the_exact_next_command() -> None:
    notes = render_notes({"name": "demo"}, namespace="team-a")
    assert "submitter watch demo -n team-a" in notes


# --- the job document: every value reaches the pod unchanged ------------------------------------

@settings(max_examples=150, deadline=None)
@given(st.floats(min_value=0, exclude_min=True, allow_infinity=False))
def test_any_positive_learning_rate_reaches_the_pod_unchanged(rate: float) -> None:
    doc = job_document(render_chart({"name": "lr", "learningRate": rate}))
    assert JobSpec.from_document(doc).learning_rate == rate


# --- property: any valid spec renders the same through both renderers --------------------------

_printable = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00") | \
    st.sampled_from("\n\t\"'\\:{}[]#&*!|>%@`<")
_word = st.from_regex(r"\A[a-z][a-z0-9]{0,8}\Z")
def _fsdp_batch_ok(d: dict[str, Any]) -> bool:
    """FSDP's ranks split the global batch equally: an elastic range with no such batch of
    0.25-2 M tokens is refused (submitter.contract.batch.default_problem)."""
    from submitter.contract import batch
    from submitter.contract.spec import replica_range

    lo, hi = replica_range(str(d["replicas"]))
    g = max(d["gpu_per_pod"], 1)
    unit = batch.lcm(batch.group_sizes(lo * g, hi * g, g))
    return not d["fsdp"] or unit * batch.MODEL_BLOCK[d.get("model", "gpt2-small")] \
        <= batch.MAX_TOKENS_PER_STEP


_specs = st.fixed_dictionaries({
    "name": st.from_regex(r"\A[a-z]([-a-z0-9]{0,30}[a-z0-9])?\Z"),
    "namespace": st.sampled_from(["default", "team-a", "x"]),
    "replicas": st.one_of(st.integers(1, 512), st.tuples(st.integers(1, 8), st.integers(0, 8)).map(
        lambda r: f"{r[0]}:{r[0] + r[1]}")),
    "gpu_per_pod": st.integers(0, 8),
    "cpu_per_pod": st.sampled_from(["4", "9", "2500m", "64"]),
    "memory_per_pod": st.sampled_from(["16Gi", "512Mi", "1.5G"]),
    "env": st.dictionaries(st.from_regex(r"\A[A-Z][A-Z0-9_]{0,10}\Z").filter(
        lambda key: not key.startswith("SUBMITTER_") and not re.search(_CREDENTIAL_ENV, key)),
        st.text(_printable), max_size=4),
    "storage_path": st.one_of(st.none(), st.sampled_from(
        ["s3://b/r", "gs://b", "/mnt/checkpoints/x", "file:///mnt/checkpoints/y//z/"])),
    "existing_pvc": st.one_of(st.none(), _word),
    "storage_class": st.one_of(st.none(), _word),
    "epochs": st.integers(1, 10**6),
    "max_steps_per_epoch": st.one_of(st.none(), st.integers(1, 2**31 - 1)),
    "learning_rate": st.floats(min_value=1e-9, max_value=10.0),
    "data": st.one_of(st.none(), st.sampled_from(["/mnt/checkpoints/d.txt", "s3://b/d/"])),
    "dataset_config": st.one_of(st.none(), _word),
    "seed": st.integers(0, 2**31 - 1),
    "fsdp": st.booleans(),
    "allow_ephemeral_storage": st.booleans(),
    "active_deadline_seconds": st.one_of(st.none(), st.integers(1, 10**7)),
    "label": st.dictionaries(_word, _word, max_size=2),
    "annotation": st.dictionaries(_word, st.text(_printable), max_size=2),
    "node_selector": st.dictionaries(_word, _word, max_size=2),
    "toleration": st.lists(st.sampled_from(["a:NoSchedule", "b=c:NoExecute", "x.io/y=:PreferNoSchedule"]),
                           max_size=3),
    "gpu_type": st.one_of(st.none(), _word),
    "queue": st.one_of(st.none(), _word),
    "service_account": st.one_of(st.none(), _word),
    "image": st.one_of(st.none(), st.sampled_from(["img", "img:1", "r.io:5000/i", "i@sha256:0"])),
    "secret_env": st.dictionaries(st.from_regex(r"\A[A-Z][A-Z0-9_]{0,10}\Z").filter(
        lambda key: not key.startswith("SUBMITTER_")), st.sampled_from(["s:k", "a.b:c-d"]), max_size=2),
}).filter(lambda d: (d["gpu_per_pod"] > 0 or not d["fsdp"])  # FSDP needs GPUs
          and (d["gpu_per_pod"] > 0 or d["gpu_type"] is None)  # a GPU type needs GPUs
          # a CPU per Ray Train worker, plus one per GPU (at least one) for Ray Data (Ray counts
          # the limit rounded up)
          and -(-int(d["cpu_per_pod"].rstrip("m")) // (1000 if d["cpu_per_pod"].endswith("m") else 1))
          >= max(d["gpu_per_pod"], 1) + max(d["gpu_per_pod"], 1)
          # memory for the pod's workers beside Ray's object store
          and memory_problem(d.get("model", "gpt2-small"), max(d["gpu_per_pod"], 1),
                             d["memory_per_pod"], d.get("head_memory", "8Gi")) is None
          and _fsdp_batch_ok(d))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_specs)
def test_any_valid_spec_renders_the_same_objects(data: dict[str, Any]) -> None:
    spec = JobSpec.build(data)
    assert chart_objects(spec.to_values()) == expected(spec)


# --- storage policy: what render refuses, the chart's schema or the pod refuses -----------------

STORAGE_PATHS = [
    # refused
    "runs", "./runs", "~/ray_results", "~/runs", "/tmp/ckpt", "/tmp", "/var/tmp/x", "/dev/shm/x",
    "/home/ray/ray_results", "/home/ray/ray_results/x", "/root/ray_results", "/data/runs",
    "/mnt/checkpoints-other", "/mnt/checkpoints/../x", "//mnt/checkpoints/x", "local:///mnt/x",
    "file:///tmp/x", "file://host/mnt/checkpoints", "file:///data", "ftp://host/x", "http://h/x",
    "s3://", "s3:///nobucket", "S3:x://y", "S3://Bucket/x",
    # accepted
    "/mnt/checkpoints", "/mnt/checkpoints/", "/mnt/checkpoints/a/../b", "/mnt/checkpoints//x",
    "///mnt/checkpoints/x", "file:///mnt/checkpoints", "file:///mnt/checkpoints/x/./y",
    "/mnt/checkpoints/a://b", "abfss://c@acct.dfs.core.windows.net/runs",
] + [f"{scheme}://bucket/runs" for scheme in sorted(OBJECT_STORE_SCHEMES)]


@pytest.mark.parametrize("path", STORAGE_PATHS)
def test_storage_policy_decides_like_submitter_render(path: str) -> None:
    values = {"name": "pol", "storagePath": path}
    assert _in_the_cluster(values) == _python_render(values)


@pytest.mark.parametrize("path", ["runs", "~/runs", "/tmp/ckpt", "/home/ray/ray_results/x",
                                  "local:///mnt/x", "s3:///nobucket", "file:///tmp/x"])
def test_the_values_schema_refuses_what_a_pattern_can_say(path: str) -> None:
    assert "storagePath" in refusal({"name": "pol", "storagePath": path})


# Every system and scratch directory storage.py knows, so a new one there fails here first.
MOUNTS = sorted({*storage._SYSTEM_DIRS, *(d + "/x" for d in storage._SCRATCH_TREES),
                 "/mnt/x", "/data", "/home/ray", "/home/x/", "//", "relative/mnt", "/mnt/a/../b"})


@pytest.mark.parametrize("mount", MOUNTS)
def test_storage_mount_is_checked_like_submitter_render(mount: str) -> None:
    values = {"name": "mnt", "storageMount": mount}
    assert _in_the_cluster(values) == _python_render(values)


@pytest.mark.parametrize("mode", ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteOncePod"])
def test_a_pvc_that_is_not_read_write_many_is_refused(mode: str) -> None:
    for values in ({"name": "demo", "storageAccessMode": mode},
                   {"name": "demo", "storageAccessMode": mode, "existingPvc": "old"}):
        assert _in_the_cluster(values) == _python_render(values) == "refused"
    # An object store needs no PVC, so the access mode does not matter (as in render).
    spec = JobSpec.build(name="demo", storage_access_mode=mode, storage_path="s3://b/r")
    assert chart_objects(spec.to_values()) == expected(spec)


def test_chart_refuses_a_release_name_kuberay_cannot_take() -> None:
    too_long = "a" * (MAX_NAME_LENGTH + 1)
    with pytest.raises(SpecError):
        JobSpec.build(name=too_long)
    assert f"at most {MAX_NAME_LENGTH}" in refusal({}, release=too_long)
    assert render_chart({}, release="a" * MAX_NAME_LENGTH)  # the limit itself is fine
    assert "not a valid name" in refusal({}, release="1abc")


# --- only the job's own objects ----------------------------------------------------------------

def test_objects_carry_render_labels_and_no_owner_references() -> None:
    for obj in render_chart({"name": "demo"}).values():
        assert "ownerReferences" not in obj["metadata"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "submitter"
        assert not any(k.startswith("helm.sh/") for k in obj["metadata"]["labels"])


@pytest.mark.parametrize("values", [{"existingPvc": "mine"}, {"storagePath": "s3://b/r"}])
def test_pvc_only_when_the_job_creates_it(values: dict) -> None:
    kinds = {kind for kind, _ in render_chart({"name": "demo", **values})}
    assert "PersistentVolumeClaim" not in kinds and "RayJob" in kinds
    created = render_chart({"name": "demo"})[("PersistentVolumeClaim", "demo-checkpoints")]
    assert dict([KEEP]).items() <= created["metadata"]["annotations"].items()


# --- defaults live once: values.yaml and values.schema.json come from JobSpec -----------------

def default_values() -> dict[str, Any]:
    return {camel(k): v for k, v in defaults().items()}


#: The one chart-only key (submitter/helm_code.py): a --script job's code, null by default.
CHART_ONLY = {"code": None}


def test_values_yaml_holds_exactly_jobspec_defaults() -> None:
    parsed = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert parsed == {**default_values(), **CHART_ONLY}
    assert list(parsed) == [*default_values(), *CHART_ONLY]  # JobSpec's order, then the chart's


def test_values_schema_has_exactly_jobspec_keys_and_no_others() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert set(schema["properties"]) == set(default_values()) | set(CHART_ONLY)
    assert schema["additionalProperties"] is False
    with pytest.raises(helm().HelmError, match="nmae"):
        render_chart({"nmae": "typo"})


def test_committed_chart_files_are_the_generated_ones() -> None:
    """Run `python scripts/chart_values.py` after changing JobSpec."""
    generator = _generator()
    assert (CHART_DIR / "values.yaml").read_text() == generator.values_yaml()
    assert (CHART_DIR / "values.schema.json").read_text() == generator.schema_json()


def test_every_key_is_documented() -> None:
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    for key in default_values():
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
        assert lines[at - 1].startswith("# -- "), key


# What the chart admits and the pod accepts is exactly what `submitter render` admits, with the
# same objects. Candidates are of the field's own type: JobSpec also coerces "8" to 8 for
# flags, but Helm values are typed.
PROBES: dict[str, list[Any]] = {
    "name": ["", "a", "gpt2-demo", "a" * 47, "a" * 48, "Demo", "1abc", "abc-", "a_b", "a.b"],
    "namespace": ["default", "team-a", "0ns", "a" * 63, "a" * 64, "Team", "-a", "a.b", ""],
    "image": [None, "img", "reg.io/team/img:1.2", "img@sha256:abc", "Img", "img:tag latest", ""],
    "image_pull_policy": [None, "Always", "IfNotPresent", "Never", "always", ""],
    "env": [{}, {"A": "1"}, {"_x": ""}, {"1A": "x"}, {"A-B": "x"},
            {"SUBMITTER_X": "x"}, {"A": "a\x00b"}, {"A": 'x: "y"\n- z'}, {"AWS_SECRET_ACCESS_KEY": "x"},
            {"HF_TOKEN": "x"}, {"db_password": "x"}, {"OPENAI_API_KEY": "x"}, {"MY_APIKEY": "x"}],
    "secret_env": [{}, {"A": "s:k"}, {"A": "s.x-y:k_e.y-z"}, {"A": "s"}, {"A": "S:k"}, {"A": ":k"},
                   {"A": "s:"}, {"A": "s:k:z"}, {"SUBMITTER_X": "s:k"}, {"1A": "s:k"}, {"A": "s:k\n"}],
    "env_from_secret": [[], ["s"], ["a.b", "c"], ["S"], [""], ["a_b"], ["a" * 254]],
    "label": [{}, {"team": "ml"}, {"example.com/x": ""}, {"a": "b" * 64}, {"a": "-x"},
              {"submitter.dev/job": "x"}, {"app.kubernetes.io/name": "x"}, {"ray.io/x": "y"},
              {"app.kubernetes.io/part-of": "x"}, {"app.kubernetes.io/name-x": "y"},
              {"kueue.x-k8s.io/queue-name": "q"}, {"a/b/c": "x"}, {"A_b.c": "x"}, {"": "x"},
              {"x" * 64: "y"}, {"Ex.com/x": "y"}],
    "annotation": [{}, {"owner": "a b: c\n"}, {"submitter.dev/job-uid": "x"}, {"a b": "x"},
                   {"example.com/x": "y"}, {"a": "b\x00"}],
    "node_selector": [{}, {"pool": "gpu"}, {"kubernetes.io/arch": "amd64"}, {"a": "b c"},
                      {"a": ""}, {"bad key": "x"}],
    "toleration": [[], ["a:NoSchedule"], ["a=b:NoExecute", "c:PreferNoSchedule"], ["a=:NoSchedule"],
                   ["a"], ["a:Never"], ["a=b"], [":NoSchedule"], ["a=b c:NoSchedule"],
                   ["x.io/y=z:NoSchedule"], ["a:NoSchedule\n"]],
    "gpu_toleration": [None, "nvidia.com/gpu:NoSchedule", "sku=gpu:NoSchedule", "x", "a:b", ""],
    "gpu_type": [None, "NVIDIA-A100-SXM4-80GB", "Tesla T4", "", "a" * 64],
    "gpu_type_label": ["nvidia.com/gpu.product", "gpu", "", "a b", "x/y/z"],
    "priority_class": [None, "high", "High", "", "a" * 254],
    "runtime_class": [None, "nvidia", "gVisor", ""],
    "queue": [None, "team-a", "Team_A.1", "", "a b", "a" * 64],
    "service_account": [None, "irsa", "IRSA", "", "a.b"],
    "image_pull_secret": [[], ["regcred"], ["a", "b"], ["Reg"], [""]],
    "ray_auth": ["token", "disabled", "on", ""],
    "data": [None, "/mnt/checkpoints/d.txt", "/opt/data/x", "s3://b/d/", "gs://b/x", "./data",
             "data.txt", "~/data", "s3a://b/x", "S3://b/x", "hdfs://n/x", "file:///x", "",
             "fineweb-edu-10b", "fw:1", "~fw",  # a prepared corpus's NAME
             "fw:0.7,stack:0.3", "fw:.5,b:2", "fw:0", "fw:-1", "fw:1e3", "fw:x,b:1"],  # mixtures
    "bpe_file": [None, "/mnt/checkpoints/d.txt", "/opt/data/x", "s3://b/d/", "./data",
                 "data.txt", "~/data", "s3a://b/x", "hdfs://n/x", "file:///x", "", "fw"],
    "storage_path": [None, "/mnt/checkpoints/x", "s3://b/r", "", "/mnt/checkpoints/a b",
                     "/mnt/checkpoints/$(x)", "/mnt/checkpoints/a;b", "~/x", "~", "/mnt/~x",
                     "-/mnt/checkpoints"],
    "storage_mount": ["/mnt/x", "", "/mnt/a b", "/mnt/\u00fc", "~/mnt"],
    "storage_class": [None, "nfs", "efs.csi.aws.com", "", "NFS", "a_b"],
    "storage_access_mode": ["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany", "ReadWriteOncePod",
                            "RWX"],
    "existing_pvc": [None, "pvc-1", "", "PVC", "a" * 253, "a" * 254],
    "model": ["gpt2-small", "tiny", "gpt2-xl"],
    "dataset": ["Salesforce/wikitext", "", "a b", "x'y", "--fsdp", " x", "a\tb"],
    "dataset_config": [None, "wikitext-103-raw-v1", "", "a;b", "-x"],
    "data_format": ["auto", "text", "parquet", "jsonl", "csv"],
    "tokenizer": ["auto", "gpt2", "byte", "bpe"],
    "learning_rate": [6e-4, 1, 0.0, -1e-3, 1e300],
    "weight_decay": [0.0, 0.1, -0.1],
    "val_percent": [0.0, 5.0, 99.5, 100.0, -1.0],
    "replicas": [1, 8, 10_000, 10_001, 0, -1, "8", "2:8", "8:2", "1:10000", "1:10001", "0:2",
                 "1:", ":2", "1:2:3", " 1:2", "1 :2", "\u0664", "2.5", 2.5, True],
    "global_batch_size": [None, 1, 16, 48, 2**31 - 1, 0, -1, 2**31, 1.5],
    "checkpoint_interval": [None, 0, 0.5, 30, "30", 10_080, 10_080.5, -1, "x", 1e300],
    "gpu_hour_price": [None, 2.49, "2.49", 0, -1, "x", 1e300],
    "max_cost": [None, 100, 0.5, 0, -3, "ten"],
    "deadline": [None, "45s", "90m", "12h", "1h30m", "90", "0s", "12 h", "", "h", 90],
    "cpu_per_pod": ["4", "500m", "0.5", ".5", "1.5Gi", 4, "four", "4 ", "-1", "1e3", "", "0",
                    "0m", 0, "\u0664", "2", "1", "1001m", "2000m"],
    "precision": ["auto", "bf16", "fp16", "fp32", "fp8", ""],
    "operator_selector": ["app=x", "a=b,c=d", "example.com/tier=ctl", "", "a", "a=b,", "a b=c", "a=",
                          "=b", "a=b=c", "-a=b", "a=b,,c=d", "A_b.c=X-y"],
    "metrics_selector": ["app.kubernetes.io/name=prometheus", "", "a=b,c=d", "a", "a=", ",a=b", "a=b c"],
    "dashboard_cidr": [[], ["10.0.0.0/8"], ["172.16.0.0/28", "0.0.0.0/0"], ["::/0"], ["2001:db8::/32"],
                       ["10.0.0.1/8"], ["x"], ["10.0.0.0/33"], ["300.0.0.0/8"], ["10.0.0.0"], [""]],
    "compile": ["auto", "on", "off", "yes", "", "On"],
    # your own script: render packs it, the chart cannot (it refuses each, as render refuses
    # the others without a script)
    "script": [None, "train.py"], "working_dir": [None, "."], "requirements": [None, "r.txt"],
    "script_args": [[], ["--lr", "3"]],
}
for _f in fields():  # every yes/no and whole-number field: both sides agree at the bounds
    _kind = field_types()[_f.name]
    if _kind is bool:
        PROBES[_f.name] = [True, False]
    elif _kind is int and _f.name not in PROBES:
        PROBES[_f.name] = [-1, 0, 1, 2, 2**31 - 1, 2**31, 10**12] + (
            [None] if defaults()[_f.name] is None else [])
#: The one rule across fields: FSDP needs GPUs (probed with the default gpuPerPod 0 above).
PAIRS = [{"fsdp": True, "gpuPerPod": 1}, {"fsdp": True, "gpuPerPod": 0},
         {"fsdp": False, "gpuPerPod": 0}]
#: The other rules across fields: CPUs that fit the pod's workers, a GPU type needs GPUs.
CROSS = [{"gpuPerPod": 3, "cpuPerPod": "4"}, {"gpuPerPod": 4, "cpuPerPod": "4"},
         {"gpuPerPod": 8, "cpuPerPod": "15500m"}, {"gpuPerPod": 8, "cpuPerPod": "15"},
         {"gpuType": "T4", "gpuPerPod": 0}, {"gpuType": "T4", "gpuPerPod": 1},
         # a global batch every group size of --replicas reaches (2:3 x 8: 48) or not (16)
         {"replicas": "2:3", "globalBatchSize": 48}, {"replicas": "2:3", "globalBatchSize": 16}]


@pytest.mark.parametrize("field", sorted(PROBES))
def test_chart_and_pod_admit_exactly_what_submitter_render_admits(field: str) -> None:
    for value in PROBES[field]:
        values = {**default_values(), "name": "probe", camel(field): value}
        assert _in_the_cluster(values) == _python_render(values), (field, value)


@pytest.mark.parametrize("pair", PAIRS)
def test_fsdp_needs_gpus_in_both(pair: dict) -> None:
    values = {**default_values(), "name": "probe", **pair}
    assert _in_the_cluster(values) == _python_render(values)
    assert (_python_render(values) == "refused") == (pair == {"fsdp": True, "gpuPerPod": 0})


@pytest.mark.parametrize("values", CROSS)
def test_rules_across_fields_hold_in_both(values: dict) -> None:
    merged = {**default_values(), "name": "probe", **values}
    assert _in_the_cluster(merged) == _python_render(merged)


@pytest.mark.parametrize("field, value", [("name", "abc\n"), ("cpu_per_pod", "4\n")])
def test_a_trailing_newline_is_refused_by_both(field: str, value: str) -> None:
    values = {**default_values(), "name": "probe", camel(field): value}
    assert _in_the_cluster(values) == _python_render(values) == "refused"


def test_every_jobspec_field_is_probed() -> None:
    same_check = {"memory_per_pod": "cpu_per_pod", "head_cpu": "cpu_per_pod",
                  "head_memory": "cpu_per_pod", "storage_size": "cpu_per_pod",
                  "val_data": "bpe_file", "text_column": "dataset",
                  "grad_clip": "weight_decay"}
    assert set(PROBES) | set(same_check) == {f.name for f in fields()}
    checks = {f.name: f.metadata["check"] for f in fields()}
    for twin, same in same_check.items():
        assert checks[twin].schema == checks[same].schema, twin


# --- lint ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("values", [None, {"name": "demo", "replicas": 8, "gpuPerPod": 1}])
def test_chart_lints_clean(values: dict | None) -> None:
    report = helm().lint(str(CHART_DIR), values, strict=True, kube_version="v1.30.0")
    assert report["errors"] == []
    # Only the INFO "icon is recommended": we have no icon to point at.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_packaged_chart_renders_the_same(tmp_path) -> None:
    archive = helm().package(str(CHART_DIR), destination=str(tmp_path))
    packaged = helm().Chart.load(archive)
    values = JobSpec.build(PARITY["gpus"]).to_values()
    assert packaged.render(values, name="rel") == chart().render(values, name="rel")


def test_chart_metadata() -> None:
    meta = chart().metadata
    assert meta["name"] == "submitter" and meta["appVersion"] == "0.1.0"
    assert (CHART_DIR / ".helmignore").is_file()
