"""The learning-rate plan: linear warm-up, cosine decay to a floor, re-planned without a jump.

A run's total number of optimizer steps is not always known at step 1 and may change later:
- the driver estimates the steps per epoch from the data's size instead of a counting pass
  (see training.data.pipeline.estimate_blocks), and learns the real number when the first epoch ends;
- a finished run may be extended with more `--epochs`.
In both cases the plan is stored in the checkpoint (`LRPlan.to_dict`) and `replan(step, total)`
keeps the schedule continuous: from `step` on, a cosine runs from the factor the old plan had
reached at `step` down to the floor at the new `total`. Nothing else changes: warm-up is never
repeated, and a run extended after it reached the floor stays at the floor (the LR never jumps
back up; re-warming a converged model is a decision for a new run, not a side effect).

The LR is set on the optimizer directly each step (`apply`), not through a torch LRScheduler:
the plan is plain data, so a checkpoint restores exactly it and nothing pickles a lambda.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping


def cosine(step: int, start: int, end: int, high: float, low: float) -> float:
    """high at `start`, low at `end` (and after), half a cosine in between."""
    if step >= end:
        return low
    progress = (step - start) / max(1, end - start)
    return low + 0.5 * (high - low) * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class LRPlan:
    """factor(step) multiplies the peak learning rate.

    warmup: linear warm-up steps (from the first plan; never repeated);
    total: the step at which the floor is reached (the horizon);
    min_ratio: the floor, as a fraction of the peak;
    since, since_factor: where the current cosine segment starts (0 and 1.0 for the first
    plan; a re-plan starts one at the step it happened, from the factor reached there).
    """

    warmup: int
    total: int
    min_ratio: float
    since: int = 0
    since_factor: float = 1.0

    def factor(self, step: int) -> float:
        if self.since == 0 and step < self.warmup:
            return (step + 1) / self.warmup
        start = self.since or self.warmup
        return cosine(step, start, self.total, self.since_factor, self.min_ratio)

    def replan(self, step: int, total: int) -> "LRPlan":
        """The same plan up to `step`; from there a cosine from its factor to the floor at
        `total`. Within the warm-up only the horizon moves (the warm-up goes on)."""
        if total == self.total:
            return self
        if self.since == 0 and step < self.warmup:
            return LRPlan(self.warmup, max(total, self.warmup), self.min_ratio)
        return LRPlan(self.warmup, max(total, step), self.min_ratio, step, self.factor(step))

    def apply(self, optimizer: Any, peak_lr: float, step: int) -> float:
        """Set every group's LR for the optimizer step numbered `step` (0-based); returns it."""
        lr = peak_lr * self.factor(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "lr_plan", **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LRPlan":
        return cls(**{k: v for k, v in data.items() if k != "kind"})


def first_plan(total: int, warmup: int | None, min_ratio: float) -> LRPlan:
    """A new run's plan: warm-up (default 5% of the steps, at least 1) then cosine."""
    w = warmup if warmup is not None else max(1, total // 20)
    return LRPlan(warmup=max(1, w), total=max(total, 1), min_ratio=min_ratio)


def resumed_plan(saved: Mapping[str, Any] | None, step: int, total: int, warmup: int | None,
                 min_ratio: float) -> LRPlan:
    """The plan to continue with: the checkpoint's, re-planned when the run's total changed
    (more epochs, or a better steps-per-epoch figure); a new one for a new run (or a checkpoint
    from before plans were saved)."""
    if not saved or saved.get("kind") != "lr_plan":
        return first_plan(total, warmup, min_ratio)
    return LRPlan.from_dict(saved).replan(step, total)
