"""Another job busy on the same cores: processes that spin while a block runs, so a test sees
the timings a loaded CI machine gives (late polls, slow actors) and asserts what holds then."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Iterator


@contextlib.contextmanager
def busy_cores(n: int = 0) -> Iterator[None]:
    """`n` spinning processes (default: one per core) for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(n or os.cpu_count() or 1)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
