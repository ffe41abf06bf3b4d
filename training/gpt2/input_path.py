"""The input path: a step's micro-batches from host memory to the device, one copy ahead.

Why: a pageable NumPy batch copied with `non_blocking=True` is a synchronous copy (the CUDA
driver stages it through its own pinned buffer while the host waits), and a step's copies all
sat on the compute stream, in line with its kernels. Here, on CUDA:
- each micro-batch is written into a reusable **pinned** host buffer (a host memcpy of ~0.1-1 MB)
  and copied to the device on a **side stream**; the copy of micro-batch k+1 is issued when
  micro-batch k is handed to the model, so it runs while k's forward and backward do (and the
  first one of a step while the previous step's optimizer runs);
- the compute stream waits for a copy's event before using its tensor, and the tensor is
  `record_stream`-ed on the compute stream, so the caching allocator does not hand its memory to
  another tensor while the compute stream may still read it;
- a pinned buffer is reused only after its previous copy's event has completed.
On CPU there is nothing to overlap: no pinning, no streams, the same calls; `to_device` returns
`torch.from_numpy` of the batch (the same tensor the loop used before).

The host side: a step takes its `accumulation` micro-batches from the source (Ray Data's
iterator, which reads and formats ahead in its own threads) before it starts, so that a partial
accumulation at the end of an epoch is dropped before any of it is trained on. The time blocked
there is the step's data wait; `WaitShare` turns each step's wait over that step's time into the
`data_wait_fraction` of a progress window or an epoch (steps weighted by their time, so the
figure is the share of step time spent waiting, not diluted by evaluation or checkpoint pauses
between steps).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

#: The key of the token array in a Ray Data NumPy batch.
KEY = "input_ids"
#: Pinned buffers in the pool: the one being copied, the one ahead, and one spare.
PINNED_BUFFERS = 3


class Staged:
    """One micro-batch of a step: its host array, and its device copy once issued."""

    __slots__ = ("host", "tensor", "event", "index")

    def __init__(self, host: Any, index: int) -> None:
        self.host, self.index = host, index
        self.tensor: Any = None
        self.event: Any = None


class Step(list):
    """The micro-batches of one optimizer step (a list of `Staged`, in the source's order)."""


class InputPath:
    """Host batches to device tensors for one worker's device; see the module docstring."""

    def __init__(self, device: Any, key: str = KEY) -> None:
        import torch

        self.device, self.key = device, key
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._pool: list[list[Any]] = []  # [pinned tensor, event of its last copy]
        self._next_buffer = 0
        self._step: Optional[Step] = None
        self.copies = 0  # host->device copies issued on the side stream (for tests and facts)

    # --- the host side ------------------------------------------------------------------
    def take(self, source: Iterator[dict[str, Any]], count: int) -> Step:
        """Up to `count` micro-batches from `source` (fewer: the source ran out), and the first
        one's device copy started."""
        step = Step()
        for i in range(count):
            batch = next(source, None)
            if batch is None:
                break
            step.append(Staged(batch[self.key], i))
        self._step = step
        if len(step) == count and step:
            self._issue(step[0])
        return step

    # --- the device side ----------------------------------------------------------------
    def to_device(self, batch: Any) -> Any:
        """The device tensor of a micro-batch: a `Staged` of the current step (its copy awaited
        on the compute stream, the next one's started), or a plain NumPy batch (evaluation:
        copied at once, pinned on CUDA)."""
        if not isinstance(batch, Staged):
            return self._copy_now(batch[self.key])
        step = self._step
        if step is not None and batch.index + 1 < len(step) and step[batch.index] is batch:
            self._issue(step[batch.index + 1])  # overlaps this micro-batch's compute
        if batch.tensor is None:
            self._issue(batch)
        if not self.cuda:
            return batch.tensor
        import torch

        current = torch.cuda.current_stream(self.device)
        current.wait_event(batch.event)
        batch.tensor.record_stream(current)
        return batch.tensor

    def _copy_now(self, host: Any) -> Any:
        import torch

        tensor = torch.from_numpy(host)
        if not self.cuda:
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _issue(self, staged: Staged) -> None:
        """Start one micro-batch's copy (once)."""
        if staged.tensor is not None:
            return
        import torch

        host = torch.from_numpy(staged.host)
        if not self.cuda:
            staged.tensor = host
            return
        pinned, slot = self._pinned(host)
        pinned.copy_(host)
        # allocated on the side stream; to_device's record_stream covers its use on the other
        with torch.cuda.stream(self.stream):
            staged.tensor = pinned.to(self.device, non_blocking=True)
            staged.event = torch.cuda.Event()
            staged.event.record(self.stream)
        slot[1] = staged.event
        self.copies += 1

    def _pinned(self, like: Any) -> tuple[Any, list[Any]]:
        """The next pinned buffer of the pool, reshaped to `like`, once its last copy is done."""
        import torch

        if len(self._pool) < PINNED_BUFFERS:
            self._pool.append([None, None])
        slot = self._pool[self._next_buffer % len(self._pool)]
        self._next_buffer += 1
        if slot[1] is not None:
            slot[1].synchronize()  # issued two micro-batches ago: long done in steady state
        nbytes = like.numel() * like.element_size()
        if slot[0] is None or slot[0].numel() < nbytes:
            slot[0] = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return slot[0][:nbytes].view(like.dtype).view(like.shape), slot


class WaitShare:
    """Data wait over step time, summed over steps: the `data_wait_fraction` of a window or an
    epoch, measured per step (each step's wait against that step's own time)."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.took = 0.0
        self.steps = 0

    def add(self, waited: float, took: float) -> None:
        """One step: `waited` seconds blocked on the source, out of `took` seconds in all."""
        self.waited += waited
        self.took += max(took, waited)
        self.steps += 1

    def fraction(self) -> float:
        return self.waited / self.took if self.took > 0 else 0.0

