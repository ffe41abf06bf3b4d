"""`submitter tensorboard NAME`, and the credential variables trackers read refused in --env."""

from __future__ import annotations

import os

import pytest

from submitter.cli import main
from submitter.contract.errors import NotFound
from submitter.tensorboard_cmd import board


def test_a_local_run_is_served_from_its_runs_directory(tmp_path):
    (tmp_path / "runs" / "demo" / "tensorboard").mkdir(parents=True)
    b = board("demo", None, None, 6006, str(tmp_path))
    assert b.logdir == str(tmp_path / "runs" / "demo" / "tensorboard")
    assert b.argv == ["tensorboard", "--logdir", b.logdir, "--port", "6006"]


def test_a_bucket_run_is_served_from_here_with_its_namespace_in_the_path(tmp_path):
    b = board("demo", "s3://bkt/runs/", "team-a", 7000, str(tmp_path))
    assert b.lines == ["tensorboard --logdir s3://bkt/runs/team-a/demo/tensorboard --port 7000"]


def test_a_pvc_run_gets_the_head_pod_and_the_port_forward_line(tmp_path):
    b = board("demo", "/mnt/checkpoints", "team-a", 6006, str(tmp_path))
    assert b.argv is None and len(b.lines) == 2
    assert "/mnt/checkpoints/team-a/demo/tensorboard" in b.lines[0]
    assert "submitter.dev/job=demo,ray.io/node-type=head" in b.lines[0]
    assert b.lines[1].startswith("kubectl -n team-a port-forward ") and b.lines[1].endswith(" 6006:6006")


def test_no_such_local_run_is_one_line(tmp_path):
    with pytest.raises(NotFound, match="no local run demo under"):
        board("demo", None, None, 6006, str(tmp_path))


def test_cli_prints_or_refuses_with_one_line(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "demo" / "tensorboard").mkdir(parents=True)
    r = runner.invoke(main, ["tensorboard", "demo", "--print"])
    assert r.exit_code == 0 and r.output.strip() == \
        f"tensorboard --logdir {tmp_path}/runs/demo/tensorboard --port 6006"
    r = runner.invoke(main, ["tensorboard", "missing"])
    assert r.exit_code == 6 and r.output.count("\n") == 1 and "no local run missing" in r.output
    r = runner.invoke(main, ["tensorboard", "Bad_Name"])
    assert r.exit_code == 2
    monkeypatch.setenv("PATH", str(tmp_path))  # no tensorboard here: the pip line, exit 2
    r = runner.invoke(main, ["tensorboard", "demo"])
    assert r.exit_code == 2 and "pip install tensorboard" in r.output


@pytest.mark.parametrize("key", ["WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD",
                                 "MLFLOW_TRACKING_TOKEN"])
def test_tracker_credentials_in_env_are_refused_pointing_to_secret_env(runner, key):
    r = runner.invoke(main, ["render", "--name", "demo", "--storage-path", "s3://b/runs",
                             "--env", f"{key}=hunter2"])
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and f"--secret-env {key}=SECRET:KEY" in r.output
    assert "hunter2" not in r.output


def test_tracker_variables_that_are_not_secrets_pass_through_env(runner):
    r = runner.invoke(main, ["render", "--name", "demo", "--storage-path", "s3://b/runs",
                             "--env", "MLFLOW_TRACKING_URI=http://mlflow:5000",
                             "--env", "WANDB_MODE=offline", "-o", "json"])
    assert r.exit_code == 0, r.output
    assert "http://mlflow:5000" in r.output


@pytest.mark.parametrize("pair, words", [("WANDB_MODE=ofline", "is not a W&B mode"),
                                         ("MLFLOW_TRACKING_URI=mlruns", "is not a tracking URI")])
def test_bad_tracker_values_in_env_exit_2_with_one_line(runner, pair, words):
    r = runner.invoke(main, ["render", "--name", "demo", "--storage-path", "s3://b/runs",
                             "--env", pair])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and words in r.output, r.output
