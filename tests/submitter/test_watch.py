"""`submitter watch`: the watch API from a resourceVersion, resumed streams, 410 relists,
exit codes, and the number of requests a long watch costs."""

from __future__ import annotations

import io
import json
import threading
import time

import pytest

from submitter.cli import main
from submitter.contract.errors import WatchTimeout
from submitter.watch import JsonLines, follow
from tests.support.fake_operator import FakeOperator
from tests.support.kube_emulator import RAYJOBS

NAME = "gpt2-demo"


@pytest.fixture
def job(api, kubeconfig, runner):
    """A submitted job and its fake operator."""
    result = runner.invoke(main, ["submit", "--name", NAME, "--kubeconfig", kubeconfig])
    assert result.exit_code == 0, result.output
    return FakeOperator(api.emulator, NAME)


def watches_open(api, mark, n=2, timeout=10.0):
    """Wait until the watcher has opened `n` watch requests since `mark` (test-side only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len([r for r in api.emulator.requests_since(mark) if r[2].get("watch") == "true"]) >= n:
            return
        time.sleep(0.01)
    raise AssertionError("the watcher did not open its watches")


def in_background(fn):
    errors = []

    def run():
        try:
            fn()
        except BaseException as e:  # surfaced by the test
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


class FakeClock:
    """A monotonic clock the test drives: `now` moves by `tick` on every reading, or by hand."""

    def __init__(self, now: float = 0.0, tick: float = 0.0) -> None:
        self.now, self.tick = now, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_watch(runner, kubeconfig, *args):
    return runner.invoke(main, ["watch", NAME, "--kubeconfig", kubeconfig, "-o", "json", *args])


def watched(api, runner, kubeconfig, script, *args):
    """`submitter watch -o json` while `script` plays the operator once both watches are open."""
    mark = len(api.emulator.log)

    def drive():
        watches_open(api, mark, 2)
        script()

    thread, errors = in_background(drive)
    result = run_watch(runner, kubeconfig, *args)
    thread.join(10)
    assert not errors
    return result, lines(result.stdout)


def test_watch_to_success_exit_0_with_json_lines(api, job, kubeconfig, runner):
    def script():
        job.initialize()
        job.run()
        job.emit("run_started", run_name=NAME, num_workers=2, storage_path="/mnt/checkpoints")
        for step in (10, 20):
            job.step(1, step)
        job.emit("checkpoint_saved", epoch=1, path="/mnt/checkpoints/gpt2-demo/checkpoint_000000")
        job.emit("run_finished")
        time.sleep(0.2)  # the ConfigMap events reach the watcher before the final status
        job.succeed()

    result, out = watched(api, runner, kubeconfig, script)
    assert result.exit_code == 0, result.output
    states = [o["state"] for o in out if o["kind"] == "status"]
    # STARTING twice: Initializing, then Running with jobStatus PENDING (a status change)
    assert states == ["PENDING", "STARTING", "STARTING", "RUNNING", "FINISHING", "SUCCEEDED"]
    assert [o["event"]["seq"] for o in out if o["kind"] == "event"] == [1, 2, 3, 4, 5]
    assert out[-1] == {"kind": "result", "job": NAME, "state": "SUCCEEDED", "exitCode": 0}
    final = [o for o in out if o["kind"] == "status"][-1]
    assert final["lastCheckpoint"] == "/mnt/checkpoints/gpt2-demo/checkpoint_000000" and final["step"] == 20


@pytest.mark.parametrize("finish, state", [("fail", "FAILED"), ("stop", "STOPPED"),
                                           ("deadline_exceeded_while_running", "FAILED")])
def test_watch_failed_or_stopped_exits_1(api, job, kubeconfig, runner, finish, state):
    def script():
        job.initialize()
        job.run()
        getattr(job, finish)()

    result, out = watched(api, runner, kubeconfig, script)
    assert result.exit_code == 1
    assert out[-1]["state"] == state and out[-1]["exitCode"] == 1
    assert f"error: {NAME} ended {state}" in result.stderr


def test_inconsistent_status_running_while_deployment_failed_is_reported_failed(api, job, kubeconfig, runner):
    job.initialize()
    job.run()
    job.deadline_exceeded_while_running()
    result = run_watch(runner, kubeconfig)
    assert result.exit_code == 1
    status = [o for o in lines(result.stdout) if o["kind"] == "status"][-1]
    assert (status["state"], status["jobStatus"], status["deploymentStatus"]) == ("FAILED", "RUNNING", "Failed")
    assert status["reason"] == "DeadlineExceeded" and "still says RUNNING" in status["note"]
    assert "DeadlineExceeded" in result.stderr


def test_timeout_exits_3_and_leaves_the_job_alone(api, job, kubeconfig, runner):
    job.initialize()
    job.run()
    mark = len(api.emulator.log)
    started = time.monotonic()
    result = run_watch(runner, kubeconfig, "--timeout", "1s")
    assert result.exit_code == 3
    assert 0.9 < time.monotonic() - started < 5
    assert "still RUNNING after 1s" in result.stderr
    assert not [r for r in api.emulator.requests_since(mark) if r[0] != "GET"]
    assert api.emulator.get(RAYJOBS, "default", NAME)["status"]["jobStatus"] == "RUNNING"


def test_bad_timeout_is_a_usage_error(api, job, kubeconfig, runner):
    result = run_watch(runner, kubeconfig, "--timeout", "soon")
    assert result.exit_code == 2 and "not a duration" in result.stderr


def test_watch_of_a_missing_job_is_not_found(api, kubeconfig, runner):
    result = run_watch(runner, kubeconfig)
    assert result.exit_code == 6 and "not found" in result.stderr


def test_dropped_stream_is_resumed_without_losing_or_duplicating_events(api, job, kubeconfig, runner):
    job.initialize()
    job.run()
    # Both watch streams die after 2 events, twice each; every reconnect must continue from
    # the last resourceVersion seen.
    api.emulator.fail("GET", r"/configmaps$", drop_after=2, times=2)
    api.emulator.fail("GET", r"/rayjobs$", drop_after=1, times=1)

    def script():
        for step in range(1, 13):
            job.step(1, step * 10)
            time.sleep(0.02)
        job.set("Running", "RUNNING", message="still going")
        job.emit("run_finished")
        time.sleep(0.3)
        job.succeed()

    result, out = watched(api, runner, kubeconfig, script)
    assert result.exit_code == 0, result.output
    assert [o["event"]["seq"] for o in out if o["kind"] == "event"] == list(range(1, 14))
    states = [(o["state"], o["message"]) for o in out if o["kind"] == "status"]
    assert states == [("RUNNING", ""), ("RUNNING", "still going"), ("FINISHING", "still going"),
                      ("SUCCEEDED", "still going")]
    watch_requests = [r for r in api.emulator.log if r[2].get("watch") == "true"]
    resumed = [r for r in watch_requests if r[2].get("resourceVersion")]
    assert len(watch_requests) >= 5 and len(resumed) >= 4  # 3 drops reopened from a resourceVersion


def test_410_gone_relists_and_carries_on(api, job, kube):
    job.initialize()
    job.run()
    job.step(1, 10)
    out = io.StringIO()
    mark = len(api.emulator.log)
    api.emulator.compact()  # the resourceVersion the watcher will get is already too old

    thread, errors = in_background(lambda: (watches_open(api, mark, 3), job.step(1, 20), job.succeed()))
    final = follow(kube, "default", NAME, f"{NAME}-progress", JsonLines(out), timeout=20)
    thread.join(5)
    assert not errors and final.state == "SUCCEEDED"
    rayjob_watches = [r[2] for r in api.emulator.requests_since(mark)
                      if r[2].get("watch") == "true" and "rayjobs" in r[1]]
    # from the GET's version -> 410 Gone -> reopened without a version (a relist in one request)
    assert [bool(q.get("resourceVersion")) for q in rayjob_watches] == [True, False]
    events = [o["event"]["seq"] for o in lines(out.getvalue()) if o["kind"] == "event"]
    assert events == [1, 2]


def test_a_minute_of_watching_a_running_job_costs_at_most_3_requests(api, job, kube):
    """Sixty progress updates, one per (driven) second: one GET and two watches, no polling."""
    job.initialize()
    job.run()

    clock = FakeClock(1000.0)
    mark = len(api.emulator.log)

    def minute():
        watches_open(api, mark, 2)
        for second in range(60):
            clock.now += 1.0
            job.step(1, second)
            time.sleep(0.005)
        clock.now += 1.0
        job.emit("run_finished")  # the entrypoint's last word, well before the RayJob completes
        time.sleep(0.2)
        job.succeed()

    thread, errors = in_background(minute)
    out = io.StringIO()
    final = follow(kube, "default", NAME, f"{NAME}-progress", JsonLines(out), timeout=3600, clock=clock)
    thread.join(5)
    assert not errors and final.state == "SUCCEEDED"
    assert clock.now - 1000.0 >= 61
    requests = api.emulator.requests_since(mark)
    assert len(requests) <= 3, requests
    assert [r[2].get("watch") for r in requests] == [None, "true", "true"]
    assert len([o for o in lines(out.getvalue()) if o["kind"] == "event"]) == 61


def test_watch_deadline_uses_the_injected_clock(api, job, kube):
    job.initialize()
    job.run()

    with pytest.raises(WatchTimeout):
        follow(kube, "default", NAME, f"{NAME}-progress", JsonLines(io.StringIO()), timeout=150,
               clock=FakeClock(tick=100.0))


def test_ctrl_c_stops_watching_and_leaves_the_job_alone(api, job, kubeconfig, runner, monkeypatch):
    job.initialize()
    job.run()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(JsonLines, "status", interrupted)
    mark = len(api.emulator.log)
    result = run_watch(runner, kubeconfig)
    assert result.exit_code == 130
    assert "keeps running" in result.stderr
    assert not [r for r in api.emulator.requests_since(mark) if r[0] != "GET"]


def test_text_output_when_not_a_terminal(api, job, kubeconfig, runner):
    job.initialize()
    job.run()
    job.step(1, 10, loss=2.5, tokens_per_sec=12345)
    job.succeed()
    result = runner.invoke(main, ["watch", NAME, "--kubeconfig", kubeconfig])
    assert result.exit_code == 0
    assert "gpt2-demo SUCCEEDED (jobStatus SUCCEEDED, deployment Complete)" in result.stdout
    progress = [line for line in result.stdout.splitlines() if "epoch 1 step" in line]
    assert len(progress) == 1 and "loss 2.5000" in progress[0] and "12,345 tok/s" in progress[0]


def test_live_display_renders_a_table(api, job, kube):
    from submitter.watch import Live

    job.initialize()
    job.run()
    job.step(2, 30, loss=1.75)
    job.succeed()
    buffer = io.StringIO()
    follow(kube, "default", NAME, f"{NAME}-progress", Live(buffer))
    text = buffer.getvalue()
    assert "SUCCEEDED" in text and "1.7500" in text and "LAST CHECKPOINT" in text


def test_submit_watch_continues_into_watch_with_json_lines(api, kubeconfig, runner):
    op = FakeOperator(api.emulator, NAME)
    mark = len(api.emulator.log)

    def script():
        watches_open(api, mark, 2)
        op.initialize()
        op.run()
        op.step(1, 10)
        time.sleep(0.2)
        op.succeed()

    thread, errors = in_background(script)
    result = runner.invoke(main, ["submit", "--name", NAME, "--kubeconfig", kubeconfig, "--watch", "-o", "json"])
    thread.join(10)
    assert not errors and result.exit_code == 0, result.output
    docs = lines(result.stdout)
    assert docs[0]["kind"] == "List" and docs[0]["items"][-1]["kind"] == "RayJob"
    assert docs[-1] == {"kind": "result", "job": NAME, "state": "SUCCEEDED", "exitCode": 0}
    assert [d["event"]["seq"] for d in docs if d.get("kind") == "event"] == [1]


def test_watch_without_configmap_rbac_still_follows_the_rayjob(api, job, kube):
    api.emulator.deny("watch", "configmaps")
    job.initialize()
    job.run()
    warnings = []
    mark = len(api.emulator.log)
    thread, errors = in_background(lambda: (watches_open(api, mark, 2), time.sleep(0.1), job.succeed()))
    final = follow(kube, "default", NAME, f"{NAME}-progress", JsonLines(io.StringIO()), timeout=20,
                   warn=warnings.append)
    thread.join(5)
    assert not errors and final.state == "SUCCEEDED"
    assert len(warnings) == 1 and "you may not watch configmaps" in warnings[0]


# --- #9 item 5 and #11 item 4: outcomes that are not "the job failed" -----------------------------

def test_watch_error_event_reconnects_like_a_dropped_stream(api, job, kubeconfig, runner):
    job.initialize()
    job.run()
    api.emulator.fail("GET", r"/rayjobs$", watch_error=500, times=2)

    def script():
        time.sleep(0.3)  # after the ERROR events and the reconnects
        job.step(1, 10)
        job.emit("run_finished")
        time.sleep(0.2)
        job.succeed()

    result, out = watched(api, runner, kubeconfig, script)
    assert result.exit_code == 0, result.output
    assert out[-1]["state"] == "SUCCEEDED"
    rayjob_watches = [q for m, p, q in api.emulator.log if q.get("watch") == "true" and "rayjobs" in p]
    assert len(rayjob_watches) >= 3 and all(q.get("resourceVersion") for q in rayjob_watches)


def test_watch_error_events_that_never_stop_exit_4(api, job, kubeconfig, runner):
    job.initialize()
    job.run()
    api.emulator.fail("GET", r"/rayjobs$", watch_error=500, times=100)
    result = run_watch(runner, kubeconfig)
    assert result.exit_code == 4 and "got an ERROR event" in result.stderr


def test_watch_of_a_job_deleted_by_kuberay_after_success_exits_0_and_says_so(api, job, kubeconfig, runner):
    job.initialize()
    job.run()
    job.emit("run_finished")

    def script():
        # The watcher misses the final MODIFIED (as across a reconnect): only DELETED arrives,
        # carrying the last status, as ttlSecondsAfterFinished deletes a Complete RayJob.
        with api.emulator._tlock:
            api.emulator.store[(RAYJOBS, "default", NAME)]["status"] = {
                "jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
        api.emulator.remove(RAYJOBS, "default", NAME)

    result, out = watched(api, runner, kubeconfig, script)
    assert result.exit_code == 0, result.output
    assert out[-1]["state"] == "SUCCEEDED" and out[-1]["exitCode"] == 0
    assert "deleted after it ended" in out[-1]["note"] and "deleted after it ended" in result.stderr


def test_watch_started_after_kuberay_deleted_the_succeeded_job_exits_0(api, job, kubeconfig, runner):
    job.initialize()
    job.run()
    job.step(1, 10)
    job.emit("run_finished")
    job.succeed()
    api.emulator.remove(RAYJOBS, "default", NAME)
    result = runner.invoke(main, ["watch", NAME, "--kubeconfig", kubeconfig])
    assert result.exit_code == 0, result.output
    assert "training reported its end" in result.stderr and "ttlSecondsAfterFinished" in result.stderr


def test_watch_of_a_job_deleted_while_running_exits_1(api, job, kubeconfig, runner):
    job.initialize()
    job.run()
    result, out = watched(api, runner, kubeconfig, lambda: api.emulator.remove(RAYJOBS, "default", NAME))
    assert result.exit_code == 1 and out[-1]["state"] == "DELETED"


def test_watch_of_an_unreachable_api_exits_4(tmp_path, runner, monkeypatch):
    import socket

    from tests.support.kube_emulator import Running

    monkeypatch.setenv("SUBMITTER_API_RETRIES", "1")
    monkeypatch.setenv("SUBMITTER_API_BACKOFF", "0.01")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = Running(None, f"http://127.0.0.1:{port}", None).kubeconfig(tmp_path / "kc")  # type: ignore[arg-type]
    result = runner.invoke(main, ["watch", NAME, "--kubeconfig", config])
    assert result.exit_code == 4 and "cannot reach the Kubernetes API" in result.stderr


def test_watch_help_documents_exit_codes_0_1_3_4(runner):
    text = " ".join(runner.invoke(main, ["watch", "--help"]).output.split())
    for code in ("0 done; for watch, the job succeeded", "1 the job failed", "3 watch --timeout",
                 "4 the API could not be asked", "6 not found"):
        assert code in text, code
    assert "--request-timeout" in text


def test_watch_of_a_job_stopped_with_submitter_stop_exits_1_but_waits_out_kueue(api, job, kubeconfig, runner):
    from submitter.ownership import STOPPED_ANNOTATION

    job.initialize()
    job.run()

    def stop():  # what `submitter stop` writes, then KubeRay's answer
        api.emulator.merge(RAYJOBS, "default", NAME, {"spec": {"suspend": True},
                                                      "metadata": {"annotations": {STOPPED_ANNOTATION: "true"}}})
        job.set("Suspended", "RUNNING")

    result, out = watched(api, runner, kubeconfig, stop)
    assert result.exit_code == 1 and out[-1]["state"] == "SUSPENDED"
    assert "submitter resume gpt2-demo -n default continues it" in out[-1]["note"]
    assert run_watch(runner, kubeconfig).exit_code == 1  # already stopped: at once
    # suspended by Kueue (no stop annotation): queued, not stopped; --timeout ends the wait
    api.emulator.merge(RAYJOBS, "default", NAME, {"metadata": {"annotations": {STOPPED_ANNOTATION: None}}})
    assert run_watch(runner, kubeconfig, "--timeout", "0.5s").exit_code == 3
