"""Normalized job state: KubeRay's two status fields plus training progress -> one word (pure)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from submitter.state import TERMINAL, age, job_state, join, normalize, progress_from_configmap, row
from submitter.contract.events import fold, make_event, to_json
from submitter.contract.naming import CONFIGMAP_EVENTS_KEY, CONFIGMAP_STATE_KEY


@pytest.mark.parametrize("job_status, deployment, expected", [
    ("", "", "PENDING"),
    ("", "Initializing", "STARTING"),
    ("PENDING", "Running", "STARTING"),
    ("RUNNING", "Running", "RUNNING"),
    ("SUCCEEDED", "Running", "FINISHING"),   # not final yet: KubeRay may still retry or shut down
    ("FAILED", "Running", "FINISHING"),
    ("FAILED", "Retrying", "RETRYING"),
    ("", "Suspended", "SUSPENDED"),
    ("", "Waiting", "PENDING"),
    ("SUCCEEDED", "Complete", "SUCCEEDED"),
    ("FAILED", "Complete", "FAILED"),
    ("STOPPED", "Complete", "STOPPED"),
    ("FAILED", "Failed", "FAILED"),
    ("", "Failed", "FAILED"),                # e.g. SubmissionFailed before Ray ever ran
])
def test_normalize_kuberay_pairs(job_status, deployment, expected):
    state, note = normalize(job_status, deployment)
    assert state == expected
    assert note is None or deployment == "Failed"


def test_inconsistent_running_while_deployment_failed_is_failed_with_a_note():
    state, note = normalize("RUNNING", "Failed")
    assert state == "FAILED"
    assert "RUNNING" in note and "Failed" in note


def test_unknown_deployment_status_is_not_terminal():
    state, note = normalize("RUNNING", "SomethingNew")
    assert state == "UNKNOWN" and state not in TERMINAL
    assert "SomethingNew" in note


def _events():
    return [make_event("run_started", seq=1, run_name="j", num_workers=2, storage_path="/mnt/c"),
            make_event("progress", seq=2, epoch=1, step=10, loss=3.25, tokens_per_sec=41000.0, lr=1e-3),
            make_event("checkpoint_saved", seq=3, epoch=1, path="/mnt/c/j/checkpoint_000001"),
            make_event("worker_group_restarted", seq=4, attempt=1, resumed_from="/mnt/c/j/checkpoint_000001")]


def test_progress_prefers_state_json_and_falls_back_to_folding_events():
    events = _events()
    folded = fold(events)
    lines = "\n".join(to_json(e) for e in events)
    from_events = progress_from_configmap({"data": {CONFIGMAP_EVENTS_KEY: lines}})
    assert from_events == folded
    from_state = progress_from_configmap({"data": {CONFIGMAP_STATE_KEY: json.dumps({**folded.to_dict(), "step": 99}),
                                                   CONFIGMAP_EVENTS_KEY: lines}})
    assert from_state.step == 99
    assert progress_from_configmap(None).status == "pending"
    assert progress_from_configmap({"data": {CONFIGMAP_STATE_KEY: "{torn"}}).step is None


def test_job_state_row_has_every_column():
    rayjob = {"metadata": {"name": "j", "namespace": "ns", "creationTimestamp": "2026-11-22T00:00:00Z"},
              "status": {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running", "failed": 1}}
    cm = {"data": {CONFIGMAP_EVENTS_KEY: "\n".join(to_json(e) for e in _events())}}
    s = job_state(rayjob, cm, name="j", namespace="ns")
    assert s.restarts == 2  # one Ray Train worker-group restart + one failed KubeRay attempt
    now = datetime(2026, 11, 22, 3, 0, tzinfo=timezone.utc)
    assert row(s, now) == ("j", "RUNNING", "RUNNING", "Running", "1", "10", "3.2500", "41,000",
                           "/mnt/c/j/checkpoint_000001", "2", "3h")
    assert job_state(None, cm, name="j", namespace="ns").state == "DELETED"


def test_age_like_kubectl():
    now = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
    assert age("2026-11-22T11:59:15Z", now) == "45s"
    assert age("2026-11-22T11:48:00Z", now) == "12m"
    assert age("2026-11-22T09:00:00Z", now) == "3h"
    assert age("2026-11-17T12:00:00Z", now) == "5d"
    assert age(None, now) == "-" and age("garbage", now) == "-"


def test_join_pairs_jobs_with_their_progress_configmap_per_namespace():
    rj = [{"metadata": {"name": "b", "namespace": "x"}, "status": {}},
          {"metadata": {"name": "a", "namespace": "y"}, "status": {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}}]
    cms = [{"metadata": {"name": "a-progress", "namespace": "y"},
            "data": {CONFIGMAP_EVENTS_KEY: to_json(_events()[1])}},
           {"metadata": {"name": "a-progress", "namespace": "x"},
            "data": {CONFIGMAP_EVENTS_KEY: to_json(make_event("progress", seq=9, epoch=5, step=5, loss=1.0,
                                                             tokens_per_sec=1.0, lr=1.0))}}]
    states = join(rj, cms, lambda job: f"{job}-progress")
    assert [(s.namespace, s.name, s.progress.step) for s in states] == [("x", "b", None), ("y", "a", 10)]


# --- stall detection and the list table ------------------------------------------------------

from submitter.state import JobState, cadence, progress_times, stall_threshold, stall_warning, stalled, table  # noqa: E402


def _progress(times):
    return [make_event("progress", seq=i, epoch=1, step=i, loss=1.0, tokens_per_sec=1.0, lr=1.0,
                       time=f"2026-11-22T{t}Z") for i, t in enumerate(times)]


def test_cadence_is_the_median_interval_between_progress_events():
    times = progress_times(_progress(["01:00:00", "01:00:30", "01:01:00", "01:05:00", "01:05:30"])
                           + [make_event("run_finished", time="2026-11-22T02:00:00Z")])
    assert len(times) == 5 and cadence(times) == 30.0  # the 4-minute checkpoint pause is not the cadence
    assert cadence(times[:1]) is None


@pytest.mark.parametrize("median, idle, warned", [
    (30.0, 299.0, False),    # under the 5-minute floor
    (30.0, 301.0, True),
    (60.0, 599.0, False),    # 10 x the cadence is longer than the floor
    (60.0, 601.0, True),
    (None, 10_000.0, False),  # no cadence yet: nothing to compare with
])
def test_stall_threshold_is_max_of_5_minutes_and_10_cadences(median, idle, warned):
    assert stall_threshold(60.0) == 600.0 and stall_threshold(None) == 300.0
    text = stall_warning(idle, median)
    assert bool(text) is warned
    if warned:
        assert "no training progress for" in text


def test_status_stall_only_for_a_running_job():
    events = _progress(["01:00:00", "01:00:30", "01:01:00"])
    now = datetime(2026, 11, 22, 1, 20, tzinfo=timezone.utc)
    running = JobState("j", "ns", "RUNNING")
    assert "19m00s" in stalled(running, events, now)
    assert stalled(running, events, datetime(2026, 11, 22, 1, 4, tzinfo=timezone.utc)) == ""
    assert stalled(JobState("j", "ns", "STARTING"), events, now) == ""


def test_table_namespace_column_with_all_namespaces_and_wide_columns():
    s = JobState("j", "team-a", "FAILED", reason="AppFailed", message="exit 1", ray_cluster="j-raycluster-x")
    now = datetime(2026, 11, 22, 3, 0, tzinfo=timezone.utc)
    plain, wide_all = table([s], now), table([s], now, namespaces=True, wide=True)
    assert plain[0][0] == "JOB" and "NAMESPACE" not in plain[0]
    assert wide_all[0][:2] == ("NAMESPACE", "JOB") and wide_all[0][-2:] == ("RAY CLUSTER", "REASON")
    assert wide_all[1][:2] == ("team-a", "j") and wide_all[1][-2:] == ("j-raycluster-x", "AppFailed exit 1")


def test_progress_unavailable_only_for_a_running_attempt_silent_past_the_grace():
    from submitter.state import PROGRESS_GRACE, progress_unavailable

    start = "2026-11-22T01:00:00Z"
    running = JobState("j", "ns", "RUNNING", running_since=start)
    after = datetime(2026, 11, 22, 1, 0, tzinfo=timezone.utc) + timedelta(seconds=PROGRESS_GRACE + 60)
    warned = progress_unavailable(running, [], after, "j-progress")
    assert warned.startswith("progress unavailable: running for 6m00s") and "configmap/j-progress" in warned
    within = datetime(2026, 11, 22, 1, 4, tzinfo=timezone.utc)
    assert progress_unavailable(running, [], within, "j-progress") == ""  # still starting up
    old = [{"type": "progress", "time": "2026-11-21T23:00:00Z"}]  # an earlier attempt's only
    assert progress_unavailable(running, old, after, "j-progress") == warned
    new = old + [{"type": "run_started", "time": "2026-11-22T01:01:00Z"}]
    assert progress_unavailable(running, new, after, "j-progress") == ""
    assert progress_unavailable(JobState("j", "ns", "STARTING", running_since=start), [], after, "x") == ""
    assert progress_unavailable(JobState("j", "ns", "RUNNING"), [], after, "x") == ""  # no start time
