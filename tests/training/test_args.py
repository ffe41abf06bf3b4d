"""`python -m training`: the job document in, flags generated from the contract, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from submitter.contract.errors import UsageError
from submitter.contract.naming import ENV_JOB
from submitter.contract.spec import JobSpec, defaults, fields, flag_name
from training.args import build_parser, parse_args
from training.gpt2.config import TrainConfig
from training.driver import prepare_run
from training.gpt2.loop import checkpoint_name, resume_point
from training.gpt2.model import lr_factor


def test_defaults_are_jobspecs():
    spec = parse_args(["--name", "job"], environ={})
    assert spec == JobSpec.build(name="job")
    cfg = TrainConfig.from_spec(spec)
    assert cfg.storage_path == defaults()["storage_mount"]  # JobSpec.resolved_storage_path
    assert cfg.num_workers == int(defaults()["replicas"]) and cfg.use_gpu is False
    assert cfg.run_name == "job" and cfg.epochs == defaults()["epochs"]


def test_the_job_document_comes_from_the_environment_and_flags_override_it():
    spec = JobSpec.build(name="big", replicas=4, gpu_per_pod=2, model="tiny", fsdp=True,
                         data="s3://b/train.parquet", learning_rate=3e-4, env={"A": "b"})
    environ = {ENV_JOB: spec.document()}
    assert parse_args([], environ=environ) == spec
    assert parse_args(["--epochs", "9", "--no-fsdp", "--gpu-per-pod", "0"],
                      environ=environ) == JobSpec.build({**spec.to_dict(), "epochs": 9,
                                                         "fsdp": False, "gpu_per_pod": 0})
    cfg = TrainConfig.from_spec(spec)
    assert (cfg.num_workers, cfg.use_gpu) == (8, True)  # replicas are pods; workers are GPUs


def test_a_job_document_from_a_file(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(JobSpec.build(name="from-file", epochs=3).document())
    assert parse_args(["--job", str(path)], environ={}).epochs == 3
    with pytest.raises(UsageError, match="--job .*No such file"):
        parse_args(["--job", str(tmp_path / "missing.json")], environ={})


def test_every_setting_has_a_flag_in_its_group():
    parser = build_parser()
    groups = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    for f in fields():
        assert f.name in groups[f.metadata["group"]], f.name
    assert all(flag_name(f.name) in parser.format_help() for f in fields())


def test_the_config_reaches_the_workers_as_plain_data():
    cfg = TrainConfig.from_spec(JobSpec.build(name="job", block_size=32, checkpoint_every=5))
    data = json.loads(json.dumps(cfg.to_dict()))
    assert TrainConfig.from_dict(data) == cfg
    assert (cfg.block_size, cfg.checkpoint_every) == (32, 5)
    assert cfg.with_job(epochs=4).epochs == 4
    with pytest.raises(AttributeError):
        cfg.no_such_setting


@pytest.mark.parametrize("argv, environ, words", [
    (["--name", "job", "--model", "huge"], {}, "--model"),
    (["--name", "job", "--epochs", "0"], {}, "--epochs"),
    (["--name", "Bad_Name"], {}, "not a valid name"),
    (["--name", "job", "--epochs", "two"], {}, "whole number"),
    (["--name", "job", "--progress-every", "0"], {}, "--progress-every"),
    (["--name", "job", "--bogus"], {}, "unrecognized"),
    ([], {ENV_JOB: "{not json"}, "not valid JSON"),
    ([], {ENV_JOB: "[1, 2]"}, "JSON object"),
    ([], {ENV_JOB: '{"name": "j", "fromTheFuture": 1}'}, "unknown job setting"),
])
def test_bad_input_is_a_usage_error(argv, environ, words):
    with pytest.raises(UsageError) as e:
        parse_args(argv, environ=environ)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_pod_applies_the_storage_policy_the_chart_cannot():
    """A chart-rendered job meets render's policy in the pod, before anything starts."""
    from submitter.contract.errors import StoragePolicyError

    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    with pytest.raises(StoragePolicyError, match="outside the shared mount"):
        prepare_run(JobSpec.build(name="j", storage_path="/data/runs"), pod)
    with pytest.raises(StoragePolicyError, match="ReadWriteMany"):
        prepare_run(JobSpec.build(name="j", storage_access_mode="ReadWriteOnce"), pod)
    cfg, line = prepare_run(JobSpec.build(name="j", storage_path="s3://b/r"), pod)
    # a cluster run lives under its namespace: <storage>/<namespace>/<name>
    assert cfg.storage_path == "s3://b/r/default" and "object store" in line


def test_module_entrypoint_bad_input_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "training", "--name", "job", "--storage-path",
                           "relative/x"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "relative" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_resume_point():
    assert resume_point(None) == (0, 0, 0)
    done = {"epoch": 0, "step": 40, "step_in_epoch": 40, "epoch_done": True}
    assert resume_point(done) == (1, 0, 40)
    mid = {"epoch": 1, "step": 55, "step_in_epoch": 15, "epoch_done": False}
    assert resume_point(mid) == (1, 15, 55)
    assert checkpoint_name(2, 55) < checkpoint_name(2, 100) < checkpoint_name(10, 5)


def test_lr_schedule_warmup_then_cosine():
    f = [lr_factor(s, 10, 100, 0.1) for s in range(120)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:100], f[11:100]))
    assert f[99] == pytest.approx(0.1, abs=1e-3) and f[119] == 0.1
