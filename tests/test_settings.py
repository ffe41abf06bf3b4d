"""Every setting reaches every surface: the flag, the job file, the Helm values and schema, the
pod's job document, and `python -m training --help`.

A new JobSpec field needs a sample below (a valid value other than its default); then this test
proves the field travels from each way in to the pod unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from submitter.cli import main
from submitter.contract.naming import ENV_JOB
from submitter.contract.spec import JobSpec, camel, defaults, field_types, fields, flag_name
from tests.conftest import ROOT
from tests.support.helm import CHART_DIR

#: A valid, non-default value per setting (with the others at their defaults, name aside).
SAMPLES = {
    "name": "sample-job", "namespace": "team-a", "image": "reg.io/team/gpt2:1.0",
    "image_pull_policy": "Always", "env": {"WANDB_MODE": "offline"},
    "replicas": "2:3", "gpu_per_pod": 2, "cpu_per_pod": "8", "memory_per_pod": "32Gi",
    "head_cpu": "1", "head_memory": "4Gi",
    "storage_path": "s3://bucket/runs", "storage_mount": "/mnt/ckpt", "storage_size": "5Ti",
    "storage_class": "nfs-client", "storage_access_mode": "ReadWriteOnce",
    "existing_pvc": "team-ckpt", "allow_ephemeral_storage": True,
    "model": "tiny", "epochs": 5, "max_steps_per_epoch": 100, "batch_size_per_worker": 4,
    "block_size": 64, "learning_rate": 3e-4, "warmup_steps": 10, "weight_decay": 0.05,
    "grad_clip": 0.5, "seed": 7, "restart_epoch": True, "fsdp": True, "precision": "bf16", "compile": "on",
    "global_batch_size": 64,
    "dataset": "org/corpus", "dataset_config": None, "data": "s3://bucket/corpus/",
    "data_format": "jsonl", "text_column": "body", "tokenizer": "byte",
    "bpe_file": "/mnt/ckpt/gpt2.tiktoken", "val_percent": 2.5,
    "val_data": "s3://bucket/val/", "limit_rows": 1000, "val_steps": 4,
    "max_failures": 5, "num_to_keep": 3, "checkpoint_every": 50, "checkpoint_interval": 7.5,
    "progress_every": 2,
    "ttl_seconds_after_finished": 60, "backoff_limit": 2, "active_deadline_seconds": 3600,
    "secret_env": {"AWS_SECRET_ACCESS_KEY": "aws-creds:secret-access-key"},
    "env_from_secret": ["wandb", "hf-token"], "label": {"team": "ml"},
    "annotation": {"example.com/owner": "ml team"}, "gpu_type": "NVIDIA-A100-SXM4-80GB",
    "gpu_type_label": "cloud.google.com/gke-accelerator", "gpu_toleration": "sku=gpu:NoSchedule",
    "node_selector": {"pool": "gpu"}, "toleration": ["dedicated=ml:NoSchedule", "spot:NoExecute"],
    "priority_class": "high", "queue": "team-a", "runtime_class": "nvidia",
    "service_account": "irsa-ml", "image_pull_secret": ["regcred", "other"],
    "ray_auth": "disabled", "network_policy": False, "termination_grace_period": 30,
    "gpu_hour_price": 2.49, "max_cost": 500.0, "deadline": "12h",  # #38: reach the run as data
    "operator_selector": "app=kuberay,team=platform", "metrics_selector": "",
    "dashboard_cidr": ["172.16.0.0/28"],
    # your own script (absolute: the test's working directory is not the script's)
    "script": str(ROOT / "tests/scripts/plain.py"), "working_dir": str(ROOT / "tests/scripts"),
    "requirements": str(ROOT / "tests/scripts/requirements.txt"), "allow_code_change": True,
    "script_args": ["3", "fast"],
}
#: Settings a sample needs another one for (the one rule across fields).
NEEDS = {"fsdp": {"gpu_per_pod": 1}, "storage_access_mode": {"storage_path": "s3://b/r"},
         "gpu_type": {"gpu_per_pod": 1},
         "queue": {"replicas": "1:3"},
         **{name: {"script": str(ROOT / "tests/scripts/plain.py")} for name in
            ("working_dir", "requirements", "allow_code_change", "script_args")}}  # a queued elastic group: Kueue's elastic-job annotation


def test_every_setting_has_a_sample():
    assert set(SAMPLES) == {f.name for f in fields()}, "add a sample for the new setting"
    for name, value in SAMPLES.items():
        assert value != defaults()[name], name


def _as_flags(name: str, value) -> list[str]:
    kind = field_types()[name]
    if kind is bool:
        return [flag_name(name)] if value else [f"--no-{flag_name(name)[2:]}"]
    if kind is dict:
        return [a for k, v in value.items() for a in (flag_name(name), f"{k}={v}")]
    if kind is list:
        return [a for v in value for a in (flag_name(name), v)]
    return [flag_name(name), str(value)]


def _pod_job(plan_yaml: str) -> JobSpec:
    rayjob = next(o for o in yaml.safe_load_all(plan_yaml) if o["kind"] == "RayJob")
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return JobSpec.from_document(next(e["value"] for e in head["env"] if e["name"] == ENV_JOB))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_setting_travels_from_flag_and_job_file_to_the_pod(name, runner, tmp_path):
    value = SAMPLES[name]
    extra = {"name": "j", **NEEDS.get(name, {}), name: value}
    want = JobSpec.build(extra)
    # the job file (snake_case) and a Helm values file (camelCase) give the same objects
    job_file, values_file = tmp_path / "job.yaml", tmp_path / "values.yaml"
    job_file.write_text(yaml.safe_dump(want.to_dict()))
    values_file.write_text(yaml.safe_dump(want.to_values()))
    rendered = []
    for path in (job_file, values_file):
        result = runner.invoke(main, ["render", "-f", str(path)])
        assert result.exit_code == 0, result.output
        assert getattr(_pod_job(result.stdout), name) == value
        rendered.append(result.stdout)
    assert rendered[0] == rendered[1]
    # the flag (a null has no flag: leaving it out keeps the default, which is not null here)
    if value is not None:
        flags = [a for k, v in extra.items() for a in _as_flags(k, v)]
        by_flag = runner.invoke(main, ["render", *flags])
        assert by_flag.exit_code == 0, by_flag.output
        assert by_flag.stdout == rendered[0]


def test_every_setting_is_a_helm_value_with_a_schema():
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())["properties"]
    for f in fields():
        assert camel(f.name) in values and camel(f.name) in schema, f.name
        assert schema[camel(f.name)]["description"].startswith(f.metadata["help"]), f.name


def test_every_setting_is_a_flag_of_both_commands():
    submit_help = subprocess.run([sys.executable, "-m", "submitter", "submit", "--help"],
                                 capture_output=True, text=True, cwd=ROOT, timeout=60).stdout
    entry_help = subprocess.run([sys.executable, "-m", "training", "--help"],
                                capture_output=True, text=True, cwd=ROOT, timeout=60).stdout
    for f in fields():
        assert flag_name(f.name) in submit_help, f.name
        assert flag_name(f.name) in entry_help, f.name
