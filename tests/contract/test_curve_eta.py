"""The run's curve (bounded, downsampled, whole run) and the ETA from the step cadence: pure folds."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from submitter.contract import events as ev

T0 = datetime(2026, 11, 22, 1, 0, tzinfo=timezone.utc)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def progress(step: int, seconds: float, seq: int) -> dict:
    return ev.make_event("progress", time=at(seconds), seq=seq, epoch=1, step=step,
                         loss=10 / step, tokens_per_sec=1000.0, lr=1e-3)


def test_the_curve_of_a_long_run_stays_bounded_and_spans_the_whole_run():
    curve = ev.empty_curve()
    for i in range(1, 100_001):
        curve = ev.curve_apply(curve, {"type": "progress", "step": i, "loss": 1.0, "tokens_per_sec": 1.0})
    points = ev.curve_points(curve)
    assert len(points) <= ev.CURVE_MAX_POINTS + 1
    assert points[0][0] == 1 and points[-1][0] == 100_000  # first and newest kept
    gaps = [b[0] - a[0] for a, b in zip(points, points[1:-1])]
    assert max(gaps) == min(gaps)  # evenly spaced: the stride doubled as the series was halved


def test_val_checkpoints_and_restarts_are_marked_at_their_step_and_refolds_are_idempotent():
    events = [ev.make_event("run_started", seq=1, run_name="r", num_workers=2, storage_path="/m"),
              progress(5, 10, 2),
              ev.make_event("checkpoint_saved", seq=3, epoch=1, path="/m/r/c1"),
              ev.make_event("worker_group_restarted", seq=4, attempt=1, resumed_from="/m/r/c1"),
              ev.make_event("epoch_finished", seq=5, epoch=1, step=8, train_loss=2.0, val_loss=2.5,
                            tokens_per_sec=900.0)]
    curve = ev.curve_fold(events)
    assert curve["checkpoints"] == [[5, 1]] and curve["restarts"] == [[5, 1]]
    assert curve["val"] == [[8, 1, 2.0, 2.5]]
    assert ev.curve_fold(events, curve) == curve  # seq already folded: nothing doubles
    assert ev.parse_curve(__import__("json").dumps(curve)) == curve
    assert ev.parse_curve("not json") is None and ev.parse_curve('{"v": 2}') is None


def test_eta_from_the_step_cadence_ignores_restart_downtime():
    state = ev.fold([ev.make_event("run_started", time=at(0), seq=1, run_name="r", num_workers=1,
                                   storage_path="/m", epochs=2, steps_per_epoch=50)])
    assert state.total_steps == 100 and ev.eta_seconds(state) is None  # no cadence yet
    state = ev.fold([progress(10, 10, 2), progress(20, 20, 3)], state)  # 1 s/step
    assert state.seconds_per_step == 1.0
    assert ev.eta_seconds(state) == 80.0
    assert ev.eta_seconds(state, now=T0 + timedelta(seconds=30)) == 70.0
    state = ev.apply(state, ev.make_event("worker_group_restarted", time=at(500), seq=4, attempt=1,
                                          resumed_from="/m/r/c"))
    state = ev.fold([progress(20, 600, 5), progress(30, 610, 6)], state)
    assert state.seconds_per_step == 1.0  # the 580 s outage is not a step
    state = ev.apply(state, ev.make_event("run_finished", time=at(700), seq=7))
    assert ev.eta_seconds(state) is None
