"""Another Ray instance on the machine, as Ray's own lookup sees one: a process whose command
line is a raylet's with a `--gcs-address` (ray._private.services.find_gcs_addresses scans the
process table for exactly that). Cheaper than `ray start` and never answers: a run that asks
Ray "which instance is mine?" instead of knowing it fails loudly beside it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

#: A documentation address (RFC 5737): nothing listens there.
DECOY_GCS = "192.0.2.77:6379"


@contextlib.contextmanager
def decoy_raylet(folder: Path) -> Iterator[str]:
    """Run a process named `raylet` with `--gcs-address=DECOY_GCS` while the block runs."""
    link = folder / "raylet"
    if not link.exists():
        os.symlink(sys.executable, link)
    proc = subprocess.Popen([str(link), "-c", "import time; time.sleep(3600)",
                             f"--gcs-address={DECOY_GCS}"])
    try:
        yield DECOY_GCS
    finally:
        proc.kill()
        proc.wait()
