"""Issue #9 against the API emulator: ownership (never adopt or delete another's objects), a
server dry run before the first write, a resume that cannot lose the job, and an API that
answers HTML, hangs or rejects credentials. Each test is named after the scenario it replays."""

from __future__ import annotations

import json
import time

import pytest

from submitter.cli import main
from submitter.contract import naming
from submitter.contract.spec import JobSpec
from tests.support.fake_operator import FakeOperator
from tests.support.kube_emulator import RAYJOBS

PVCS = "v1/persistentvolumeclaims"
CONFIGMAPS = "v1/configmaps"
WRITES = ("POST", "PATCH", "PUT", "DELETE")
JOB_OBJECTS = [(PVCS, "{}-checkpoints"), ("v1/serviceaccounts", "{}-progress"), (CONFIGMAPS, "{}-progress"),
               ("rbac.authorization.k8s.io/v1/roles", "{}-progress"),
               ("rbac.authorization.k8s.io/v1/rolebindings", "{}-progress"),
               ("networking.k8s.io/v1/networkpolicies", "{}"), (RAYJOBS, "{}")]


def cli(runner, kubeconfig, *args):
    return runner.invoke(main, [*args, "--kubeconfig", kubeconfig])


def submitted(runner, kubeconfig, api, name="gpt2-demo", *extra):
    result = cli(runner, kubeconfig, "submit", "--name", name, *extra)
    assert result.exit_code == 0, result.output
    return FakeOperator(api.emulator, name)


def real_writes(api, mark=0):
    """Writes that change something (not dry runs)."""
    return [(m, p) for m, p, q in api.emulator.requests_since(mark) if m in WRITES and q.get("dryRun") != "All"]


def one_line(result):
    assert "Traceback" not in result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    return result.output


def one_line_err(result):
    """The error after a watch's first status lines: one line on stderr."""
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def another_teams(api, gvr, name, **extra):
    """An object some other team made by hand: no submitter labels or annotations."""
    api.emulator.put(gvr.rsplit("/", 1)[0], gvr.rsplit("/", 1)[1],
                     {"metadata": {"name": name, "namespace": "default", "labels": {"team": "other"}}, **extra})
    return api.emulator.get(gvr, "default", name)


# --- 1. ownership ---------------------------------------------------------------------------------

def test_submit_x_refuses_another_teams_x_checkpoints_pvc_and_x_progress_configmap(api, kubeconfig, runner):
    pvc = another_teams(api, PVCS, "x-checkpoints", spec={"accessModes": ["ReadWriteMany"]})
    configmap = another_teams(api, CONFIGMAPS, "x-progress", data={"their": "data"})
    mark = len(api.emulator.log)
    result = cli(runner, kubeconfig, "submit", "--name", "x")
    assert result.exit_code == 2
    line = one_line(result)
    assert "persistentvolumeclaim/x-checkpoints and configmap/x-progress already exist" in line
    assert "another --name" in line and "--existing-pvc x-checkpoints" in line
    assert real_writes(api, mark) == [] and not [r for r in api.emulator.requests_since(mark) if r[0] in WRITES]
    assert api.emulator.get(PVCS, "default", "x-checkpoints") == pvc  # not even labelled
    assert api.emulator.get(CONFIGMAPS, "default", "x-progress") == configmap


def test_delete_x_with_delete_pvc_x_checkpoints_leaves_another_teams_pvc_and_configmap(api, kubeconfig, runner):
    another_teams(api, PVCS, "x-checkpoints", spec={"accessModes": ["ReadWriteMany"]})
    another_teams(api, CONFIGMAPS, "x-progress", data={"their": "data"})
    refused = cli(runner, kubeconfig, "delete", "x", "--delete-pvc", "x-checkpoints")
    assert refused.exit_code == 2 and "not created by submitter for job x" in one_line(refused)
    plain = cli(runner, kubeconfig, "delete", "x")
    assert plain.exit_code == 6 and "left configmap/x-progress alone" in one_line(plain)
    assert [m for m, p, q in api.emulator.log if m == "DELETE"] == []
    assert api.emulator.get(PVCS, "default", "x-checkpoints") is not None
    assert api.emulator.get(CONFIGMAPS, "default", "x-progress") is not None


def test_delete_pvc_a_checkpoints_is_refused_while_job_b_mounts_it_via_existing_pvc(api, kubeconfig, runner):
    submitted(runner, kubeconfig, api, "a")
    submitted(runner, kubeconfig, api, "b", "--existing-pvc", "a-checkpoints")
    mark = len(api.emulator.log)
    refused = cli(runner, kubeconfig, "delete", "a", "--delete-pvc", "a-checkpoints")
    assert refused.exit_code == 2
    assert "still mounted by rayjob/b" in one_line(refused) and "Nothing deleted" in refused.output
    assert real_writes(api, mark) == []
    assert api.emulator.get(RAYJOBS, "default", "a") is not None  # refused before any delete
    assert cli(runner, kubeconfig, "delete", "b").exit_code == 0
    ok = cli(runner, kubeconfig, "delete", "a", "--delete-pvc", "a-checkpoints")
    assert ok.exit_code == 0, ok.output
    assert api.emulator.get(PVCS, "default", "a-checkpoints") is None


def test_delete_pvc_is_refused_while_a_pod_of_another_job_mounts_it(api, kubeconfig, runner):
    submitted(runner, kubeconfig, api, "a")
    api.emulator.put("v1", "pods", {"metadata": {"name": "debug-shell", "namespace": "default"},
                                    "spec": {"volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": "a-checkpoints"}}]}})
    api.emulator.put("v1", "pods", {"metadata": {"name": "a-head-x", "namespace": "default",
                                                 "labels": naming.labels("a")},
                                    "spec": {"volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": "a-checkpoints"}}]}})
    refused = cli(runner, kubeconfig, "delete", "a", "--delete-pvc", "a-checkpoints")
    assert refused.exit_code == 2 and "still mounted by pod/debug-shell;" in one_line(refused)  # not a's own pod
    assert api.emulator.get(PVCS, "default", "a-checkpoints") is not None


def test_submit_refuses_a_rayjob_of_the_same_name_that_is_not_ours(api, kubeconfig, runner):
    another_teams(api, RAYJOBS, "x", apiVersion="ray.io/v1", kind="RayJob", spec={"entrypoint": "theirs"})
    result = cli(runner, kubeconfig, "submit", "--name", "x")
    assert result.exit_code == 2 and "rayjob/x already exists" in one_line(result)
    assert [m for m, p, q in api.emulator.log if m in WRITES] == []
    stop = cli(runner, kubeconfig, "stop", "x")
    assert stop.exit_code == 8 and "not this submitter job's" in one_line(stop)


def test_same_job_name_in_another_namespace_is_another_job(api, kubeconfig, runner):
    """The job uid includes the namespace: an object copied from team-a's job is not ours here."""
    another_teams(api, CONFIGMAPS, "x-progress")
    api.emulator.merge(CONFIGMAPS, "default", "x-progress", {"metadata": {
        "labels": naming.labels("x"), "annotations": naming.annotations("team-a", "x")}})
    result = cli(runner, kubeconfig, "submit", "--name", "x")
    assert result.exit_code == 2 and "belongs to another job" in one_line(result)


def test_objects_of_older_submitter_versions_without_the_uid_annotation_are_ours(api, kubeconfig, runner):
    """Before job uids, submitter set the job label and managed-by label only: accepted, and the
    next submit adds the annotation."""
    api.emulator.put("v1", "persistentvolumeclaims", {
        "metadata": {"name": "x-checkpoints", "namespace": "default", "labels": naming.labels("x")},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Gi"}}}})
    result = cli(runner, kubeconfig, "submit", "--name", "x")
    assert result.exit_code == 0, result.output
    annotations = api.emulator.get(PVCS, "default", "x-checkpoints")["metadata"]["annotations"]
    assert naming.annotations("default", "x").items() <= annotations.items()


def test_a_rayjob_created_by_someone_else_after_preflight_is_not_overwritten(api, kube):
    """The create is a POST: a 409 is checked (someone else's -> refused), never force-applied."""
    from submitter import cluster
    from submitter.contract.errors import Conflict
    from submitter.ownership import owned_objects
    from submitter.render import render

    spec = JobSpec.build(name="x")
    objects = [o for o in owned_objects(render(spec), spec) if o["kind"] == "RayJob"]
    theirs = another_teams(api, RAYJOBS, "x", apiVersion="ray.io/v1", kind="RayJob", spec={"entrypoint": "theirs"})
    with pytest.raises(Conflict, match="created by someone else while submitting"):
        cluster.install(kube, objects, {"rayjob/x": None})  # as if preflight had found nothing
    assert api.emulator.get(RAYJOBS, "default", "x") == theirs
    # ...while our own create that landed before a retry is simply "unchanged"
    api.emulator.remove(RAYJOBS, "default", "x")
    cluster.install(kube, objects, {"rayjob/x": None})
    report, _ = cluster.install(kube, objects, {"rayjob/x": None})
    assert report.done == [("rayjob/x", "unchanged")]


# --- 3. a server dry run before the first write ---------------------------------------------------

def test_api_rejecting_the_rayjob_leaves_no_pvc_rbac_or_configmap_behind(api, kubeconfig, runner):
    api.emulator.fail("POST", r"/rayjobs$", status=422, times=10)
    result = cli(runner, kubeconfig, "submit", "--name", "gpt2-demo")
    assert result.exit_code == 10
    assert "rejected rayjobs/gpt2-demo" in one_line(result) and "nothing was written" in result.output
    for gvr, name in JOB_OBJECTS:
        assert api.emulator.get(gvr, "default", name.format("gpt2-demo")) is None, name
    assert real_writes(api) == []


# --- 4. resume never loses the job ----------------------------------------------------------------

def failed_job(runner, kubeconfig, api, *extra):
    op = submitted(runner, kubeconfig, api, "gpt2-demo", *extra)
    op.initialize()
    op.run()
    op.fail()
    return api.emulator.get(RAYJOBS, "default", "gpt2-demo")


def test_resume_that_gets_500s_after_the_delete_can_be_run_again(api, kubeconfig, runner, monkeypatch):
    monkeypatch.setenv("SUBMITTER_API_RETRIES", "1")
    old = failed_job(runner, kubeconfig, api, "--replicas", "3")
    api.emulator.fail("POST", r"/rayjobs$", status=500, times=100, dry_run=False)
    broken = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert broken.exit_code == 4
    line = one_line(broken)
    assert "rayjob/gpt2-demo was deleted and not recreated" in line
    assert "saved on persistentvolumeclaim/gpt2-demo-checkpoints" in line and "submitter resume gpt2-demo -n default again" in line
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo") is None
    api.emulator.faults.clear()
    again = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert again.exit_code == 0, again.output
    assert "recreated from the settings saved on persistentvolumeclaim/gpt2-demo-checkpoints as attempt 2" in again.output
    new = api.emulator.get(RAYJOBS, "default", "gpt2-demo")
    assert new["spec"] == {k: v for k, v in old["spec"].items() if k != "suspend"}
    assert new["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 3
    assert json.loads(new["metadata"]["annotations"]["submitter.dev/previous-attempts"])[0]["jobStatus"] == "FAILED"


def test_resume_whose_delete_waits_on_a_finalizer_can_be_run_again(api, kube, kubeconfig, runner):
    from submitter.lifecycle import resume_job
    from submitter.contract.errors import ClusterError

    failed_job(runner, kubeconfig, api)
    api.emulator.merge(RAYJOBS, "default", "gpt2-demo", {"metadata": {"finalizers": ["ray.io/rayjob-finalizer"]}})
    with pytest.raises(ClusterError, match="not deleted within 0.5s.*deleted and not recreated.*again"):
        resume_job(kube, "default", "gpt2-demo", out=open("/dev/null", "w"), wait_seconds=0.5)
    waiting = cli(runner, kubeconfig, "resume", "gpt2-demo")
    # a Foreground delete adds the GC's `foregroundDeletion` finalizer (as a real API server does)
    assert waiting.exit_code == 8 and \
        "still being deleted (finalizers: ray.io/rayjob-finalizer, foregroundDeletion)" in one_line(waiting)
    api.emulator.remove(RAYJOBS, "default", "gpt2-demo")  # the operator lets go
    again = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert again.exit_code == 0, again.output
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo")["metadata"]["annotations"]["submitter.dev/attempt"] == "2"


def test_a_resume_the_api_would_reject_leaves_the_old_job_alone(api, kubeconfig, runner):
    old = failed_job(runner, kubeconfig, api)
    api.emulator.fail("POST", r"/rayjobs$", status=422, times=1, dry_run=True)
    result = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert result.exit_code == 10 and "gpt2-demo was left as it was" in one_line(result)
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo") == old


# --- #11 item 4: the lifecycle ----------------------------------------------------------------------

def test_resume_after_delete_recreates_the_job_with_no_flags_retyped(api, kubeconfig, runner):
    old = failed_job(runner, kubeconfig, api, "--replicas", "3", "--epochs", "7")
    deleted = cli(runner, kubeconfig, "delete", "gpt2-demo")
    assert deleted.exit_code == 0 and "submitter resume gpt2-demo -n default recreates the job" in deleted.output
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo") is None
    result = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert result.exit_code == 0, result.output
    for gvr, name in JOB_OBJECTS:
        assert api.emulator.get(gvr, "default", name.format("gpt2-demo")) is not None, name
    new = api.emulator.get(RAYJOBS, "default", "gpt2-demo")
    assert new["spec"] == {k: v for k, v in old["spec"].items() if k != "suspend"}
    annotations = new["metadata"]["annotations"]
    assert annotations["submitter.dev/attempt"] == "2"
    assert json.loads(annotations["submitter.dev/previous-attempts"]) == [
        {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "reason": "AppFailed"}]


def test_resume_of_a_deleted_job_without_saved_settings_says_how_to_continue(api, kubeconfig, runner):
    result = cli(runner, kubeconfig, "resume", "gone")
    assert result.exit_code == 6 and "no saved settings" in one_line(result)
    assert "submit it again with the same --name" in result.output


def test_stop_suspends_and_resume_unsuspends_the_same_rayjob(api, kubeconfig, runner):
    op = submitted(runner, kubeconfig, api)
    op.initialize()
    op.run()
    uid = api.emulator.get(RAYJOBS, "default", "gpt2-demo")["metadata"]["uid"]
    stopped = cli(runner, kubeconfig, "stop", "gpt2-demo")
    assert stopped.exit_code == 0 and "spec.suspend: true" in stopped.output
    rayjob = api.emulator.get(RAYJOBS, "default", "gpt2-demo")
    assert rayjob["spec"]["suspend"] is True and rayjob["metadata"]["annotations"]["submitter.dev/stopped"]
    op.set("Suspended", "STOPPED")
    again = cli(runner, kubeconfig, "stop", "gpt2-demo")
    assert again.exit_code == 0 and "already stopped" in again.output
    status = cli(runner, kubeconfig, "status", "gpt2-demo", "-o", "json")
    assert json.loads(status.stdout)["state"] == "SUSPENDED"
    resumed = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert resumed.exit_code == 0 and "spec.suspend: false" in resumed.output
    rayjob = api.emulator.get(RAYJOBS, "default", "gpt2-demo")
    assert rayjob["spec"]["suspend"] is False and rayjob["metadata"]["uid"] == uid
    assert "submitter.dev/stopped" not in rayjob["metadata"]["annotations"]
    assert [m for m, p, q in api.emulator.log if m == "DELETE"] == []


def test_resume_of_a_job_suspended_by_kueue_says_kueue_admits_it(api, kubeconfig, runner):
    op = submitted(runner, kubeconfig, api)
    api.emulator.merge(RAYJOBS, "default", "gpt2-demo", {
        "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a-queue"}}, "spec": {"suspend": True}})
    op.set("Suspended", "")
    mark = len(api.emulator.log)
    result = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert result.exit_code == 8
    line = one_line(result)
    assert "SUSPENDED by Kueue (queue team-a-queue)" in line and "kubectl get workloads -n default" in line
    assert real_writes(api, mark) == []


def test_stop_of_a_finished_job_changes_nothing(api, kubeconfig, runner):
    op = submitted(runner, kubeconfig, api)
    op.succeed()
    mark = len(api.emulator.log)
    result = cli(runner, kubeconfig, "stop", "gpt2-demo")
    assert result.exit_code == 0 and "already ended (SUCCEEDED)" in result.output
    assert real_writes(api, mark) == []


# --- 5. API robustness ------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["html", "truncated"])
def test_api_answering_200_with_html_or_truncated_json_is_one_line_in_every_command(api, kubeconfig, runner, fault):
    submitted(runner, kubeconfig, api)
    api.emulator.fail("GET", r"", times=1000, **{fault: True})
    for args in (["status", "gpt2-demo"], ["watch", "gpt2-demo"], ["delete", "gpt2-demo"],
                 ["submit", "--name", "gpt2-demo"], ["resume", "gpt2-demo"], ["stop", "gpt2-demo"]):
        result = cli(runner, kubeconfig, *args)
        assert result.exit_code == 4, (args, result.output)
        assert "not Kubernetes JSON" in one_line(result), args
        if fault == "html":
            assert "HTML" in result.output and "Sign in" in result.output
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo") is not None


@pytest.mark.parametrize("command", [["status", "gpt2-demo"], ["watch", "gpt2-demo"], ["delete", "gpt2-demo"],
                                     ["submit", "--name", "gpt2-demo"]])
def test_hung_api_costs_at_most_the_request_timeout_and_exits_4(api, kubeconfig, runner, command):
    api.emulator.fail("GET", r"", hang=6, times=1000)
    started = time.monotonic()
    result = cli(runner, kubeconfig, *command, "--request-timeout", "1s")
    assert result.exit_code == 4, result.output
    assert time.monotonic() - started < 4
    assert "no answer from the Kubernetes API" in one_line(result) and "within 1s" in result.output


def test_request_timeout_must_be_a_duration(runner, kubeconfig):
    result = runner.invoke(main, ["status", "x", "--request-timeout", "soon", "--kubeconfig", kubeconfig])
    assert result.exit_code == 2 and "--request-timeout 'soon' is not a duration" in one_line(result)


def test_401_exits_4_could_not_observe(api, kubeconfig, runner):
    submitted(runner, kubeconfig, api)
    fault = api.emulator.fail("GET", r"/rayjobs", status=401, times=100)
    for command in ("watch", "status"):
        result = cli(runner, kubeconfig, command, "gpt2-demo")
        assert result.exit_code == 4 and "rejected the credentials (401)" in one_line(result)
    api.emulator.faults.remove(fault)
    api.emulator.fail("GET", r"/rayjobs$", status=401, times=100)  # only the watch (re)opening it
    result = cli(runner, kubeconfig, "watch", "gpt2-demo")
    assert result.exit_code == 4 and "rejected the credentials (401)" in one_line_err(result)


def test_api_that_hangs_when_watch_reconnects_exits_4_within_the_request_timeout(api, kubeconfig, runner):
    submitted(runner, kubeconfig, api)
    api.emulator.fail("GET", r"/rayjobs$", hang=6, times=100)  # the watch requests, not the first GET
    started = time.monotonic()
    result = cli(runner, kubeconfig, "watch", "gpt2-demo", "--request-timeout", "1s")
    assert result.exit_code == 4 and "within 1s" in one_line_err(result)
    assert time.monotonic() - started < 4


def test_two_submits_of_one_name_with_different_specs_cannot_both_succeed(api, kube, kubeconfig, runner):
    """Both passed preflight at the same moment (nothing existed): the second one's creates
    answer 409, its objects are found to be this job's, and the RayJob's spec differs: refused."""
    from submitter import cluster
    from submitter.contract.errors import Conflict
    from submitter.ownership import owned_objects
    from submitter.render import render

    submitted(runner, kubeconfig, api)
    spec = JobSpec.build(name="gpt2-demo", replicas=8)
    objects = owned_objects(render(spec), spec)
    with pytest.raises(Conflict, match=r"already exists \(PENDING\) with a different spec.*replicas: 2 -> 8"):
        cluster.install(kube, objects, {cluster._ref(o): None for o in objects})
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2


def test_crd_schema_rejecting_the_rayjob_in_the_dry_run_leaves_no_partial_apply(api, kube):
    """#9's `--cpu-per-pod ٤`: a value the CRD refuses used to fail after the PVC, RBAC and
    ConfigMap were applied. The emulator validates RayJobs against the KubeRay CRD schema."""
    from submitter import cluster
    from submitter.contract.errors import ClusterError
    from submitter.ownership import owned_objects
    from submitter.render import render
    from tests.support.schemas import rayjob_errors

    api.emulator.validate("rayjobs", rayjob_errors)
    spec = JobSpec.build(name="gpt2-demo")
    objects = owned_objects(render(spec), spec)
    assert cluster.install(kube, objects, {cluster._ref(o): None for o in objects}, dry_run_only=True)
    rayjob = objects[-1]
    rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "\u0664"  # Arabic-Indic 4
    with pytest.raises(ClusterError, match=r'RayJob.ray.io "gpt2-demo" is invalid: .*replicas.*nothing was written'):
        cluster.install(kube, objects, {cluster._ref(o): None for o in objects})
    for gvr, name in JOB_OBJECTS:
        assert api.emulator.get(gvr, "default", name.format("gpt2-demo")) is None, name
    assert real_writes(api) == []


def test_resume_refuses_to_delete_a_rayjob_whose_settings_cannot_be_saved(api, kubeconfig, runner):
    """An --existing-pvc job whose progress ConfigMap is gone: nowhere to keep the settings."""
    api.emulator.put("v1", "persistentvolumeclaims", {"metadata": {"name": "shared", "namespace": "default"},
                                                      "spec": {"accessModes": ["ReadWriteMany"]}})
    op = submitted(runner, kubeconfig, api, "gpt2-demo", "--existing-pvc", "shared")
    op.fail()
    api.emulator.remove(CONFIGMAPS, "default", "gpt2-demo-progress")
    old = api.emulator.get(RAYJOBS, "default", "gpt2-demo")
    result = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert result.exit_code == 8 and "cannot save gpt2-demo's settings" in one_line(result)
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo") == old
    again = cli(runner, kubeconfig, "submit", "--name", "gpt2-demo", "--existing-pvc", "shared")
    assert again.exit_code == 0 and "configmap/gpt2-demo-progress created" in again.output
    assert cli(runner, kubeconfig, "resume", "gpt2-demo").exit_code == 0


def test_dry_run_of_a_new_rolebinding_passes_while_its_new_role_does_not_exist_yet(api, kube):
    """A dry run persists nothing: for a user without the `bind` verb the API answers a
    RoleBinding's dry run with 404 while its Role is only planned (the emulator does so).
    Accepted when the Role is in the plan; a RoleBinding to a Role that is nowhere is refused."""
    from submitter import cluster
    from submitter.contract.errors import NotFound
    from submitter.ownership import owned_objects
    from submitter.render import render

    spec = JobSpec.build(name="gpt2-demo")
    objects = owned_objects(render(spec), spec)
    report, _ = cluster.install(kube, objects, {cluster._ref(o): None for o in objects}, dry_run_only=True)
    assert ("rolebinding/gpt2-demo-progress", "created") in report.done
    binding = [o for o in objects if o["kind"] == "RoleBinding"]
    with pytest.raises(NotFound, match="nothing was written"):
        cluster.install(kube, binding, {cluster._ref(binding[0]): None})
    assert real_writes(api) == []


def test_the_deadline_is_silence_not_age_a_slow_but_answering_api_is_fine(api, kubeconfig):
    """Every answer renews the deadline: a long watch or a command of many requests is fine;
    only an API that stays silent (or keeps failing) for --request-timeout gives up."""
    from submitter.kube import Kube

    kube = Kube(kubeconfig=kubeconfig, request_timeout=0.5)
    assert kube.find("ConfigMap", "default", "x") is None  # a 404 is an answer too
    time.sleep(0.7)
    assert kube.find("RayJob", "default", "x") is None


def test_submit_waits_for_a_checkpoint_pvc_that_is_being_deleted(api, kube, kubeconfig, runner):
    """Found on the real control plane: `delete --delete-pvc` leaves the claim Terminating while
    `kubernetes.io/pvc-protection` holds it, and a new job of that name "reused" it: the deleted
    run's checkpoints, then the volume gone under it. A submit now waits for it, one line, exit 8."""
    submitted(runner, kubeconfig, api)
    deleted = cli(runner, kubeconfig, "delete", "gpt2-demo")
    assert deleted.exit_code == 0, deleted.output
    api.emulator.merge(PVCS, "default", "gpt2-demo-checkpoints",
                       {"metadata": {"finalizers": ["kubernetes.io/pvc-protection"]}})
    kube.delete("PersistentVolumeClaim", "default", "gpt2-demo-checkpoints")  # Terminating
    mark = len(api.emulator.log)
    again = cli(runner, kubeconfig, "submit", "--name", "gpt2-demo")
    assert again.exit_code == 8, again.output
    assert "persistentvolumeclaim/gpt2-demo-checkpoints is being deleted (finalizers: " \
           "kubernetes.io/pvc-protection)" in one_line(again)
    assert not real_writes(api, mark)
