"""The chain of waits on the way out of a preempted pod (submitter.contract.shutdown): each
shorter than the one around it, for every grace period, and each surface takes it from there."""

from __future__ import annotations

import pytest

from submitter.contract.shutdown import RAY_STOP_MARGIN_S, exit_chain

GRACES = [*range(0, 3601), 7_200, 86_400]


@pytest.mark.parametrize("grace", [0, 5, 10, 11, 15, 30, 120, 900, 86_400])
def test_every_wait_ends_before_the_one_around_it(grace):
    c = exit_chain(grace)
    assert 0 <= c.worker_save_s <= c.driver_wait_s
    assert c.tracker_close_s <= c.driver_exit_s
    assert c.driver_wait_s + c.driver_exit_s <= c.prestop_s <= c.grace_s
    if grace > RAY_STOP_MARGIN_S:  # room for a checkpoint: strictly nested
        assert 0 < c.worker_save_s < c.driver_wait_s < c.prestop_s < c.grace_s
        assert 0 < c.tracker_close_s


def test_the_whole_grid_of_grace_periods_keeps_the_order():
    for grace in GRACES:
        c = exit_chain(grace)
        assert c.worker_save_s <= c.driver_wait_s <= c.driver_wait_s + c.driver_exit_s \
            <= c.prestop_s <= c.grace_s, c


def test_the_default_grace_period():
    c = exit_chain(120)
    assert (c.prestop_s, c.driver_wait_s, c.driver_exit_s, c.tracker_close_s,
            c.worker_save_s) == (110, 95, 15, 10, 90)
    assert "grace 120s > preStop wait 110s" in c.describe()


def test_render_and_the_hook_take_their_wait_from_the_chain():
    from submitter.contract.spec import JobSpec
    from submitter.render import lifecycle
    from training.prestop import default_timeout

    for grace in (0, 30, 120, 600):
        command = lifecycle(JobSpec.build(name="t", termination_grace_period=grace))
        wait = float(command["preStop"]["exec"]["command"][-1])
        assert wait == exit_chain(grace).prestop_s
    assert default_timeout() == exit_chain(120).prestop_s
