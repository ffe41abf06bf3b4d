"""The checkpoint file: what a training step's state becomes on the shared storage, and back.

A checkpoint directory holds `state.pt`: state dicts (tensors), numbers, strings, lists and
dicts, nothing else. It is read with `torch.load(weights_only=True)`: the storage is shared
(a PVC, a bucket), and unpickling arbitrary objects from it would run the code of anyone who
can write there. `save_state` refuses to write what `load_state` could not read back.
"""

from __future__ import annotations

import os
from typing import Any

STATE_FILE = "state.pt"
#: The keys every checkpoint carries (resume and export rely on them).
KEYS = ("model", "optimizer", "scheduler", "epoch", "step", "step_in_epoch", "epoch_done",
        "config", "model_config")


def plain(value: Any, where: str = "state") -> Any:
    """`value` with tuples as lists, or TypeError naming the first thing `weights_only` would
    refuse (e.g. a torch.dtype in a config dict, a function in a scheduler's state)."""
    import torch

    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if isinstance(value, dict):
        return {k: plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    raise TypeError(f"{where} is a {type(value).__name__}, which a weights_only checkpoint "
                    "cannot hold; store plain data")


def snapshot(value: Any, device_type: str) -> Any:
    """The state as it is now, safe to write while training goes on: on CUDA the gathered
    state dict (cpu_offload) already holds host copies; on CPU it holds the live tensors, which
    the next optimizer step would change under a background write, so they are cloned."""
    if device_type != "cpu":
        return value
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: snapshot(v, device_type) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(v, device_type) for v in value)
    return value


def interval_due(since_last_s: float, minutes: float) -> bool:
    """Is a timed checkpoint due: `minutes` of wall time (0 = never) since the last checkpoint
    (JobSpec.checkpoint_minutes; a hard fault then loses at most that much, plus the upload)."""
    return minutes > 0 and since_last_s >= minutes * 60


def save_state(directory: str, **state: Any) -> str:
    """Write `state.pt` into `directory` (the loop's temporary checkpoint dir)."""
    import torch

    missing = set(KEYS) - set(state)
    if missing:
        raise ValueError(f"a checkpoint needs {', '.join(sorted(missing))}")
    path = os.path.join(directory, STATE_FILE)
    torch.save(plain(state), path)
    return path


def load_state(directory: str) -> dict[str, Any]:
    """Read `state.pt` from a checkpoint directory: tensors and plain data only."""
    import torch

    return torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=True)
