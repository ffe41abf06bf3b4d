"""A run's limits while it trains: `deadline` (wall-clock) and `max_cost` (GPU-hours x price).

Both count over the whole run, every segment (submit, each resume or retry) together, as the
submit-time estimate does: a limit is a budget for the run, not for one attempt. So a run
stopped by a limit continues only when the limit is raised (or dropped); a retry or resume
that finds the budget already spent is refused at once, before Ray starts (`spent`).

Wall-clock counts from each driver's start (start-up included: the GPUs are held then too)
to its last event. Spend is the hours billed times the price: GPU-hours on GPUs (GPUs x
wall-clock, per segment), hours of the machine for a CPU run (as `submitter estimate` prices a
local run). The price is the job's --gpu-hour-price, else the one its recorded estimate used.

Pure and stdlib only: the driver builds `Limits`, rank 0 of the training loop asks `passed`
before every step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

#: The reasons a limit stops a run (run_stopped.reason, usage.json's stopped_by).
DEADLINE, MAX_COST = "deadline", "max_cost"


@dataclass(frozen=True)
class Limits:
    """What rank 0 needs to decide, each step, whether a limit has passed."""

    deadline_s: Optional[float]       # the run's wall-clock budget
    max_cost: Optional[float]         # the run's money budget
    price: Optional[float]            # per GPU-hour (None: max_cost cannot be measured)
    prior_wall_s: float = 0.0         # earlier segments' wall-clock
    prior_billed_hours: float = 0.0   # earlier segments' GPU-hours (machine hours on CPU)
    started_at: float = 0.0           # this segment's start (POSIX seconds, the driver's clock)
    gpus_per_worker: int = 0          # 1 on GPUs, 0 on CPU

    @property
    def active(self) -> bool:
        return self.deadline_s is not None or (self.max_cost is not None and bool(self.price))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> Optional["Limits"]:
        if not data:
            return None
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def limits_of(job: Any, *, prior_wall_s: float, prior_billed_hours: float, started_at: float,
              use_gpu: bool, estimate_price: Optional[float] = None) -> Limits:
    """The job's limits (JobSpec fields deadline, max_cost, gpu_hour_price; absent: none).
    `estimate_price`: the price the recorded estimate used (a price table's, which the job
    document does not carry), when the job gives none."""
    price = _number(getattr(job, "gpu_hour_price", None))
    deadline = job.deadline_seconds  # JobSpec's parse (spec.duration_seconds), checked there
    return Limits(deadline_s=None if deadline is None else float(deadline),
                  max_cost=_number(getattr(job, "max_cost", None)),
                  price=price if price is not None else _number(estimate_price),
                  prior_wall_s=prior_wall_s, prior_billed_hours=prior_billed_hours,
                  started_at=started_at, gpus_per_worker=1 if use_gpu else 0)


def _number(value: Any) -> Optional[float]:
    return None if value is None or value == "" else float(value)


def elapsed_s(limits: Limits, now: float) -> float:
    return limits.prior_wall_s + max(0.0, now - limits.started_at)


def spend(limits: Limits, now: float, workers: int) -> Optional[float]:
    """Money spent so far (None without a price). `workers`: the group training now."""
    if not limits.price:
        return None
    units = workers * limits.gpus_per_worker or 1  # GPUs held, or the one machine
    hours = limits.prior_billed_hours + max(0.0, now - limits.started_at) / 3600.0 * units
    return hours * limits.price


def passed(limits: Optional[Limits], now: float, workers: int) -> Optional[str]:
    """The first limit the run has passed (DEADLINE, MAX_COST), or None."""
    if limits is None:
        return None
    if limits.deadline_s is not None and elapsed_s(limits, now) >= limits.deadline_s:
        return DEADLINE
    cost = spend(limits, now, workers)
    if limits.max_cost is not None and cost is not None and cost >= limits.max_cost:
        return MAX_COST
    return None


def stop_text(reason: str, limits: Limits, now: float, workers: int) -> str:
    """What run_stopped says: which limit, what was measured against it."""
    from submitter.contract.events import duration

    if reason == DEADLINE:
        return (f"deadline {duration(limits.deadline_s or 0)} reached after "
                f"{duration(elapsed_s(limits, now))} of wall-clock")
    unit = "GPU-hour" if limits.gpus_per_worker else "hour"
    return (f"max cost {limits.max_cost:g} reached: {spend(limits, now, workers) or 0:.2f} spent "
            f"at {limits.price:g} per {unit}")


def continue_hint(reason: str) -> str:
    flag = "--deadline" if reason == DEADLINE else "--max-cost"
    return (f"the checkpoint is saved; to continue, run it again with a larger {flag} (or "
            "without it): the limit counts the whole run, every segment together")


def spent(limits: Limits, workers: int) -> Optional[str]:
    """Before a segment starts: a one-line refusal when the run's budget is already spent."""
    reason = passed(limits, limits.started_at, workers)
    if reason is None:
        return None
    return (f"this run already used its {'deadline' if reason == DEADLINE else 'max cost'}: "
            f"{stop_text(reason, limits, limits.started_at, workers)}; nothing started; "
            f"{continue_hint(reason)}")
