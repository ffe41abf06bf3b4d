"""`checkpoint_saved`, told by the one process that knows: Ray Train's controller.

A worker's `ray.train.report(checkpoint=...)` returns once the files are on storage, but a
resume uses only what the controller has *registered* (its run snapshot,
`checkpoint_manager_snapshot.json`). Ray Train calls a `UserCallback.after_report` after its
checkpoint manager registered the report and wrote that snapshot, so the event sent from
there is true when it is read: `registered: true`, with the reason the loop saved it
(`epoch_end`, `interval` or `preemption`).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ray.train import UserCallback

from training.run.preempt import UNSCORED


def scored(metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics` as Ray Train may rank them: it ranks checkpoints by val_loss
    (`checkpoint_score_attribute`) and multiplies the value, so a None (no validation split,
    or a split smaller than a micro-batch per worker) raised TypeError in the controller at a
    run's second checkpoint. An unvalidated checkpoint reports UNSCORED (the largest finite
    loss): ranked below every validated one, and among unvalidated ones by report order, so a
    run without validation keeps its latest checkpoints (`val_loss` reads None again in its
    event and the run's final metrics: `validated`)."""
    return {**metrics, "val_loss": UNSCORED} if metrics.get("val_loss") is None else metrics


def validated(val_loss: Any) -> Optional[float]:
    """A reported val_loss as a loss, None for an unvalidated checkpoint's (`scored`)."""
    return None if val_loss is None or val_loss == UNSCORED else val_loss


def reason_of(metrics: dict[str, Any]) -> str:
    if metrics.get("reason"):
        return str(metrics["reason"])
    return "epoch_end" if metrics.get("epoch_done") else "interval"


def event_fields(metrics: dict[str, Any], checkpoint_path: str, run_uri: str) -> dict[str, Any]:
    """The checkpoint_saved fields for a registered checkpoint (pure: tested without Ray)."""
    return {"epoch": metrics.get("epoch"), "step": metrics.get("step"),
            "path": run_uri.rstrip("/") + "/" + os.path.basename(checkpoint_path.rstrip("/"))
            if "://" in run_uri else os.path.join(run_uri, os.path.basename(checkpoint_path)),
            # a stop's checkpoint (preemption, a limit) is not validated: its val_loss is null
            "val_loss": (None if reason_of(metrics) in ("preemption", "deadline", "max_cost")
                         else validated(metrics.get("val_loss"))),
            "reason": reason_of(metrics),
            # seconds the training loop paused for it (the state's copy into host memory)
            **({"stall_s": metrics["stall_s"]} if "stall_s" in metrics else {}),
            "registered": True}


class CheckpointEvents(UserCallback):
    """Runs in the controller; sends to the run's emitter actor (fire and forget)."""

    def __init__(self, hub: Any, run_uri: str) -> None:
        self.hub, self.run_uri = hub, run_uri

    def after_report(self, run_context: Any, metrics: list, checkpoint: Optional[Any]) -> None:
        if checkpoint is None:
            return
        first = metrics[0] if metrics else {}
        self.hub.emit.remote("checkpoint_saved", **event_fields(first, checkpoint.path, self.run_uri))
