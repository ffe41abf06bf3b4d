"""Two processes over gloo on CPU, for the tests of gradient communication (test_grad_sync,
test_comm, test_fsdp_gather): joining the group, and a micro-batch's backward through the
loop's own `training.parallel.gradient_sync`, as `training.loop.step_once` runs it."""

from __future__ import annotations

from typing import Any, Iterator


def join(rank: int, world: int, port: int) -> None:
    """Join a gloo group of `world` on 127.0.0.1:`port` (one thread: two ranks share 2 cores)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)


def micro_batches(generator: Any, accum: int, micro: int, vocab: int,
                  block: int) -> Iterator[tuple[bool, Any]]:
    """One optimizer step's random micro-batches: (last of the step?, input ids)."""
    import torch

    for k in range(accum):
        yield k == accum - 1, torch.randint(0, vocab, (micro, block), generator=generator)


def backward(model: Any, x: Any, accum: int, last: bool) -> None:
    """One micro-batch's share of the step's mean loss, backward; gradients sync on the last."""
    from training.parallel import gradient_sync

    with gradient_sync(model, sync=last):
        (model(input_ids=x, labels=x).loss / accum).backward()
