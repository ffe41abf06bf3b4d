"""Waiting in tests: poll until something holds, under a deadline that guards against a hang
(never a timing the test asserts: under load a signal may land late)."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 600.0,
             explain: Callable[[], str] = lambda: "", interval: float = 0.5) -> Any:
    """Poll `predicate` until it returns something truthy, and return that; at the deadline
    fail with `what` and `explain()` (what the system looked like)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f}s\n{explain()}".rstrip())
