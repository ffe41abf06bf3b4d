"""At most one checkpoint upload in flight: back-pressure for the async save.

An async save (training/gpt2/loop.py `save`) copies the whole state into host memory (~1.6 GB for
gpt2-small with AdamW) and hands the copy to Ray Train's upload thread, whose queue has no
bound. Uploads slower than the checkpoint cadence would pile copies up until rank 0 is
OOM-killed. So rank 0 holds this slot from the hand-off until the upload function returns, and
the next save waits for it *before* it makes its copy: one host copy in flight, never a queue.
The wait pauses training (`checkpoint_saved.stall_s` includes it); the preemption checkpoint
waits at most what is left of its budget.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional


class UploadSlot:
    def __init__(self) -> None:
        self._idle = threading.Event()
        self._idle.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Until no upload is in flight (True), or `timeout` seconds (False)."""
        return self._idle.wait(timeout)

    def hold(self, upload: Callable[..., Any]) -> Callable[..., Any]:
        """Take the slot for `upload`: the returned function frees it when it ends, however."""
        self._idle.clear()

        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return upload(*args, **kwargs)
            finally:
                self._idle.set()

        return run

    def release(self) -> None:
        """The hand-off failed before the upload could run."""
        self._idle.set()
