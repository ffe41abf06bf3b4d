"""A user's own Ray Train script (`--script`): what it may import from the image, here (stdlib
only, cheap to import), and `hooks`, the GPT-2 job's guarantees given to the script from outside
it (storage, events, preemption). The runner is `python -m training.run_script`.

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
A preemption of the head pod alone reaches no worker on another pod: the driver tells the
run's hub, and `should_stop()` in a Ray worker asks the hub about once a second (in a thread
of its own, started by the first call), as the GPT-2 loop does.
"""

from __future__ import annotations

import sys
import threading

from training.run import preempt

#: The run's event hub, a named actor in the job's Ray namespace (training.script.hooks).
HUB_NAME = "submitter-script-events"
#: Set by the first `should_stop()`: the hub is asked by one thread per process at most.
_following = threading.Event()


class Preempted(RuntimeError):
    """Raise it after the preemption checkpoint: the run ends as preempted (exit 143, which a
    RayJob retries), not as failed or finished."""


def should_stop() -> bool:
    """True once this process got SIGTERM: checkpoint now and stop. The first call arms the
    flag (from then on SIGTERM no longer ends the worker at once)."""
    preempt._armed.set()
    if not _following.is_set():
        _following.set()
        _follow_the_driver()
    return preempt.requested()


def _follow_the_driver(every: float = 1.0) -> None:
    """In a Ray worker of a script run: ask the run's hub whether the driver got SIGTERM."""
    ray = sys.modules.get("ray")  # a worker has it; a plain script (no Ray) has nothing to ask
    if ray is not None and ray.is_initialized():
        threading.Thread(target=_poll_hub, args=(ray, every), name="preemption",
                         daemon=True).start()


def _poll_hub(ray: object, every: float) -> None:
    try:
        hub = ray.get_actor(HUB_NAME)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - no hub (not run by training.run_script): SIGTERM still works
        return
    preempt.follow_driver(hub, threading.Event(), every)


def worker_setup() -> None:
    """Ray's `worker_process_setup_hook` for script jobs: SIGTERM goes through training.run.preempt,
    which keeps Ray's "exit now" for processes that never asked `should_stop()`; its own Ray's
    address (training.run.own_ray)."""
    from training.run.own_ray import pin_address

    pin_address()
    preempt.install_in_ray_worker()
