"""Process groups over gloo on CPU, for the tests of gradient communication (test_grad_sync,
test_comm, test_fsdp_gather, test_microbatch, test_preempt, test_compute, test_parallel):
starting the ranks, joining and leaving the group, and a micro-batch's backward through the
loop's own `training.gpt2.parallel.gradient_sync`, as `training.gpt2.loop.step_once` runs it.

The ranks meet through a file (a FileStore), not a TCP port: no port picked now and bound
later (another test can take it meanwhile), and no store server living in rank 0 that the
others still talk to while it exits. They leave through a barrier, so that no rank tears down
its side of the group while another is still in a collective with it: a rank that did (rank 0
saving its results, rank 1 already gone) aborted in `destroy_process_group` under load
("terminate called without an active exception", once in a CI run)."""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Iterator


def rendezvous(directory: str | os.PathLike) -> str:
    """A fresh file in `directory` for one group to meet through (FileStore needs a new one)."""
    return os.path.join(str(directory), f"rendezvous-{uuid.uuid4().hex}")


def spawn(worker: Callable[..., None], world: int, directory: str | os.PathLike, *args: Any) -> None:
    """Run `worker(rank, world, rendezvous, *args)` in `world` spawned processes; raise if one fails."""
    import torch.multiprocessing as mp

    mp.start_processes(worker, args=(world, rendezvous(directory), *args), nprocs=world,
                       join=True, start_method="spawn")


def join(rank: int, world: int, rendezvous: str, backend: str = "gloo") -> None:
    """Join a group of `world` through the file `rendezvous` (spawned ranks take one thread
    each: they share 2 cores; a world of one is the test's own process, left as it is)."""
    import torch
    import torch.distributed as dist

    if world > 1:
        torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world)


def leave() -> None:
    """Leave the group once every rank is done with it."""
    import torch.distributed as dist

    if dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def micro_batches(generator: Any, accum: int, micro: int, vocab: int,
                  block: int) -> Iterator[tuple[bool, Any]]:
    """One optimizer step's random micro-batches: (last of the step?, input ids)."""
    import torch

    for k in range(accum):
        yield k == accum - 1, torch.randint(0, vocab, (micro, block), generator=generator)


def backward(model: Any, x: Any, accum: int, last: bool) -> None:
    """One micro-batch's share of the step's mean loss, backward; gradients sync on the last."""
    from training.gpt2.parallel import gradient_sync

    with gradient_sync(model, sync=last):
        (model(input_ids=x, labels=x).loss / accum).backward()
