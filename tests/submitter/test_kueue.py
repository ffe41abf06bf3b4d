"""Kueue on the API emulator (tests/support/kueue.py plays Kueue's controller and webhook):
elastic ranges under a queue, stop/resume through the Workload, and re-submits of admitted jobs."""

from __future__ import annotations

import pytest

from submitter.cli import main
from submitter.cluster import differences, owned_by_others
from tests.support.kube_emulator import RAYJOBS
from tests.support.kueue import (
    ELASTIC_ANNOTATION, FLAVOR_NODE_SELECTOR, FLAVOR_TOLERATION, WEBHOOK_MESSAGE, WORKLOADS, FakeKueue,
)

WRITES = ("POST", "PATCH", "PUT", "DELETE")
QUEUED = ("--queue", "team-a")


@pytest.fixture
def kueue(api):
    return FakeKueue(api.emulator)


def cli(runner, kubeconfig, *args):
    return runner.invoke(main, [*args, "--kubeconfig", kubeconfig])


def submit(runner, kubeconfig, *args):
    return cli(runner, kubeconfig, "submit", "--name", "gpt2-demo", *args)


def rayjob(api):
    return api.emulator.get(RAYJOBS, "default", "gpt2-demo")


def workloads(api, kueue):
    return kueue.workloads("default", rayjob(api)["metadata"]["uid"])


def real_writes(api, mark=0):
    return [(m, p) for m, p, q in api.emulator.requests_since(mark) if m in WRITES and q.get("dryRun") != "All"]


def test_a_queued_elastic_range_carries_kueues_elastic_job_annotation_and_passes_its_webhook(
        api, kubeconfig, runner, kueue):
    result = submit(runner, kubeconfig, *QUEUED, "--replicas", "1:3")
    assert result.exit_code == 0, result.output
    job = rayjob(api)
    assert job["metadata"]["annotations"][ELASTIC_ANNOTATION] == "true"
    assert job["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is True
    # only a queued elastic job: a fixed group or an unqueued range has no business with slicing
    fixed = runner.invoke(main, ["render", "--name", "x", *QUEUED, "--replicas", "2"])
    unqueued = runner.invoke(main, ["render", "--name", "x", "--replicas", "1:3"])
    assert fixed.exit_code == unqueued.exit_code == 0
    assert ELASTIC_ANNOTATION not in fixed.output and ELASTIC_ANNOTATION not in unqueued.output


def test_kueue_without_workload_slicing_refuses_it_in_the_dry_run_naming_the_gate(api, kubeconfig, runner):
    FakeKueue(api.emulator, elastic_gate=False)  # ElasticJobsViaWorkloadSlices off
    result = submit(runner, kubeconfig, *QUEUED, "--replicas", "1:3")
    assert result.exit_code == 10
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert WEBHOOK_MESSAGE in line and "ElasticJobsViaWorkloadSlices" in line and "--replicas N" in line
    assert real_writes(api) == []


def test_stop_of_an_admitted_queued_job_deactivates_its_workload_and_holds(api, kubeconfig, runner, kueue):
    assert submit(runner, kubeconfig, *QUEUED).exit_code == 0
    assert rayjob(api)["spec"]["suspend"] is True  # created suspended, for Kueue
    kueue.reconcile()  # Kueue: a Workload, admitted; the job started
    assert rayjob(api)["spec"]["suspend"] is False
    [workload] = workloads(api, kueue)
    result = cli(runner, kubeconfig, "stop", "gpt2-demo")
    assert result.exit_code == 0, result.output
    assert f"Kueue Workload {workload['metadata']['name']} deactivated" in result.output
    assert api.emulator.get(WORKLOADS, "default", workload["metadata"]["name"])["spec"]["active"] is False
    # a Kueue too old to know spec.active refuses the patch instead of dropping it
    assert [q.get("fieldValidation") for m, p, q in api.emulator.log if m == "PATCH" and "workloads" in p] == ["Strict"]
    for _ in range(2):
        kueue.reconcile()  # an inactive Workload is evicted and never admitted again
    assert rayjob(api)["spec"]["suspend"] is True
    assert not api.emulator.get(WORKLOADS, "default", workload["metadata"]["name"])["status"].get("admission")
    # stopping again changes nothing
    mark = len(api.emulator.log)
    again = cli(runner, kubeconfig, "stop", "gpt2-demo")
    assert again.exit_code == 0 and "already stopped" in again.output
    assert real_writes(api, mark) == []


def test_a_suspend_alone_does_not_hold_under_kueue(api, kubeconfig, runner, kueue):
    """Why stop goes through the Workload: Kueue undoes a bare suspend while it is admitted."""
    assert submit(runner, kubeconfig, *QUEUED).exit_code == 0
    kueue.reconcile()
    api.emulator.merge(RAYJOBS, "default", "gpt2-demo", {"spec": {"suspend": True}})
    kueue.reconcile()
    assert rayjob(api)["spec"]["suspend"] is False


def test_stop_of_a_job_still_waiting_in_the_queue_deactivates_its_workload(api, kubeconfig, runner, kueue):
    assert submit(runner, kubeconfig, *QUEUED).exit_code == 0
    uid = rayjob(api)["metadata"]["uid"]
    # Kueue made the Workload but has not admitted it (no quota yet)
    api.emulator.put("kueue.x-k8s.io/v1beta1", "workloads", {
        "metadata": {"name": "rayjob-gpt2-demo-0a1b2", "namespace": "default",
                     "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "gpt2-demo",
                                          "uid": uid}]},  # found by its ownerReference
        "spec": {"active": True}})
    result = cli(runner, kubeconfig, "stop", "gpt2-demo")
    assert result.exit_code == 0, result.output
    assert api.emulator.get(WORKLOADS, "default", "rayjob-gpt2-demo-0a1b2")["spec"]["active"] is False
    assert "submitter.dev/stopped" in rayjob(api)["metadata"]["annotations"]


def test_resume_of_a_stopped_queued_job_reactivates_its_workload_and_lets_kueue_start_it(
        api, kubeconfig, runner, kueue):
    assert submit(runner, kubeconfig, *QUEUED).exit_code == 0
    kueue.reconcile()
    assert cli(runner, kubeconfig, "stop", "gpt2-demo").exit_code == 0
    kueue.reconcile()
    [workload] = workloads(api, kueue)
    result = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert result.exit_code == 0, result.output
    assert "Workload" in result.output and "active again" in result.output
    assert api.emulator.get(WORKLOADS, "default", workload["metadata"]["name"])["spec"]["active"] is True
    job = rayjob(api)
    assert job["spec"]["suspend"] is True  # not around the queue: Kueue unsuspends on admission
    assert "submitter.dev/stopped" not in job["metadata"]["annotations"]
    kueue.reconcile()
    assert rayjob(api)["spec"]["suspend"] is False


def test_a_resubmit_of_an_admitted_job_says_unchanged(api, kubeconfig, runner, kueue):
    args = (*QUEUED, "--toleration", "spot=true:NoSchedule", "--node-selector", "pool=ml")
    assert submit(runner, kubeconfig, *args).exit_code == 0
    kueue.reconcile()  # suspend flipped, the flavor's nodeSelector and toleration injected
    head = rayjob(api)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert FLAVOR_TOLERATION in head["tolerations"] and len(head["tolerations"]) == 2
    assert FLAVOR_NODE_SELECTOR.items() <= head["nodeSelector"].items()
    mark = len(api.emulator.log)
    result = submit(runner, kubeconfig, *args)
    assert result.exit_code == 0, result.output
    assert "rayjob/gpt2-demo unchanged" in result.output
    assert [p for m, p in real_writes(api, mark) if "rayjobs" in p] == []
    # a changed setting is still drift
    changed = submit(runner, kubeconfig, *QUEUED, "--toleration", "spot=false:NoSchedule",
                     "--node-selector", "pool=ml")
    assert changed.exit_code == 8 and "with a different spec" in changed.output
    assert "tolerations" in changed.output


def test_owned_fields_are_what_kueue_and_stop_set_and_nothing_else():
    assert owned_by_others("spec.suspend", queued=False)
    assert owned_by_others("spec.rayClusterSpec.workerGroupSpecs[0].replicas", queued=True)
    assert not owned_by_others("spec.rayClusterSpec.workerGroupSpecs[0].replicas", queued=False)
    assert not owned_by_others("spec.rayClusterSpec.workerGroupSpecs[0].maxReplicas", queued=True)
    assert not owned_by_others("spec.entrypoint", queued=True)
    t = {"key": "a", "operator": "Exists", "effect": "NoSchedule"}
    u = {"key": "b", "operator": "Exists", "effect": "NoSchedule"}
    assert list(differences({"tolerations": [t]}, {"tolerations": [t, u]}, "x")) == []
    assert list(differences({"tolerations": [t, u]}, {"tolerations": [t]}, "x")) != []
    # other lists still compare whole
    assert list(differences({"args": [1]}, {"args": [1, 2]}, "x")) != []


def test_a_new_attempt_of_a_failed_queued_job_queues_again(api, kubeconfig, runner, kueue):
    from tests.support.fake_operator import FakeOperator

    assert submit(runner, kubeconfig, *QUEUED, "--replicas", "1:3").exit_code == 0
    kueue.reconcile()
    FakeOperator(api.emulator, "gpt2-demo").fail()
    result = cli(runner, kubeconfig, "resume", "gpt2-demo")
    assert result.exit_code == 0, result.output
    job = rayjob(api)
    assert job["metadata"]["annotations"]["submitter.dev/attempt"] == "2"
    assert job["spec"]["suspend"] is True  # for Kueue to admit, not around the queue
    assert job["metadata"]["annotations"][ELASTIC_ANNOTATION] == "true"
    kueue.reconcile()
    assert rayjob(api)["spec"]["suspend"] is False


def test_fields_the_api_server_and_kuberay_default_are_not_drift(api, kubeconfig, runner, kueue):
    """The CRD's schema defaults (a port's protocol, unset booleans) and status fill in what
    the spec left out; a re-submit of an admitted job with them is still "unchanged"."""
    assert submit(runner, kubeconfig, *QUEUED).exit_code == 0
    kueue.reconcile()
    job = rayjob(api)
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    for port in head["template"]["spec"]["containers"][0]["ports"]:
        port.setdefault("protocol", "TCP")
    head["serviceType"] = "ClusterIP"
    job["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] = False
    job["spec"]["submitterConfig"] = {"backoffLimit": 2}
    api.emulator.merge(RAYJOBS, "default", "gpt2-demo", {"spec": job["spec"], "status": {
        "jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "gpt2-demo-x1"}})
    result = submit(runner, kubeconfig, *QUEUED)
    assert result.exit_code == 0, result.output
    assert "rayjob/gpt2-demo unchanged" in result.output
