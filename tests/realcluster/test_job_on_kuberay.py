"""Jobs on the real API server and the real KubeRay operator, submitted as the README says, by a
user bound only to the Role of docs/cluster/user-role.yaml: the pods are processes of the
process kubelet (tests/support/kubelet), each in its own network and mount namespaces.

Each test is one small real run (the tiny GPT-2, 2 worker pods): minutes, so few of them, each
checking all it can of one run."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.polling import wait_for
from tests.support.real_cluster import NAMESPACE, events_of, job_file
from tests.support.s3 import running_s3

pytestmark = pytest.mark.timeout(1500)


def _checkpoints(events: list[dict]) -> list[dict]:
    return events_of(events, "checkpoint_saved")


def test_the_readme_cluster_path_survives_a_deleted_worker_pod(control_plane, tmp_path):
    """`submit --watch` to Complete on the real operator while a worker pod is deleted mid-run
    (the run resumes from its last checkpoint); then `status`, `list`, `logs`; the checkpoints on
    the PVC; `delete` keeps the PVC while the garbage collector removes what the RayJob owned and
    nothing else."""
    cp, name = control_plane, "rc-main"
    foreign = cp.core.create_namespaced_config_map(NAMESPACE, {
        "metadata": {"generateName": "another-teams-settings-"}, "data": {"keep": "me"}})
    watch = cp.submitter_in_background("submit", "-f", str(job_file(tmp_path, name=name)), "--watch",
                                       log=tmp_path / "watch.log")
    try:
        wait_for("a first checkpoint", lambda: _checkpoints(cp.events(name)), 900,
                 lambda: (tmp_path / "watch.log").read_text() + cp.story())
        workers = cp.pods(f"ray.io/node-type=worker,ray.io/cluster={cp.rayjob(name)['status']['rayClusterName']}")
        assert len(workers) == 2, [p.metadata.name for p in workers]
        cp.core.delete_namespaced_pod(workers[0].metadata.name, NAMESPACE)  # a preempted node
        code = watch.wait(1200)
    finally:
        if watch.poll() is None:
            watch.kill()
    watched = (tmp_path / "watch.log").read_text()
    assert code == 0, watched + cp.story()
    assert "SUCCEEDED" in watched and "worker group restarted" in watched, watched
    rayjob = cp.rayjob(name)
    assert rayjob["status"]["jobDeploymentStatus"] == "Complete", rayjob["status"]
    # the operator's fallback when the submitter Job never completes would pass for success
    assert rayjob["status"].get("reason") != "TransitionGracePeriodExceeded", rayjob["status"]
    events = cp.events(name)
    restarts = events_of(events, "worker_group_restarted")
    assert restarts, [e["type"] for e in events]
    before = [e for e in _checkpoints(events) if e["seq"] < restarts[0]["seq"]]
    assert restarts[0]["resumed_from"] == before[-1]["path"], (restarts[0], before)
    after = [e for e in events_of(events, "progress") if e["seq"] > restarts[0]["seq"]]
    assert after and before[-1]["step"] < after[0]["step"] <= before[-1]["step"] + 10, (after[:1], before[-1])
    assert "resumed from" in watched
    # Ray Train recovered inside the attempt: no RayJob retry (a new RayCluster)
    assert not rayjob["status"].get("failed"), rayjob["status"]
    assert events[-1]["type"] == "run_finished", events[-1]
    # the checkpoints are on the claim's volume, where the next run of this name resumes
    volume = cp.volume_dir(f"{name}-checkpoints")
    run_dir = volume / NAMESPACE / name
    assert sorted(p.name for p in run_dir.glob("checkpoint_*")), sorted(p.name for p in run_dir.iterdir())
    # status, list and logs as the user sees them
    status = cp.submitter("status", name, "-o", "json")
    assert status.returncode == 0, status.stderr
    state = json.loads(status.stdout)
    assert state["state"] == "SUCCEEDED" and state["restarts"] >= 1, state
    listed = cp.submitter("list")
    assert listed.returncode == 0 and name in listed.stdout and "SUCCEEDED" in listed.stdout, listed
    logs = cp.submitter("logs", name)
    assert logs.returncode == 0, logs.stderr
    assert "run_finished" in logs.stdout or "succeeded" in logs.stdout.lower(), logs.stdout[-2000:]
    # delete: the PVC and its checkpoints stay; the garbage collector removes what the RayJob
    # owned (the RayCluster, its pods and Service, the submitter Job), and nothing else
    cluster = rayjob["status"]["rayClusterName"]
    deleted = cp.submitter("delete", name)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    wait_for("the RayJob and what it owned gone", lambda: cp.rayjob(name) is None and not cp.pods(
        f"ray.io/cluster={cluster}") and not cp.batch.list_namespaced_job(NAMESPACE).items, 300, cp.story)
    assert cp.core.read_namespaced_persistent_volume_claim(f"{name}-checkpoints", NAMESPACE).status.phase == "Bound"
    assert list(run_dir.glob("checkpoint_*"))
    kept = cp.core.read_namespaced_config_map(foreign.metadata.name, NAMESPACE)
    assert kept.data == {"keep": "me"} and kept.metadata.uid == foreign.metadata.uid
    cp.core.delete_namespaced_config_map(foreign.metadata.name, NAMESPACE)


def test_stop_then_resume_continues_from_the_checkpoint_in_a_bucket(control_plane, tmp_path):
    """The other storage: an S3 bucket (moto's server, reached by the pods at the bridge's host
    address), its credentials in a Secret the platform team made (the user may not create one)."""
    cp, name = control_plane, "rc-stop"
    host = json.loads((cp.root / "state.json").read_text())["host_ip"]
    with running_s3(host) as s3:
        s3.make_bucket("runs")
        cp.core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": f"{name}-s3"}, "stringData": s3.env})
        job = job_file(tmp_path, name=name, max_steps_per_epoch=60, checkpoint_every=20,
                       storage_path="s3://runs/jobs", env_from_secret=[f"{name}-s3"],
                       allow_ephemeral_storage=False)
        try:
            submitted = cp.submitter("submit", "-f", str(job))
            assert submitted.returncode == 0, submitted.stdout + submitted.stderr
            wait_for("a first checkpoint", lambda: _checkpoints(cp.events(name)), 900, cp.story)
            stopped = cp.submitter("stop", name)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            wait_for("the cluster gone while suspended", lambda: cp.rayjob(name)["status"].get(
                "jobDeploymentStatus") == "Suspended" and not cp.pods(f"submitter.dev/job={name},ray.io/node-type"),
                300, cp.story)
            saved = _checkpoints(cp.events(name))[-1]
            resumed = cp.submitter("resume", name, "--watch", timeout=1200)
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr + cp.story()
            events = cp.events(name)
            restart = events_of(events, "run_resumed")
            assert restart and restart[-1]["resumed_from"] == saved["path"], ([e["type"] for e in events], saved)
            assert restart[-1]["step"] >= saved["step"], (restart[-1], saved)
            assert events[-1]["type"] == "run_finished"
            stored = s3.list(f"runs/jobs/{NAMESPACE}/{name}")
            assert any("/checkpoint_" in key for key in stored), stored
        finally:
            cp.submitter("delete", name)
            cp.core.delete_namespaced_secret(f"{name}-s3", NAMESPACE)


FAILING = '''
import ray.train
from ray.train.torch import TorchTrainer


def train_func():
    raise RuntimeError("the worker's own error: batch of shape (3, 7) does not fit")


TorchTrainer(train_func, scaling_config=ray.train.ScalingConfig(num_workers=2)).fit()
'''


def test_a_failing_script_ends_watch_with_1_and_the_workers_error(control_plane, tmp_path):
    cp, name = control_plane, "rc-fail"
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(FAILING)
    tiny = yaml.safe_load(job_file(tmp_path, name=name).read_text())
    job = tmp_path / "script-job.yaml"  # the cluster's part of the tiny job, no model or data
    job.write_text(yaml.safe_dump({k: tiny[k] for k in (
        "name", "replicas", "cpu_per_pod", "head_cpu", "head_memory",
        "allow_ephemeral_storage", "ray_auth", "termination_grace_period")} | {
        "max_failures": 0, "backoff_limit": 0, "memory_per_pod": "6Gi"}))
    watched = cp.submitter("submit", "-f", str(job), "--script", str(code / "train.py"), "--watch",
                           timeout=1200, cwd=code)
    assert watched.returncode == 1, watched.stdout + watched.stderr + cp.story()
    last = watched.stderr.strip().splitlines()[-1]  # what the terminal shows last
    assert "RuntimeError" in last and "does not fit" in last, watched.stderr[-3000:]
    assert cp.submitter("delete", name).returncode == 0


def test_a_verb_the_role_lacks_exits_7_and_nothing_is_written(control_plane, tmp_path):
    """The user's Role is in its own namespace only: anywhere else every verb is missing."""
    cp = control_plane
    result = cp.submitter("submit", "-f", str(job_file(tmp_path, name="rc-elsewhere")), "-n", "default")
    assert result.returncode == 7, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "forbidden" in result.stderr.lower(), result.stderr
    assert not cp.custom.list_namespaced_custom_object("ray.io", "v1", "default", "rayjobs")["items"]


def test_authoptions_on_an_operator_without_it_is_refused_in_one_line_exit_10(control_plane, tmp_path):
    """KubeRay v1.5.0's CRD has no `authOptions` (1.5.1 added it): the real API server's strict
    field validation refuses it; the CLI says which field and which version, writes nothing."""
    cp = control_plane
    result = cp.submitter("submit", "-f", str(job_file(tmp_path, name="rc-auth", ray_auth="token")))
    assert result.returncode == 10, result.stdout + result.stderr
    line = result.stderr.strip().splitlines()
    assert len(line) == 1 and "authOptions" in line[0] and "1.5.1" in line[0] and "nothing was written" in line[0], line
    assert cp.rayjob("rc-auth") is None
    assert not [c for c in cp.core.list_namespaced_config_map(NAMESPACE).items if c.metadata.name.startswith("rc-auth")]


def test_a_foreign_object_with_the_jobs_name_is_refused_and_left_alone(control_plane, tmp_path):
    """Another team's ConfigMap holds the name the job's progress ConfigMap would take: submit
    refuses in one line, and neither it nor anything of the job is written."""
    cp, name = control_plane, "rc-taken"
    theirs = cp.core.create_namespaced_config_map(NAMESPACE, {
        "metadata": {"name": f"{name}-progress", "labels": {"team": "other"}}, "data": {"k": "v"}})
    try:
        result = cp.submitter("submit", "-f", str(job_file(tmp_path, name=name)))
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"configmap/{name}-progress" in lines[0] and "not job" in lines[0], lines
        kept = cp.core.read_namespaced_config_map(f"{name}-progress", NAMESPACE)
        assert kept.metadata.resource_version == theirs.metadata.resource_version and kept.data == {"k": "v"}
        assert cp.rayjob(name) is None
        assert not [c for c in cp.core.list_namespaced_persistent_volume_claim(NAMESPACE).items
                    if c.metadata.name.startswith(name)]
    finally:
        cp.core.delete_namespaced_config_map(f"{name}-progress", NAMESPACE)
