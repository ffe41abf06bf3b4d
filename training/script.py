"""What a user's own Ray Train script may import from the image (stdlib only, cheap to import).

    from training.script import should_stop, Preempted

    for epoch in range(start, epochs):
        ...
        if should_stop():        # the pod got SIGTERM (preemption, node drain, `submitter stop`)
            ray.train.report(metrics, checkpoint=checkpoint)
            raise Preempted("checkpointed on SIGTERM")  # Ray Train / the RayJob retry resume

The pods' preStop hook (training/prestop.py) sends SIGTERM to the driver and every Ray Train
worker of the pod; `python -m training.run_script` installs `worker_setup` as Ray's worker
setup hook, so in a worker that has called `should_stop()` once the signal only sets a flag
(Ray's own handler would end the process at once, losing the steps since the last checkpoint).
"""

from __future__ import annotations

from training import preempt


class Preempted(RuntimeError):
    """Raise it after the preemption checkpoint: the run ends as preempted (exit 143, which a
    RayJob retries), not as failed or finished."""


def should_stop() -> bool:
    """True once this process got SIGTERM: checkpoint now and stop. The first call arms the
    flag (from then on SIGTERM no longer ends the worker at once)."""
    preempt._armed.set()
    return preempt.requested()


def worker_setup() -> None:
    """Ray's `worker_process_setup_hook` for script jobs: SIGTERM goes through training.preempt,
    which keeps Ray's "exit now" for processes that never asked `should_stop()`."""
    preempt.install_in_ray_worker()
