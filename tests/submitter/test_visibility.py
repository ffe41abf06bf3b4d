"""Seeing what happens on the cluster, with the real client against the API emulator:
`status`/`watch` show why a job is stuck (pods, events, claims, the RayCluster) within the
request budget, stall warnings and `watch --stall-timeout` (exit 5)."""

from __future__ import annotations

import io
import json
import time

import pytest

from submitter.cli import main
from submitter.contract.errors import WatchStalled
from submitter.watch import JsonLines, follow
from tests.submitter.test_watch import FakeClock, in_background, lines, watches_open
from tests.support import pod_fixtures as pf
from tests.support.fake_operator import FakeOperator

NAME = "gpt2-demo"
RC = f"{NAME}-raycluster-abcde"
HEAD = f"{RC}-head-abcde"


@pytest.fixture
def job(api, kubeconfig, runner):
    result = runner.invoke(main, ["submit", "--name", NAME, "--kubeconfig", kubeconfig])
    assert result.exit_code == 0, result.output
    op = FakeOperator(api.emulator, NAME)
    op.initialize()  # STARTING, rayClusterName set
    return op


def status(runner, kubeconfig, *args):
    return runner.invoke(main, ["status", NAME, "--kubeconfig", kubeconfig, *args])


# --- status -----------------------------------------------------------------------------------

def test_status_shows_an_image_pull_error_with_the_image(job, cluster, kubeconfig, runner):
    cluster(NAME).pod(containers=[pf.waiting("ImagePullBackOff", 'Back-off pulling image "x"')],
                      conditions=pf.scheduled())
    result = status(runner, kubeconfig)
    assert result.exit_code == 0, result.output
    assert f"blocked: ImagePullBackOff: pod/{HEAD}: image {pf.IMAGE} cannot be pulled" in result.stdout
    doc = json.loads(status(runner, kubeconfig, "-o", "json").stdout)
    assert doc["state"] == "STARTING" and doc["diagnosis"].startswith("ImagePullBackOff: ")
    assert doc["rayCluster"] == RC


def test_status_shows_the_schedulers_message_from_the_events(api, job, cluster, kubeconfig, runner):
    c = cluster(NAME)
    head = c.pod()  # Pending, no condition yet: only the FailedScheduling event says why
    c.event(head, "FailedScheduling", pf.GPU_MESSAGE)
    c.event(pf.pod("other-job"), "FailedScheduling", "not ours")
    mark = len(api.emulator.log)
    result = status(runner, kubeconfig)
    assert f"blocked: Unschedulable: pod/{HEAD}: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu" \
        in result.stdout
    event_reads = [r for r in api.emulator.requests_since(mark) if r[1].endswith("/events")]
    assert [r[2]["fieldSelector"] for r in event_reads] == [f"involvedObject.kind=Pod,involvedObject.name={HEAD}"]


def test_status_names_the_unbound_claim(job, cluster, kubeconfig, runner):
    c = cluster(NAME)
    claim = f"{NAME}-checkpoints"
    c.pod(conditions=pf.unschedulable(pf.PVC_MESSAGE), claim=claim)
    pvc = api_pvc = c.pvc(claim, storage_class="nfs-rwx")
    c.event({**pvc, "kind": "PersistentVolumeClaim"}, "ProvisioningFailed",
            'storageclass.storage.k8s.io "nfs-rwx" not found')
    assert api_pvc["status"]["phase"] == "Pending"
    out = status(runner, kubeconfig).stdout
    assert f'blocked: PVCNotBound: pvc/{claim}: Pending: storageclass.storage.k8s.io "nfs-rwx" not found' in out


def test_status_shows_kuberays_replica_failure_when_no_pod_exists(job, cluster, kubeconfig, runner):
    cluster(NAME).raycluster(pf.replica_failure())
    out = status(runner, kubeconfig).stdout
    assert f"blocked: FailedCreateHeadPod: raycluster/{RC}: " in out and "exceeded quota: gpu-quota" in out


def test_status_of_a_failed_job_shows_the_oomkilled_worker(job, cluster, kubeconfig, runner):
    cluster(NAME).pod("worker", phase="Running",
                      containers=[pf.running("ray-worker", restarts=3, last={"reason": "OOMKilled", "exitCode": 137})])
    job.run()
    job.fail()
    out = status(runner, kubeconfig).stdout
    assert "FAILED" in out and "blocked: OOMKilled: pod/" in out and "ray-worker ran out of memory" in out


def test_status_of_a_healthy_job_costs_one_pod_list_and_says_nothing_more(api, job, cluster, kubeconfig, runner):
    cluster(NAME).pod(phase="Running", containers=[pf.running()], conditions=pf.scheduled())
    job.run()
    mark = len(api.emulator.log)
    result = status(runner, kubeconfig)
    assert "blocked:" not in result.stdout and "warning:" not in result.stdout
    paths = [r[1] for r in api.emulator.requests_since(mark)]
    assert len(paths) == 3 and paths[-1].endswith("/pods")  # RayJob, ConfigMap, pods


def test_status_without_pod_rbac_still_works(api, job, kubeconfig, runner):
    api.emulator.deny("list", "pods")
    result = status(runner, kubeconfig)
    assert result.exit_code == 0 and "STARTING" in result.stdout


def test_status_warns_when_a_running_job_stopped_reporting_progress(job, kubeconfig, runner):
    job.run()
    for i, t in enumerate(("01:00:00", "01:00:30", "01:01:00", "01:01:30")):
        job.emit("progress", epoch=1, step=10 * (i + 1), loss=3.0, tokens_per_sec=1.0, lr=1e-3,
                 time=f"2026-11-22T{t}Z")
    out = status(runner, kubeconfig).stdout  # the last progress is years old: far past 10 x 30 s
    assert "warning: stalled? no training progress for" in out and "every ~30s" in out


# --- watch ------------------------------------------------------------------------------------

def test_watch_shows_the_blocking_reason_as_it_appears_and_clears(api, job, cluster, kube):
    c = cluster(NAME)
    mark = len(api.emulator.log)

    def script():
        watches_open(api, mark, 3)  # RayJob, ConfigMap and (STARTING) the pods
        head = c.pod(conditions=pf.unschedulable())
        time.sleep(0.2)
        c.pod(phase="Running", containers=[pf.running()], conditions=pf.scheduled())
        time.sleep(0.2)
        job.run()
        job.succeed()
        return head

    thread, errors = in_background(script)
    out = io.StringIO()
    final = follow(kube, "default", NAME, f"{NAME}-progress", JsonLines(out), timeout=20)
    thread.join(5)
    assert not errors and final.state == "SUCCEEDED"
    diagnoses = [o["diagnosis"] for o in lines(out.getvalue()) if o["kind"] == "status"]
    assert f"Unschedulable: pod/{HEAD}: {pf.GPU_MESSAGE}" in diagnoses
    assert diagnoses[-1] == ""


def test_a_quiet_minute_of_a_stuck_job_costs_at_most_3_requests(api, job, cluster, kube):
    """A head pod stuck on its image: diagnosed once, then a minute in which nothing changes."""
    c = cluster(NAME)
    clock = FakeClock(1000.0)
    mark = len(api.emulator.log)
    seen = []

    class Sink(JsonLines):
        def status(self, state):
            seen.append(state.diagnosis)
            super().status(state)

    def script():
        watches_open(api, mark, 3)
        c.pod(containers=[pf.waiting("ImagePullBackOff", "Back-off pulling image")], conditions=pf.scheduled())
        deadline = time.monotonic() + 10
        while not any(seen) and time.monotonic() < deadline:
            time.sleep(0.01)
        quiet = len(api.emulator.log)
        for _ in range(60):  # a minute in which nothing changes (the loop ticks on its own)
            clock.now += 1.0
            time.sleep(0.01)
        counts.append(len(api.emulator.log) - quiet)
        setup.extend(api.emulator.log[mark:quiet])
        job.run()
        job.succeed()

    counts: list[int] = []
    setup: list = []
    thread, errors = in_background(script)
    final = follow(kube, "default", NAME, f"{NAME}-progress", Sink(io.StringIO()), timeout=3600, clock=clock)
    thread.join(5)
    assert not errors and final.state == "SUCCEEDED"
    assert any(d.startswith("ImagePullBackOff: ") for d in seen)
    assert counts[0] <= 3, api.emulator.log[-10:]
    # GET + 3 watches + the diagnosis reads (the head's events, the RayCluster once): no polling
    assert len(setup) <= 6, setup


def test_watch_stall_warning_then_stall_timeout_exits_5(api, job, kube):
    job.run()
    for i in range(3):
        job.emit("progress", epoch=1, step=i, loss=3.0, tokens_per_sec=1.0, lr=1e-3,
                 time=f"2026-11-22T01:00:{10 * i:02d}Z")
    clock = FakeClock(0.0, tick=300.0)  # every reading of the clock: 5 minutes later
    out = io.StringIO()
    with pytest.raises(WatchStalled) as caught:
        follow(kube, "default", NAME, f"{NAME}-progress", JsonLines(out), timeout=None, clock=clock,
               stall_timeout=1800)
    assert caught.value.exit_code == 5 and "no progress for 30m00s" in str(caught.value)
    warnings = [o["stalled"] for o in lines(out.getvalue()) if o["kind"] == "status" and o["stalled"]]
    assert warnings and "no training progress" in warnings[0] and "every ~10s" in warnings[0]


def test_watch_cli_stall_timeout_exit_code_and_help(api, job, kubeconfig, runner):
    job.run()
    started = time.monotonic()
    result = runner.invoke(main, ["watch", NAME, "--kubeconfig", kubeconfig, "--stall-timeout", "1s"])
    assert result.exit_code == 5, result.output
    assert time.monotonic() - started < 10
    assert "made no progress for 1s" in result.stderr
    help_text = runner.invoke(main, ["watch", "--help"]).output
    help_text = " ".join(help_text.split())
    assert "5 watch --stall-timeout elapsed" in help_text and "3 watch --timeout elapsed" in help_text
    bad = runner.invoke(main, ["watch", NAME, "--kubeconfig", kubeconfig, "--stall-timeout", "later"])
    assert bad.exit_code == 2 and "--stall-timeout 'later' is not a duration" in bad.stderr


def test_progress_resets_the_stall_clock(api, job, kube):
    job.run()
    clock = FakeClock(0.0)
    mark = len(api.emulator.log)

    def script():
        watches_open(api, mark, 2)
        for step in range(5):
            clock.now += 100.0  # 500 s in all, each gap well under the 300 s stall timeout
            job.step(1, step)
            time.sleep(0.1)
        job.succeed()

    thread, errors = in_background(script)
    final = follow(kube, "default", NAME, f"{NAME}-progress", JsonLines(io.StringIO()), timeout=None,
                   clock=clock, stall_timeout=300)
    thread.join(5)
    assert not errors and final.state == "SUCCEEDED"


def test_watch_sees_a_replica_failure_that_appears_later_at_one_request_a_minute(api, job, cluster, kube):
    """No pods and no RayJob change: only the RayCluster knows (KubeRay hit a quota)."""
    c = cluster(NAME)
    c.raycluster([])
    clock = FakeClock(1000.0)
    mark = len(api.emulator.log)
    seen: list[str] = []
    reads: list[int] = []

    class Sink(JsonLines):
        def status(self, state):
            seen.append(state.diagnosis)
            super().status(state)

    def script():
        watches_open(api, mark, 3)
        c.raycluster(pf.replica_failure())
        time.sleep(0.3)
        assert not any(seen)  # not read again within the minute
        before = len(api.emulator.log)
        for _ in range(3):  # three quiet minutes
            clock.now += 61.0
            time.sleep(1.5)  # the watch loop ticks once a second
        reads.append(len([r for r in api.emulator.log[before:] if "rayclusters" in r[1]]))
        reads.append(len(api.emulator.log) - before)
        job.run()
        job.succeed()

    thread, errors = in_background(script)
    follow(kube, "default", NAME, f"{NAME}-progress", Sink(io.StringIO()), timeout=3600, clock=clock)
    thread.join(5)
    assert not errors
    assert any(d.startswith(f"FailedCreateHeadPod: raycluster/{RC}: ") for d in seen)
    assert 1 <= reads[0] <= 3 and reads[1] == reads[0]  # one RayCluster GET per minute, nothing else


def test_watch_without_pod_rbac_warns_once_and_still_follows_the_job(api, job, kube):
    api.emulator.deny("watch", "pods")
    warnings: list[str] = []
    mark = len(api.emulator.log)
    thread, errors = in_background(lambda: (watches_open(api, mark, 3), time.sleep(0.2), job.run(), job.succeed()))
    final = follow(kube, "default", NAME, f"{NAME}-progress", JsonLines(io.StringIO()), timeout=20,
                   warn=warnings.append)
    thread.join(5)
    assert not errors and final.state == "SUCCEEDED"
    assert len(warnings) == 1 and "no diagnosis from the pods" in warnings[0] and "you may not watch pods" in warnings[0]


def test_status_says_progress_is_unavailable_when_a_running_job_wrote_none(api, job, kubeconfig, runner):
    """The driver's sink cannot write the ConfigMap (no token on the head, a 403, no route):
    after PROGRESS_GRACE of RUNNING with no event from this attempt, status says so and why."""
    long_ago = "2026-01-01T00:00:00Z"
    job.set("Running", "RUNNING", rayJobInfo={"startTime": long_ago})
    result = status(runner, kubeconfig)
    assert result.exit_code == 0, result.output
    assert "warning: progress unavailable: running for" in result.output
    assert f"configmap/{NAME}-progress got no event" in result.output and "token" in result.output
    as_json = json.loads(status(runner, kubeconfig, "-o", "json").output)
    assert as_json["progressUnavailable"].startswith("progress unavailable:")
    # the attempt's progress arrives: no warning
    job.emit("run_started", run_name=NAME, num_workers=1, storage_path="/s")
    assert "progress unavailable" not in status(runner, kubeconfig).output
