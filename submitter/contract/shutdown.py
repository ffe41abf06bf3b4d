"""The way out of a preempted pod: every wait, derived from the one grace period.

kubelet gives a pod `terminationGracePeriodSeconds` between the start of its termination and
SIGKILL. Inside that, each wait must end before the one around it, or the outer one gives up
first and the inner work is lost with nobody saying so:

    grace period        kubelet: preStop hook, then SIGTERM to PID 1, then SIGKILL
    └ preStop wait      the hook waits for the driver and the workers to exit
      └ driver wait     the driver waits for the preemption checkpoint, then interrupts fit()
      │ └ worker save   a worker: SIGTERM -> checkpoint registered, or it leaves without one
      └ driver exit     after its wait: run_failed (the tracker close bounded), exit 143

One function computes them (render writes the preStop timeout from it; the driver and the
workers read the grace period from the job document), so they cannot drift apart. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds of the grace period left to `ray start`'s own shutdown after the preStop hook.
RAY_STOP_MARGIN_S = 10.0
#: At most this long for the trackers' last flush on the way out (a slow MLflow server must not
#: hold exit 143); the rest of the driver's exit (the event, killing the actor) gets EXIT_EXTRA_S.
TRACKER_CLOSE_S = 10.0
EXIT_EXTRA_S = 5.0
#: Between a worker giving up and the driver giving up: the checkpoint_saved event's way to the
#: driver (the emitter actor, the driver's poll).
EVENT_MARGIN_S = 5.0


@dataclass(frozen=True)
class ExitChain:
    grace_s: float          # terminationGracePeriodSeconds (kubelet's SIGKILL)
    prestop_s: float        # the preStop hook's wait for this pod's training processes
    driver_wait_s: float    # driver: SIGTERM -> interrupt fit() (checkpoint registered or not)
    driver_exit_s: float    # driver: after its wait, until it has exited 143
    tracker_close_s: float  # part of driver_exit_s: run_failed's way through the trackers
    worker_save_s: float    # worker: SIGTERM -> preemption checkpoint registered, else leave

    def describe(self) -> str:
        return (f"grace {self.grace_s:g}s > preStop wait {self.prestop_s:g}s >= driver wait "
                f"{self.driver_wait_s:g}s + exit {self.driver_exit_s:g}s; worker save "
                f"{self.worker_save_s:g}s")


def exit_chain(grace_s: float) -> ExitChain:
    """The waits for a grace period: fixed margins where the preStop wait is roomy, shares of
    it where it is short, so the order holds for any grace period. A grace period of
    RAY_STOP_MARGIN_S or less leaves no time for a preemption checkpoint (every wait is 0)."""
    grace = max(float(grace_s), 0.0)
    prestop = float(max(int(grace - RAY_STOP_MARGIN_S), 0))  # whole seconds (the Helm chart's too)
    tracker = min(TRACKER_CLOSE_S, prestop * 0.1)
    exit_s = tracker + min(EXIT_EXTRA_S, prestop * 0.05)
    driver_wait = prestop - exit_s
    worker = driver_wait - min(EVENT_MARGIN_S, driver_wait * 0.1)
    return ExitChain(grace_s=grace, prestop_s=_r(prestop), driver_wait_s=_r(driver_wait),
                     driver_exit_s=_r(exit_s), tracker_close_s=_r(tracker),
                     worker_save_s=_r(worker))


def _r(seconds: float) -> float:
    """Rounded down to a tenth (never up: the order between the waits must survive it)."""
    return int(seconds * 10) / 10
