"""What a run took (usage.json), its limits (--deadline, --max-cost) and measured-vs-estimated:
the pure parts, without Ray (issue 38; the Ray run is in tests/training/test_run_limits_ray.py)."""

from __future__ import annotations

import json

import pytest

from submitter import pace
from submitter.contract import events as ev
from submitter.contract import run_limits as rl
from submitter.contract.usage import USAGE_FILE, RunUsage, measure, read_usages, steady_pace


def _at(second: float) -> str:
    return f"2026-11-28T10:{int(second) // 60:02d}:{second % 60:06.3f}Z"


def _ev(second: float, etype: str, **fields) -> dict:
    return ev.make_event(etype, time=_at(second), **fields)


def _run_events() -> list[dict]:
    """Two segments: 2 H100 workers for 100 s (stopped by its deadline at step 4), then a
    resume on 2 workers that restarts once and finishes at step 10 after 200 s."""
    started = dict(run_name="r", num_workers=2, storage_path="/runs", model="gpt2-small",
                   params=124_475_904, block_size=1024, global_batch_size=8, gpu="NVIDIA H100 80GB HBM3")
    return [
        _ev(0, "run_started", **started),
        _ev(30, "progress", epoch=1, step=1, loss=9.0, tokens_per_sec=100.0, lr=1e-3),  # first
        _ev(50, "progress", epoch=1, step=3, loss=8.0, tokens_per_sec=8192.0, lr=1e-3),
        _ev(60, "progress", epoch=1, step=4, loss=7.5, tokens_per_sec=8192.0, lr=1e-3),
        _ev(70, "checkpoint_saved", epoch=1, step=4, path="/runs/r/c4", reason="deadline"),
        _ev(100, "run_stopped", reason="deadline", message="deadline 1m40s reached", step=4),
        _ev(200, "run_started", **started, started_at=_at(190)),
        _ev(220, "run_resumed", resumed_from="/runs/r/c4", epoch=1, step=4, world_size=2,
            tokens_per_step=8192),
        _ev(230, "progress", epoch=1, step=5, loss=7.0, tokens_per_sec=50.0, lr=1e-3),  # first
        _ev(240, "progress", epoch=1, step=7, loss=6.0, tokens_per_sec=4096.0, lr=1e-3),
        _ev(250, "worker_group_restarted", attempt=1, resumed_from="/runs/r/c4", world_size=2),
        _ev(380, "progress", epoch=1, step=10, loss=5.0, tokens_per_sec=8192.0, lr=1e-3),
        _ev(390, "run_finished", epoch=1, step=10),
    ]


def test_measure_sums_every_segment_and_takes_the_steady_pace():
    usage = measure(_run_events(), storage_kind="local", price=2.0, now=_at(390))
    # 100 s (the first driver) + 200 s (the second, from its driver's start at 190 s)
    assert usage.wall_s == pytest.approx(300.0)
    assert usage.gpu_hours == pytest.approx(300.0 * 2 / 3600, abs=1e-6)
    assert usage.cost == pytest.approx(usage.gpu_hours * 2.0, abs=1e-3)
    assert usage.tokens == 10 * 8192 and usage.finished and usage.stopped_by is None
    assert usage.restarts == 2  # one worker-group restart, one resume
    assert usage.gpu_type == "H100 SXM" and usage.gpus == 2 and usage.workers == 2
    # steady windows only: steps 2-3 and 4 at 8192, 6-7 at 4096 (not the first window of each
    # start: step 1, step 5 after the resume, step 10 after the restart)
    tokens = (2 + 1) * 8192 + 2 * 8192
    seconds = 3 * 8192 / 8192 + 2 * 8192 / 4096
    assert usage.tokens_per_s == pytest.approx(tokens / seconds, rel=1e-3)
    from submitter.contract.flops import mfu, preset_flops_per_token

    per_token = preset_flops_per_token("gpt2-small", 124_475_904, 1024)
    assert usage.mfu == pytest.approx(mfu(usage.tokens_per_s / 2, per_token, 989.0), abs=1e-4)


def test_a_run_stopped_by_a_limit_says_so_and_a_cpu_run_pays_its_machine_hours():
    events = _run_events()[:6]
    cpu = [dict(e, gpu=None) if e["type"] == "run_started" else e for e in events]
    usage = measure(cpu, storage_kind="local", price=3.0)
    assert not usage.finished and usage.stopped_by == "deadline"
    assert usage.gpu_type is None and usage.mfu is None and usage.gpu_hours == 0
    assert usage.cost == pytest.approx(100 / 3600 * 3.0, abs=1e-4)  # the machine's 100 s


def test_steady_pace_falls_back_to_the_first_windows_of_a_very_short_run():
    events = _run_events()[:2]
    assert steady_pace(events) == pytest.approx(100.0)
    assert steady_pace(events[:1]) is None


def test_usage_round_trips_and_read_usages_finds_local_and_cluster_runs_newest_first(tmp_path):
    base = measure(_run_events(), storage_kind="local", now=_at(390))
    older = RunUsage(**{**base.__dict__, "name": "old", "finished_at": "2026-11-01T00:00:00Z"})
    newer = RunUsage(**{**base.__dict__, "name": "new", "finished_at": "2026-11-28T00:00:00Z"})
    assert RunUsage.from_json(newer.to_json()) == newer
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / USAGE_FILE).write_text(older.to_json())
    (tmp_path / "team-a" / "new").mkdir(parents=True)  # <storage>/<namespace>/<name>
    (tmp_path / "team-a" / "new" / USAGE_FILE).write_text(
        json.dumps({**json.loads(newer.to_json()), "from_a_newer_writer": 1}))
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / USAGE_FILE).write_text('{"model": ')  # being written: skipped
    assert [u.name for u in read_usages(str(tmp_path))] == ["new", "old"]
    assert read_usages(str(tmp_path / "absent")) == []


# --- limits -------------------------------------------------------------------------------------

def test_a_limit_counts_the_whole_run_and_a_spent_budget_is_refused_before_anything_starts():
    limits = rl.Limits(deadline_s=300, max_cost=None, price=None, prior_wall_s=200,
                       started_at=1000.0)
    assert rl.passed(limits, 1099.0, 2) is None
    assert rl.passed(limits, 1100.0, 2) == rl.DEADLINE
    assert rl.spent(limits, 2) is None
    done = rl.Limits(deadline_s=150, max_cost=None, price=None, prior_wall_s=200, started_at=5.0)
    refusal = rl.spent(done, 2)
    assert "already used its deadline" in refusal and "--deadline" in refusal
    assert "\n" not in refusal


def test_max_cost_counts_gpu_hours_at_the_price_and_a_cpu_run_its_machine_hours():
    limits = rl.Limits(deadline_s=None, max_cost=10.0, price=4.0, prior_billed_hours=1.0,
                       started_at=0.0, gpus_per_worker=1)
    # 1 GPU-hour before (4.0), then 2 GPUs: 6.0 more after 2700 s
    assert rl.passed(limits, 2699.0, 2) is None
    assert rl.passed(limits, 2700.0, 2) == rl.MAX_COST
    assert "max cost 10 reached: 10.00 spent at 4 per GPU-hour" in rl.stop_text(
        rl.MAX_COST, limits, 2700.0, 2)
    # a CPU run pays for the machine, whatever its workers (as the estimate prices it)
    cpu = rl.Limits(deadline_s=None, max_cost=1.0, price=4.0, started_at=0.0, gpus_per_worker=0)
    assert rl.passed(cpu, 899.0, 2) is None and rl.passed(cpu, 900.0, 2) == rl.MAX_COST
    assert "per hour" in rl.stop_text(rl.MAX_COST, cpu, 900.0, 2)
    assert not rl.Limits(None, 5.0, None).active  # no price: nothing to measure


def test_limits_come_from_the_jobs_fields():
    from submitter.contract.spec import JobSpec

    job = JobSpec.build(name="x", deadline="1h30m", max_cost=12.5, gpu_hour_price=2.5)
    limits = rl.limits_of(job, prior_wall_s=0, prior_billed_hours=0, started_at=0, use_gpu=True,
                          estimate_price=9.0)
    assert (limits.deadline_s, limits.max_cost, limits.price) == (5400, 12.5, 2.5)
    assert rl.Limits.from_dict(limits.to_dict()) == limits
    # a price table's price reaches the run only through the recorded estimate
    tabled = rl.limits_of(JobSpec.build(name="x", max_cost=3.0), prior_wall_s=0,
                          prior_billed_hours=0, started_at=0, use_gpu=True, estimate_price=0.7)
    assert tabled.price == 0.7 and tabled.active
    none = rl.limits_of(JobSpec.build(name="x"), prior_wall_s=0, prior_billed_hours=0,
                        started_at=0, use_gpu=False)
    assert not none.active


# --- measured against estimated -----------------------------------------------------------------

ESTIMATE = {"tokens": 3_600_000, "steps": 100, "hours": 1.0, "gpu_hours": 8.0, "cost": 16.0,
            "low": {}, "high": {}, "sources": {}, "global_batch": {"tokens": 36_000},
            "step_s": {"low": 30.0, "likely": 36.0, "high": 45.0}, "gpus": 8, "mfu": 0.4,
            "efficiency": 0.9, "gpu_hour_price": 2.0}


def test_comparison_shows_pace_mfu_eta_and_cost_against_the_estimate():
    lines = pace.comparison(ESTIMATE, pace.Measured(tokens_per_s=900.0, elapsed_s=1800.0,
                                                    eta_s=2700.0))
    assert lines[0] == "tokens/s: 900 measured vs 1,000 estimated (-10%)"
    assert lines[1] == "MFU: ~32.4% measured (from the pace) vs 36.0% estimated"
    assert lines[2] == "ETA: 45m00s left, 1h15m in all vs 1h00m estimated"
    # 0.5 h x 8 GPUs x 2.0 so far; 1.25 h at the end
    assert lines[3] == "cost: 8.00 so far, 20.00 at the end vs 16.00 estimated"


def test_a_pace_off_by_more_than_a_third_warns_once_naming_the_cause():
    warn = pace.PaceWarning()
    assert warn.check(ESTIMATE, pace.Measured(tokens_per_s=700.0)) is None  # -30%: fine
    slow = pace.Measured(tokens_per_s=600.0, data_wait=0.35, restarts=2, workers=6)
    text = warn.check(ESTIMATE, slow)
    assert text.startswith("warning: the measured pace is 40% below the estimate")
    assert "data waits (35%" in text and "restarts (2" in text and "6 of 8" in text
    assert warn.check(ESTIMATE, slow) is None  # once
    plain = pace.off_pace(ESTIMATE, pace.Measured(tokens_per_s=500.0))
    assert "a slow rank" in plain
    assert "above the estimate" in pace.off_pace(ESTIMATE, pace.Measured(tokens_per_s=1500.0))
    assert pace.PaceWarning().check(None, slow) is None  # no estimate recorded: nothing


def test_the_estimates_price_is_its_own_or_its_cost_per_gpu_hour():
    assert pace.price_of({"cost": 16.0, "gpu_hours": 8.0}) == 2.0
    assert pace.price_of({"cost": None, "gpu_hours": 8.0}) is None
    assert pace.expected_pace({"tokens": 7200, "hours": 1.0}) == 2.0  # no step time: the mean
    local = {"tokens": 7200, "hours": 1.0, "gpus": 0, "gpu_hour_price": 0.1, "cost": 0.1}
    lines = pace.comparison(local, pace.Measured(tokens_per_s=2.0, elapsed_s=1800.0, eta_s=1800.0))
    assert lines[-1] == "cost: 0.05 so far, 0.10 at the end vs 0.10 estimated"  # the machine


def test_report_shows_what_the_run_took_beside_the_estimate():
    usage = measure(_run_events(), storage_kind="local", price=2.0, now=_at(390))
    took, estimated = pace.took_lines(usage, ESTIMATE)
    assert took.startswith("took: 5m00s wall-clock, 0.17 GPU-hours, cost 0.33, 81,920 tokens at 5,851 tokens/s, MFU")
    assert "MFU" in took and "(H100 SXM)" in took and "2 restart(s), finished" in took
    assert estimated == "estimated: 1h00m wall-clock, 8.00 GPU-hours, cost 16.00, 1,000 tokens/s"
    assert pace.took_lines(usage, None) == [took]


def test_run_stopped_reads_as_a_stop_and_folds_to_stopped():
    event = _ev(1, "run_stopped", reason="deadline", message="deadline 45s reached; continue")
    from submitter.event_text import describe

    assert describe(event) == "STOPPED (deadline): deadline 45s reached; continue"
    state = ev.fold([event])
    assert state.status == "stopped" and state.error.startswith("deadline 45s")


# --- where it is shown: watch, status, submit --local, report -------------------------------------

def _job(estimate=ESTIMATE, tokens_per_sec=600.0, wait=0.3):
    """A RUNNING RayJob with the estimate annotation and its progress ConfigMap."""
    from datetime import datetime, timedelta, timezone

    from submitter.contract.naming import (CONFIGMAP_EVENTS_KEY, CONFIGMAP_STATE_KEY,
                                           ESTIMATE_ANNOTATION)
    from submitter.state import job_state

    created = (datetime.now(timezone.utc) - timedelta(minutes=30)).isoformat().replace("+00:00", "Z")
    progress = _ev(1, "progress", epoch=1, step=10, loss=5.0, tokens_per_sec=tokens_per_sec,
                   lr=1e-3, data_wait_fraction=wait, seq=2)
    state = ev.ProgressState(status="running", step=10, tokens_per_sec=tokens_per_sec,
                             total_steps=100, seconds_per_step=36.0, cadence_step=10,
                             cadence_time=progress["time"], world_size=8)
    rayjob = {"metadata": {"creationTimestamp": created,
                           "annotations": {ESTIMATE_ANNOTATION: json.dumps(estimate)}},
              "status": {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}}
    configmap = {"data": {CONFIGMAP_STATE_KEY: json.dumps(state.to_dict()),
                          CONFIGMAP_EVENTS_KEY: ev.to_json(progress) + "\n"}}
    return job_state(rayjob, configmap, name="j", namespace="ns"), progress


def test_watch_warns_once_and_status_shows_measured_against_estimated(capsys):
    import io

    from submitter.cli_cluster import _print_pace
    from submitter.state import utcnow
    from submitter.watch import TextLines

    state, progress = _job()
    assert state.estimate == ESTIMATE and state.data_wait == 0.3
    lines = state.pace_lines(utcnow())
    assert lines[0] == "tokens/s: 600 measured vs 1,000 estimated (-40%)"
    assert lines[3].startswith("cost: 8.00 so far")  # 30 min x 8 GPUs x 2.0
    out = io.StringIO()
    sink = TextLines(out)
    sink.event(progress, state)
    sink.event(dict(progress, seq=3, step=11), state)
    warnings = [line for line in out.getvalue().splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "data waits (30%" in warnings[0]
    _print_pace(state)
    shown = capsys.readouterr().out
    assert "measured vs estimated: tokens/s: 600 measured" in shown and "warning:" in shown
    quiet, _ = _job(tokens_per_sec=950.0)
    assert quiet.pace_lines(utcnow()) and pace.off_pace(quiet.estimate, quiet.measured(utcnow())) is None
    none, _ = _job(estimate=None)
    assert none.estimate is None and none.pace_lines(utcnow()) == []


def test_a_local_run_reads_its_estimate_from_run_json_and_warns_once(tmp_path):
    from types import SimpleNamespace

    from submitter.local import _Reader

    (tmp_path / "run.json").write_text(json.dumps({"v": 1, "estimate": ESTIMATE}))
    started = _ev(0, "run_started", run_name="r", num_workers=2, storage_path="/x",
                  run_dir=str(tmp_path), global_batch_size=36, block_size=1000)
    lines = [ev.to_stdout_line(e) + "\n" for e in
             [started] + [_ev(10 * s, "progress", epoch=1, step=s, loss=1.0, tokens_per_sec=500.0,
                               lr=1e-3) for s in (1, 2, 3)]]
    notices: list[str] = []
    view = SimpleNamespace(event=lambda e: None, notice=notices.append)
    reader = _Reader(SimpleNamespace(stdout=lines), view)
    reader.pump()
    assert reader.estimate == ESTIMATE
    assert len([n for n in notices if n.startswith("warning: the measured pace is 50% below")]) == 1
    assert reader.pace_lines()[0] == "tokens/s: 500 measured vs 1,000 estimated (-50%)"


def test_report_reads_usage_and_the_estimate_beside_the_events(tmp_path):
    from submitter import report

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    events = _run_events()
    (run_dir / "events.jsonl").write_text("".join(ev.to_json(e) + "\n" for e in events))
    usage = measure(events, storage_kind="local", price=2.0, now=_at(390))
    (run_dir / USAGE_FILE).write_text(usage.to_json())
    (run_dir / "run.json").write_text(json.dumps({"v": 1, "estimate": ESTIMATE}))
    data = report.from_run_dir(str(tmp_path), "r")
    assert data.usage == usage and data.estimate == ESTIMATE
    assert report.took_lines(data) == pace.took_lines(usage, ESTIMATE)
    assert "estimated: 1h00m wall-clock" in report.took_html(data)
    (run_dir / USAGE_FILE).unlink()
    assert report.took_lines(report.from_run_dir(str(tmp_path), "r")) == []


def test_a_local_run_stopped_by_a_limit_ends_with_stopped_not_failed(tmp_path):
    from submitter.local import LocalOutcome, summary_lines

    state = ev.fold([_ev(1, "run_stopped", reason="deadline", message="deadline 45s reached")])
    lines = summary_lines(LocalOutcome(False, state, str(tmp_path), state.error, 1))
    assert lines == ["stopped: deadline 45s reached", f"checkpoints: {tmp_path}"]
