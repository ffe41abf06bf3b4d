"""Validation loss that every rank computes over the same number of batches.

Why lock-step: under FSDP the forward all-gathers each unit's parameters, so a rank that runs
out of validation batches one batch early goes on to the loss's all-reduce while the others
all-gather: the collectives do not match and the group hangs until the collective timeout.
Before each batch the ranks all-reduce (MIN) a flag "I have one more"; the pass ends for all
as soon as one rank's share is exhausted. The prepared corpus deals equal shares already
(training.data.reader `val_batches`); Ray Data's `streaming_split(equal=True)` should too: the
flag makes the pass safe whatever a data path yields.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Iterable, Iterator, Optional


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def lockstep(batches: Iterable[Any], device: Any, limit: int = 0) -> Iterator[Any]:
    """`batches` while every rank still has one (at most `limit`; 0: no limit): the same
    count on every rank. One small all-reduce per batch (and one at the end)."""
    import torch
    import torch.distributed as dist

    together = _distributed()
    source, taken = iter(batches), 0
    while True:
        batch = next(source, None) if not limit or taken < limit else None
        if together:
            flag = torch.tensor([0 if batch is None else 1], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if not int(flag.item()):
                return
        elif batch is None:
            return
        yield batch
        taken += 1


def evaluate_loss(net: Any, batches: Iterable[Any], device: Any,
                  to_device: Callable[[Any], Any], autocast: Callable[[], Any] = nullcontext,
                  limit: int = 0) -> tuple[Optional[float], int]:
    """(mean loss over every rank's batches, batches per rank); (None, 0) when there were none.
    `net` is put in eval mode for the pass and back in train mode after."""
    import torch
    import torch.distributed as dist

    net.eval()
    total, count = torch.zeros((), device=device, dtype=torch.float64), 0
    try:
        with torch.no_grad(), autocast():
            for batch in lockstep(batches, device, limit):
                x = to_device(batch)
                total += net(input_ids=x, labels=x).loss.detach().double()
                count += 1
    finally:
        net.train()
    sums = torch.tensor([total.item(), float(count)], dtype=torch.float64, device=device)
    if _distributed():
        dist.all_reduce(sums)
    loss_sum, batches_sum = sums.tolist()
    return (loss_sum / batches_sum if batches_sum else None), count
