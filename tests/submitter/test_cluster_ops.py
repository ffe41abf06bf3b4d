"""status, list, logs, delete and resume against the API emulator, through the CLI."""

from __future__ import annotations

import io
import json

import yaml

from submitter.cli import main
from submitter.contract import naming
from submitter.contract.spec import JobSpec
from tests.support.fake_operator import FakeOperator
from tests.support.kube_emulator import RAYJOBS

PVCS = "v1/persistentvolumeclaims"


def cli(runner, kubeconfig, *args):
    return runner.invoke(main, [*args, "--kubeconfig", kubeconfig])


def submitted(runner, kubeconfig, api, name="gpt2-demo", *extra):
    result = cli(runner, kubeconfig, "submit", "--name", name, *extra)
    assert result.exit_code == 0, result.output
    return FakeOperator(api.emulator, name, extra[extra.index("-n") + 1] if "-n" in extra else "default")


def test_status_table_json_and_yaml(api, kubeconfig, runner):
    op = submitted(runner, kubeconfig, api)
    op.initialize()
    op.run()
    op.step(1, 120, loss=3.1416, tokens_per_sec=45678)
    op.emit("checkpoint_saved", epoch=1, path="/mnt/checkpoints/gpt2-demo/checkpoint_000003")
    table = cli(runner, kubeconfig, "status", "gpt2-demo")
    assert table.exit_code == 0, table.output
    header, row = table.stdout.splitlines()
    assert header.split() == ["JOB", "STATE", "JOBSTATUS", "DEPLOYMENT", "EPOCH", "STEP", "LOSS",
                              "TOKENS/S", "LAST", "CHECKPOINT", "RESTARTS", "AGE"]
    assert row.split()[:10] == ["gpt2-demo", "RUNNING", "RUNNING", "Running", "1", "120", "3.1416",
                                "45,678", "/mnt/checkpoints/gpt2-demo/checkpoint_000003", "0"]
    as_json = json.loads(cli(runner, kubeconfig, "status", "gpt2-demo", "-o", "json").stdout)
    assert as_json["state"] == "RUNNING" and as_json["step"] == 120 and as_json["tokensPerSec"] == 45678
    as_yaml = yaml.safe_load(cli(runner, kubeconfig, "status", "gpt2-demo", "-o", "yaml").stdout)
    assert as_yaml == as_json


def test_status_of_inconsistent_job_shows_failed_and_a_note(api, kubeconfig, runner):
    op = submitted(runner, kubeconfig, api)
    op.initialize()
    op.run()
    op.deadline_exceeded_while_running()
    result = cli(runner, kubeconfig, "status", "gpt2-demo")
    assert result.stdout.splitlines()[1].split()[:4] == ["gpt2-demo", "FAILED", "RUNNING", "Failed"]
    assert "note: gpt2-demo: jobStatus still says RUNNING" in result.stderr


def test_status_of_missing_job_and_invalid_name(api, kubeconfig, runner):
    missing = cli(runner, kubeconfig, "status", "nope")
    assert missing.exit_code == 6 and "no RayJob nope in namespace default" in missing.output
    invalid = cli(runner, kubeconfig, "status", "Bad_Name")
    assert invalid.exit_code == 2 and invalid.output.count("\n") == 1


def test_list_namespace_and_all_namespaces(api, kubeconfig, runner):
    api.emulator.put("v1", "namespaces", {"metadata": {"name": "team-a"}})
    submitted(runner, kubeconfig, api, "job-one")
    other = submitted(runner, kubeconfig, api, "job-two", "-n", "team-a")
    other.initialize()
    api.emulator.put("ray.io/v1", "rayjobs", {"apiVersion": "ray.io/v1", "kind": "RayJob",
                                              "metadata": {"name": "not-ours", "namespace": "default"}})
    here = cli(runner, kubeconfig, "list")
    assert [line.split()[0] for line in here.stdout.splitlines()] == ["JOB", "job-one"]
    everywhere = json.loads(cli(runner, kubeconfig, "list", "-A", "-o", "json").stdout)
    assert [(j["namespace"], j["job"], j["state"]) for j in everywhere] == [
        ("default", "job-one", "PENDING"), ("team-a", "job-two", "STARTING")]
    empty = cli(runner, kubeconfig, "list", "-n", "kube-system")
    assert empty.exit_code == 0 and "no submitter jobs in namespace kube-system" in empty.output


def test_logs_print_the_submitter_pod_log(api, kubeconfig, runner):
    op = submitted(runner, kubeconfig, api)
    no_pod = cli(runner, kubeconfig, "logs", "gpt2-demo")
    assert no_pod.exit_code == 6 and "no submitter pod yet (PENDING)" in no_pod.output
    op.initialize()
    op.run()
    op.step(1, 10)
    op.submitter_pod(["old attempt"], suffix="aaaaa")
    op.submitter_pod(op.driver_lines(), suffix="zzzzz")
    for args in ((), ("-f",)):
        result = cli(runner, kubeconfig, "logs", "gpt2-demo", *args)
        assert result.exit_code == 0, result.output
        assert "Job submitted" in result.stdout and "SUBMITTER_EVENT " in result.stdout
    log_requests = [(p, q) for m, p, q in api.emulator.log if p.endswith("/log")]
    assert log_requests[-2:] == [("/api/v1/namespaces/default/pods/gpt2-demo-zzzzz/log", {}),
                                 ("/api/v1/namespaces/default/pods/gpt2-demo-zzzzz/log", {"follow": "true"})]
    legacy = submitted(runner, kubeconfig, api, "legacy-job")
    legacy.submitter_pod(["from a 1.26 cluster"], legacy_labels=True)
    assert "from a 1.26 cluster" in cli(runner, kubeconfig, "logs", "legacy-job").stdout


def stored_run(storage, namespace="default", name="gpt2-demo", *, ended=True):
    """What the driver keeps under <storage>/<namespace>/<name>/ (training.run.logs): two driver
    sessions (a RayJob retry), the first rotated once, and a worker's error log."""
    from submitter.contract import events as ev
    from submitter.contract import run_logs as names

    run = storage / namespace / name
    logs = run / names.LOGS_DIR
    logs.mkdir(parents=True)
    first = names.driver_log_name("20261122T010000Z", 11)
    (logs / f"{first}.1").write_text("session 1, part 1\n")
    (logs / first).write_text("session 1, part 2: preempted\n")
    (logs / names.driver_log_name("20261122T020000Z", 12)).write_text("session 2: run finished\n")
    (logs / names.worker_err_name(0)).write_text("=== worker rank 0 failed ===\nTraceback ...\n")
    last = ev.make_event("run_finished", seq=2) if ended else ev.make_event(
        "run_failed", seq=2, error="preempted (SIGTERM)", reason="preemption")
    (run / naming.EVENTS_FILE).write_text(ev.to_json(last) + "\n")
    return run


def test_logs_fall_back_to_the_runs_stored_logs_when_the_pods_are_gone(api, kubeconfig, runner, tmp_path):
    op = submitted(runner, kubeconfig, api)
    op.initialize()
    op.run()
    pod = op.submitter_pod(["from the pod"])
    live = cli(runner, kubeconfig, "logs", "gpt2-demo", "--storage-path", str(tmp_path))
    assert live.stdout == "from the pod\n" and f"logs: the submitter pod {pod}" in live.stderr
    # the job ends and the cluster goes (shutdownAfterJobFinishes): no pod left
    op.succeed()
    api.emulator.remove("v1/pods", "default", pod)
    on_its_volume = cli(runner, kubeconfig, "logs", "gpt2-demo")  # its PVC is not mounted here
    assert on_its_volume.exit_code == 6 and "give --storage-path where that volume is mounted" \
        in on_its_volume.output and on_its_volume.output.count("\n") == 1
    run = stored_run(tmp_path)
    kept = cli(runner, kubeconfig, "logs", "gpt2-demo", "--storage-path", str(tmp_path))
    assert kept.exit_code == 0, kept.output
    assert kept.stderr == (f"logs: the pods are gone; the run's stored logs at {run}/logs/: "
                           "2 driver session(s), 1 worker error log(s)\n")
    assert kept.stdout == ("session 1, part 1\nsession 1, part 2: preempted\nsession 2: run finished\n"
                           "--- worker-0.err.log ---\n=== worker rank 0 failed ===\nTraceback ...\n")
    followed = cli(runner, kubeconfig, "logs", "gpt2-demo", "-f", "--storage-path", str(tmp_path))
    assert followed.exit_code == 0 and followed.stdout == kept.stdout  # the run ended: -f returns
    # after delete, and for a run found only on storage (no cluster to ask at all)
    assert cli(runner, kubeconfig, "delete", "gpt2-demo").exit_code == 0
    deleted = cli(runner, kubeconfig, "logs", "gpt2-demo", "--storage-path", str(tmp_path))
    assert deleted.stdout == kept.stdout and deleted.stderr.startswith("logs: no RayJob; the run's stored logs")
    no_cluster = runner.invoke(main, ["logs", "gpt2-demo", "--storage-path", str(tmp_path),
                                      "--kubeconfig", str(tmp_path / "none")])
    assert no_cluster.exit_code == 0 and no_cluster.stdout == kept.stdout, no_cluster.output
    assert no_cluster.stderr.splitlines()[0].startswith("logs: cannot ask the cluster")
    nothing = cli(runner, kubeconfig, "logs", "gpt2-demo")
    assert nothing.exit_code == 6 and "give its --storage-path" in nothing.output


def test_logs_follow_the_stored_log_until_the_run_ends(tmp_path):
    from submitter.stored_logs import find_run, follow_logs, show

    run_dir = stored_run(tmp_path, ended=False)  # preempted: a retry will write on
    run = find_run(str(tmp_path), "gpt2-demo", "default")
    out = io.StringIO()
    printed = show(run, out)
    newest = sorted((run_dir / "logs").glob("driver-*Z-12.log"))[0]
    polls: list[int] = []

    def the_retry_writes_then_finishes(seconds):
        polls.append(1)
        if len(polls) == 1:
            with open(newest, "a") as f:
                f.write("step 90\n")
        elif len(polls) == 2:
            from submitter.contract import events as ev

            (run_dir / naming.EVENTS_FILE).write_text(ev.to_json(ev.make_event("run_finished", seq=3)) + "\n")
            with open(newest, "a") as f:
                f.write("run finished for good\n")

    follow_logs(run, out, printed, sleep=the_retry_writes_then_finishes)
    assert out.getvalue().endswith("step 90\nrun finished for good\n") and len(polls) == 3


def test_stored_logs_are_listed_once_to_find_count_and_show_them(tmp_path, monkeypatch):
    """On a bucket every listing is a LIST request: finding the run, the summary line and
    printing the logs share one."""
    from submitter import stored_logs

    stored_run(tmp_path, ended=True)
    listed: list[str] = []
    names = stored_logs.RunFiles.names
    monkeypatch.setattr(stored_logs.RunFiles, "names",
                        lambda self, sub: listed.append(sub) or names(self, sub))
    run = stored_logs.find_run(str(tmp_path), "gpt2-demo", "default")
    line = stored_logs.summary(run)
    out = io.StringIO()
    stored_logs.show(run, out)
    assert listed == ["logs"] and "driver session(s)" in line and out.getvalue()


def test_delete_removes_job_objects_and_keeps_the_pvc(api, kubeconfig, runner):
    submitted(runner, kubeconfig, api)
    result = cli(runner, kubeconfig, "delete", "gpt2-demo")
    assert result.exit_code == 0, result.output
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo") is None
    for gvr in ("v1/serviceaccounts", "v1/configmaps", "rbac.authorization.k8s.io/v1/roles",
                "rbac.authorization.k8s.io/v1/rolebindings"):
        assert api.emulator.get(gvr, "default", "gpt2-demo-progress") is None
    assert api.emulator.get(PVCS, "default", "gpt2-demo-checkpoints") is not None
    assert "kept persistentvolumeclaim/gpt2-demo-checkpoints" in result.stdout
    assert not [p for m, p, q in api.emulator.log if m == "DELETE" and "persistentvolumeclaims" in p]
    again = cli(runner, kubeconfig, "delete", "gpt2-demo")
    assert again.exit_code == 6 and "nothing to delete" in again.output


def test_delete_pvc_only_when_named_and_only_ours(api, kubeconfig, runner):
    submitted(runner, kubeconfig, api)
    api.emulator.put("v1", "persistentvolumeclaims", {"metadata": {"name": "team-data", "namespace": "default"},
                                                      "spec": {"accessModes": ["ReadWriteMany"]}})
    foreign = cli(runner, kubeconfig, "delete", "gpt2-demo", "--delete-pvc", "team-data")
    assert foreign.exit_code == 2 and "not created by submitter for job gpt2-demo" in foreign.output
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo") is not None  # refused before any delete
    assert api.emulator.get(PVCS, "default", "team-data") is not None
    ours = cli(runner, kubeconfig, "delete", "gpt2-demo", "--delete-pvc", "gpt2-demo-checkpoints")
    assert ours.exit_code == 0, ours.output
    assert api.emulator.get(PVCS, "default", "gpt2-demo-checkpoints") is None
    assert "persistentvolumeclaim/gpt2-demo-checkpoints" in ours.stdout


def test_delete_keeps_an_existing_pvc_and_names_it(api, kubeconfig, runner):
    api.emulator.put("v1", "persistentvolumeclaims", {"metadata": {"name": "shared", "namespace": "default"},
                                                      "spec": {"accessModes": ["ReadWriteMany"]}})
    submitted(runner, kubeconfig, api, "gpt2-demo", "--existing-pvc", "shared")
    result = cli(runner, kubeconfig, "delete", "gpt2-demo")
    assert result.exit_code == 0 and "kept persistentvolumeclaim/shared" in result.stdout
    assert "not this job's PVC" in result.stdout and "--delete-pvc shared" not in result.stdout
    assert api.emulator.get(PVCS, "default", "shared") is not None


def test_resume_replaces_a_failed_rayjob_with_the_next_attempt(api, kubeconfig, runner):
    op = submitted(runner, kubeconfig, api)
    op.initialize()
    op.run()
    op.emit("checkpoint_saved", epoch=1, path="/mnt/checkpoints/gpt2-demo/checkpoint_000001")
    op.fail()
    old = api.emulator.get(RAYJOBS, "default", "gpt2-demo")
    pvc_before = api.emulator.get(PVCS, "default", "gpt2-demo-checkpoints")
    cm_before = api.emulator.get("v1/configmaps", "default", "gpt2-demo-progress")
    result = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert result.exit_code == 0, result.output
    new = api.emulator.get(RAYJOBS, "default", "gpt2-demo")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["spec"] == {**old["spec"], "suspend": False}
    head = new["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    job = JobSpec.from_document(next(e["value"] for e in head["env"] if e["name"] == "SUBMITTER_JOB"))
    assert job.run_name == "gpt2-demo"  # same Ray Train run name -> same checkpoints
    assert "status" not in new
    annotations = new["metadata"]["annotations"]
    assert annotations["submitter.dev/attempt"] == "2"
    assert json.loads(annotations["submitter.dev/previous-attempts"]) == [
        {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "reason": "AppFailed"}]
    deletes = [(p, q) for m, p, q in api.emulator.log if m == "DELETE"]
    assert deletes == [("/apis/ray.io/v1/namespaces/default/rayjobs/gpt2-demo", {})]
    # the PVC and ConfigMap keep everything; they gained the saved settings of the new attempt
    for gvr, name, before in ((PVCS, "gpt2-demo-checkpoints", pvc_before),
                              ("v1/configmaps", "gpt2-demo-progress", cm_before)):
        after = api.emulator.get(gvr, "default", name)
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert {k: v for k, v in after.items() if k != "metadata"} == {k: v for k, v in before.items() if k != "metadata"}
        saved = after["metadata"]["annotations"]
        assert saved[naming.JOB_DOCUMENT_ANNOTATION] == job.document() and saved["submitter.dev/attempt"] == "2"
    dry = [(m, q) for m, p, q in api.emulator.log if m == "POST" and "rayjobs" in p]
    strict = {"fieldManager": "submitter", "fieldValidation": "Strict"}
    assert dry[-2:] == [("POST", {**strict, "dryRun": "All"}), ("POST", strict)]
    assert "resumed as attempt 2" in result.stdout
    FakeOperator(api.emulator, "gpt2-demo").stop()
    third = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert third.exit_code == 0
    annotations = api.emulator.get(RAYJOBS, "default", "gpt2-demo")["metadata"]["annotations"]
    assert annotations["submitter.dev/attempt"] == "3"
    assert len(json.loads(annotations["submitter.dev/previous-attempts"])) == 2


def test_resume_refuses_running_succeeded_and_missing_jobs(api, kubeconfig, runner):
    op = submitted(runner, kubeconfig, api)
    op.initialize()
    op.run()
    running = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert running.exit_code == 8 and "is RUNNING, not finished" in running.output
    op.succeed()
    done = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert done.exit_code == 8 and "nothing to resume" in done.output
    assert not [m for m, p, q in api.emulator.log if m == "DELETE"]
    missing = cli(runner, kubeconfig, "resume", "other")
    assert missing.exit_code == 6 and "submit it again with the same --name" in missing.output


def test_resume_uid_precondition_protects_a_replaced_object(api, kube):
    from submitter.contract.errors import Conflict

    api.emulator.put("ray.io/v1", "rayjobs", {"apiVersion": "ray.io/v1", "kind": "RayJob",
                                              "metadata": {"name": "x", "namespace": "default"}})
    try:
        kube.delete("RayJob", "default", "x", uid="someone-elses-uid")
    except Conflict as e:
        assert "conflict on rayjobs/x" in str(e)
    else:
        raise AssertionError("no Conflict")
    assert api.emulator.get(RAYJOBS, "default", "x") is not None


def test_forbidden_list_names_verb_and_resource(api, kubeconfig, runner):
    api.emulator.deny("list", "rayjobs")
    result = cli(runner, kubeconfig, "list", "-A")
    assert result.exit_code == 7
    assert "you may not list rayjobs.ray.io" in result.output and "verb 'list'" in result.output


def test_every_cluster_command_has_namespace_context_kubeconfig_and_examples(runner):
    for command in ("watch", "status", "list", "logs", "stop", "delete", "resume"):
        text = runner.invoke(main, [command, "--help"]).output
        for flag in ("-n, --namespace", "--context", "--kubeconfig", "--request-timeout", "Examples:"):
            assert flag in text, (command, flag)


def test_context_flag_picks_the_kubeconfig_context(api, tmp_path, runner):
    import yaml as _yaml

    path = api.kubeconfig(tmp_path / "kc")
    config = _yaml.safe_load(open(path))
    config["clusters"].append({"name": "dead", "cluster": {"server": "http://127.0.0.1:9"}})
    config["contexts"].append({"name": "dead", "context": {"cluster": "dead", "user": "tester"}})
    config["current-context"] = "dead"
    open(path, "w").write(_yaml.safe_dump(config))
    assert cli(runner, path, "submit", "--name", "gpt2-demo", "--context", "emulator").exit_code == 0
    assert cli(runner, path, "status", "gpt2-demo", "--context", "emulator").exit_code == 0
    wrong = cli(runner, path, "status", "gpt2-demo", "--context", "nope")
    assert wrong.exit_code == 2 and "context 'nope'" in wrong.output


def test_in_cluster_config_is_used_in_a_pod(api, tmp_path, monkeypatch):
    """No kubeconfig, KUBERNETES_SERVICE_HOST set: the client loads the in-cluster config."""
    import kubernetes
    import pytest

    from submitter.cluster import status
    from submitter.contract.errors import NotFound
    from submitter.kube import Kube

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    loaded = []

    def load_incluster_config(client_configuration=None, **kwargs):
        loaded.append(True)
        client_configuration.host = api.url

    monkeypatch.setattr(kubernetes.config, "load_incluster_config", load_incluster_config)
    with pytest.raises(NotFound, match="no RayJob x in namespace default"):
        status(Kube(), "default", "x")  # a real request through the in-cluster configuration
    assert loaded == [True]


def test_kubectl_sees_what_submit_applied(api, kubeconfig, runner):
    """A second, independent client (kubectl) agrees with the emulator: discovery (the /api/v1
    groupVersion fix), lists with `kind`, and the RayJob's server-filled uid."""
    import subprocess

    submitted(runner, kubeconfig, api)

    def kubectl(*args):
        done = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert kubectl("get", "persistentvolumeclaims", "-n", "default", "-o", "name") == \
        "persistentvolumeclaim/gpt2-demo-checkpoints"
    uid = api.emulator.get(RAYJOBS, "default", "gpt2-demo")["metadata"]["uid"]
    assert kubectl("get", "rayjob", "gpt2-demo", "-n", "default", "-o", "jsonpath={.metadata.uid}") == uid
