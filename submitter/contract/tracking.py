"""The metrics trackers' own variables that can be wrong before a run starts: checked by
`--env` (submitter.contract.spec) and again by the driver where it runs (training.events.trackers)."""

from __future__ import annotations

import re
from typing import Mapping, Optional

#: W&B's modes (`dryrun` and `run` are its older names for offline and online).
WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")
_URI = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|/)")


def tracker_env_problem(environ: Mapping[str, str]) -> Optional[str]:
    """One line saying what is wrong with WANDB_MODE or MLFLOW_TRACKING_URI, or None."""
    mode = environ.get("WANDB_MODE")
    if mode is not None and mode not in WANDB_MODES:
        return f"WANDB_MODE={mode!r} is not a W&B mode: use one of {', '.join(WANDB_MODES[:4])}"
    uri = environ.get("MLFLOW_TRACKING_URI")
    if uri is not None and uri.strip() and not _URI.match(uri.strip()):
        return (f"MLFLOW_TRACKING_URI={uri!r} is not a tracking URI: use e.g. "
                "http://mlflow.mlops:5000, sqlite:////mnt/mlflow.db or file:/mnt/mlruns")
    return None
