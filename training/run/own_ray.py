"""Every Ray process of a run talks to its own Ray, never to another instance on the machine.

Ray's State API (which Ray Train's PlacementGroupCleaner polls every second) finds its cluster
from RAY_ADDRESS, else by scanning the machine for GCS processes; with a second Ray running
there (another local run, a test cluster, a `ray start` left over) the scan finds several and
the cleaner's thread dies with "Found multiple active Ray instances", a traceback in a run that
succeeded. The setup hooks pin RAY_ADDRESS to the GCS this process is connected to.
"""

from __future__ import annotations

import os
from typing import Any, MutableMapping, Optional


def pin_address(environ: MutableMapping[str, str] = os.environ, ray: Optional[Any] = None) -> None:
    """Set RAY_ADDRESS to this process's own GCS where nothing set it (a pod's or a user's
    value is kept). Called from a Ray worker's setup hook, after it connected."""
    if environ.get("RAY_ADDRESS"):
        return
    if ray is None:
        import ray
    try:
        address = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - not connected: nothing to pin, Ray's own lookup stays
        return
    if address:
        environ["RAY_ADDRESS"] = address
