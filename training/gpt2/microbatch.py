"""The micro-batch each worker trains with, chosen on the worker from its GPU's free memory.

The job document fixes the global batch (sequences per optimizer step, all workers:
submitter.contract.batch); this module decides how one worker makes its share of it. On a GPU
without `--batch-size-per-worker`, the micro-batch is the largest that fits the memory the device
has free now (`torch.cuda.mem_get_info`: another process on the card counts) at the job's
precision (fp32 activations take 4 bytes) and divides the worker's share; the workers agree on
the smallest figure that fits (one all-reduce at start), so equal shares make equal micro-batches.
On CPU, and with `--batch-size-per-worker`, the micro-batch is the fixed one (today's behaviour).

Shares may be unequal (an elastic group of 3 splits 2,048 sequences 704/704/640), so the
accumulation may differ between workers; `loss_weight` scales each micro-batch's mean loss so
that the gradient DDP averages is the mean over every token of the step, whatever the split.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from submitter.contract import batch
from submitter.contract.spec import JobSpec


@dataclass(frozen=True)
class WorkerBatch:
    """One worker's part of an optimizer step."""

    micro: int              # sequences per forward/backward
    accumulation: int       # micro-batches per optimizer step
    share: int              # sequences per optimizer step on this worker (micro x accumulation)
    global_batch: int       # sequences per optimizer step, all workers
    loss_weight: float      # what each micro-batch's mean loss is multiplied by
    fits: Optional[int]     # sequences that fit the device (None: the micro-batch is fixed)
    pace: int = 0           # the group's largest share (0: this one)
    offset: int = 0         # where this worker's slice of a step starts (the shares before it)

    @property
    def equal(self) -> bool:
        """Every worker of the group carries the same share."""
        return self.pace in (0, self.share)

    def paced(self, batches: Iterator[Any]) -> Iterator[Any]:
        """This worker's micro-batches for an epoch, ending at the step the worker with the
        largest share runs out of data (see `paced`); `batches` itself when the shares are
        equal. Read the shard with drop_last=False when they are not: the pace needs its exact
        row count."""
        return batches if self.equal else paced(batches, self.accumulation, self.pace)


def worker_batch(resolved: batch.Resolved, world: int, rank: int,
                 fits: Optional[int] = None) -> WorkerBatch:
    """Rank `rank`'s micro-batch, accumulation and loss weight in a group of `world` (pure).
    `fits`: the sequences that fit this device (used when the micro-batch is not fixed)."""
    if resolved.global_batch is None:  # CPU default: one fixed micro-batch per worker a step
        assert resolved.micro is not None
        return WorkerBatch(resolved.micro, 1, resolved.micro, resolved.micro * world, 1.0, None,
                           offset=rank * resolved.micro)
    split = batch.shares(resolved.global_batch, world, resolved.micro)
    share = split[rank]
    if resolved.micro is not None:
        micro, fits = resolved.micro, None
    else:
        fits = fits or resolved.fits or 1
        micro = batch.largest_divisor_at_most(share, fits)
    weight = batch.loss_weight(share, micro, world, resolved.global_batch)
    return WorkerBatch(micro, share // micro, share, resolved.global_batch, weight, fits,
                       split[0], sum(split[:rank]))


def paced(batches: Iterator[Any], accumulation: int, pace: int) -> Iterator[Any]:
    """Micro-batches in steps of `accumulation`, as long as a worker taking `pace` sequences a
    step could still make the step from a shard of this one's size (Ray Train splits the data
    into equal shards). With unequal shares the workers would otherwise run out of data at
    different steps, and the one that stops first would leave the others waiting in a
    collective. Reads ahead at most one step's difference; a final partial batch (drop_last
    off) is counted, never yielded."""
    rows, ahead, step = 0, deque(), 0
    while True:
        while rows < (step + 1) * pace:
            got = next(batches, None)
            if got is None:
                return
            rows += len(got["input_ids"])
            ahead.append(got)
        for _ in range(accumulation):
            yield ahead.popleft()
        step += 1


def sequences_that_fit_here(job: JobSpec, precision: str, vocab: int, device: Any,
                            free_bytes: Optional[Callable[[Any], tuple[int, int]]] = None) -> int:
    """Sequences of the job's block that fit the memory `device` has free now at `precision`
    (bf16/fp16/fp32). `free_bytes` is torch.cuda.mem_get_info unless given (tests inject it)."""
    if free_bytes is None:
        import torch

        free_bytes = torch.cuda.mem_get_info
    free, _total = free_bytes(device)
    return batch.sequences_that_fit(job.model, job.block, free, precision, vocab)


def agree_on_smallest(value: int, device: Any) -> int:
    """The smallest `value` over all workers (one all-reduce), so that workers with equal shares
    choose equal micro-batches (FSDP's ranks must run as many); itself in one process."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def choose(job: JobSpec, world: int, rank: int, device: Any, precision: str, vocab: int,
           free_bytes: Optional[Callable[[Any], tuple[int, int]]] = None) -> WorkerBatch:
    """This worker's part of the step: on a CUDA device without a fixed micro-batch, sized from
    its free memory (every worker calls this: the agreement is a collective)."""
    resolved = job.batch_resolution()
    fits = None
    if resolved.micro is None and getattr(device, "type", "cpu") == "cuda":
        fits = agree_on_smallest(sequences_that_fit_here(job, precision, vocab, device, free_bytes),
                                 device)
    return worker_batch(resolved, world, rank, fits)
