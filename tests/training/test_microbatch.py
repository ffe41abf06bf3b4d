"""The worker's micro-batch (training.gpt2.microbatch): chosen from the device's free memory and the
precision as the largest that fits and divides the worker's share; the loss weights that keep
the step's loss a token mean when the shares (and accumulation) differ (issue 23 item 1).
No GPU here: the free memory is injected; DDP's averaging runs over gloo on CPU."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from submitter.contract import batch  # noqa: E402
from submitter.contract.spec import JobSpec  # noqa: E402
from tests.support import gloo  # noqa: E402
from training.gpt2.microbatch import choose, sequences_that_fit_here, worker_batch  # noqa: E402

GIB = 2**30
CUDA = SimpleNamespace(type="cuda")  # what choose() reads of a device


def _free(gib: float):
    return lambda device: (int(gib * GIB), int(80 * GIB))


def test_the_micro_batch_is_the_largest_that_fits_the_free_memory_and_divides_the_share():
    job = JobSpec.build(name="j", replicas=8, gpu_per_pod=1)  # 2,048 sequences, 256 each
    small = choose(job, 8, 0, CUDA, "bf16", 50257, free_bytes=_free(16))
    large = choose(job, 8, 0, CUDA, "bf16", 50257, free_bytes=_free(79))
    assert (small.micro, small.accumulation) == (64, 4)
    assert (large.micro, large.accumulation) == (256, 1)
    for w in (small, large):
        assert w.micro <= w.fits and w.share == 256 == w.micro * w.accumulation
        assert w.fits == sequences_that_fit_here(job, "bf16", 50257, CUDA,
                                                 _free(16 if w is small else 79))
    # what is not free (the CUDA context, another process on the card) counts: fewer fit
    busy = choose(job, 8, 0, CUDA, "bf16", 50257, free_bytes=_free(15.5))
    assert (busy.micro, busy.accumulation) == (32, 8)


def test_fp32_is_sized_for_4_byte_activations():
    job = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, precision="fp32")
    half = sequences_that_fit_here(job, "bf16", 50257, CUDA, _free(79))
    full = sequences_that_fit_here(job, "fp32", 50257, CUDA, _free(79))
    assert full < 0.65 * half
    chosen = choose(job, 8, 0, CUDA, "fp32", 50257, free_bytes=_free(79))
    assert chosen.micro == 128 and chosen.micro <= full < 256  # 256 fit in bf16, not in fp32


def test_cpu_and_an_explicit_micro_batch_keep_the_fixed_one():
    def no_gpu(device):
        raise AssertionError("a fixed micro-batch reads no GPU memory")

    cpu = choose(JobSpec.build(name="j", replicas=3), 3, 1, SimpleNamespace(type="cpu"), "fp32",
                 257, free_bytes=no_gpu)
    assert (cpu.micro, cpu.accumulation, cpu.global_batch, cpu.loss_weight) == (8, 1, 24, 1.0)
    fixed = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, batch_size_per_worker=16)
    mine = choose(fixed, 8, 0, CUDA, "bf16", 50257, free_bytes=no_gpu)
    assert (mine.micro, mine.accumulation) == (16, 16)


def test_a_device_too_small_for_one_sequence_still_trains_one():
    job = JobSpec.build(name="j", replicas=2, gpu_per_pod=1)
    assert choose(job, 2, 0, CUDA, "bf16", 50257, free_bytes=_free(1)).micro == 1


def _flat_grad(model) -> "torch.Tensor":
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_weighted_losses_make_the_averaged_gradient_the_token_mean_of_the_step():
    """Workers with unequal shares (20 sequences over 3: 7, 7, 6; micro-batches 1, 1, 3)
    accumulate weighted micro-batch losses; DDP's average of their gradients equals the
    gradient of the mean loss over all 20 sequences in one piece."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50))
    x = torch.randint(0, 50, (20, 6))

    def loss_of(rows):  # mean over the rows' tokens, as the model's loss is
        logits = model(rows[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 50), rows[:, 1:].reshape(-1))

    loss_of(x).backward()
    reference = _flat_grad(model).clone()
    model.zero_grad()
    resolved, world, total = batch.Resolved(None, 20, fits=4), 3, torch.zeros_like(reference)
    start = 0
    for rank in range(world):
        mine = worker_batch(resolved, world, rank)
        rows = x[start:start + mine.share]
        start += mine.share
        for k in range(mine.accumulation):
            (loss_of(rows[k * mine.micro:(k + 1) * mine.micro]) * mine.loss_weight).backward()
        total += _flat_grad(model)
        model.zero_grad()
    assert [worker_batch(resolved, world, r).accumulation for r in range(3)] == [7, 7, 2]
    assert torch.allclose(total / world, reference, atol=1e-6)


# --- the same through DDP over gloo: unequal accumulation, one all-reduce each -----------------

VOCAB, EOT, BLOCK, GLOBAL = 257, 256, 16, 20


def _sequences() -> "torch.Tensor":
    return torch.randint(0, VOCAB, (GLOBAL, BLOCK), generator=torch.Generator().manual_seed(7))


def _ddp_rank(rank: int, world: int, rendezvous: str, out: str) -> None:
    """One rank of a group of `world`: its share of the step, its micro-batches (a card that
    fits 4 sequences), the loop's gradient_sync and loss weight; writes its gradient."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from training.gpt2.model import build_model, gpt2_config
    from training.gpt2.parallel import gradient_sync

    gloo.join(rank, world, rendezvous)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(gpt2_config("tiny", VOCAB, EOT, BLOCK)))
    mine = worker_batch(batch.Resolved(None, GLOBAL, fits=4), world, rank)
    start = sum(worker_batch(batch.Resolved(None, GLOBAL, fits=4), world, r).share
                for r in range(rank))
    rows, step_loss = _sequences()[start:start + mine.share], torch.zeros(())
    for k in range(mine.accumulation):
        x = rows[k * mine.micro:(k + 1) * mine.micro]
        with gradient_sync(model, sync=k == mine.accumulation - 1):
            loss = model(input_ids=x, labels=x).loss * mine.loss_weight
            loss.backward()
        step_loss += loss.detach()
    dist.all_reduce(step_loss)
    if rank == 0:
        torch.save({"grad": _flat_grad(model.module), "loss": float(step_loss) / world,
                    "micro": mine.micro, "accumulation": mine.accumulation},
                   os.path.join(out, f"world{world}.pt"))
    gloo.leave()


@pytest.mark.slow  # 2 + 3 processes, each importing torch and transformers
def test_a_resize_that_changes_the_micro_batch_keeps_the_step_gradient_and_loss(tmp_path):
    from training.gpt2.model import build_model, gpt2_config

    torch.manual_seed(0)
    model = build_model(gpt2_config("tiny", VOCAB, EOT, BLOCK))
    x = _sequences()
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    reference = _flat_grad(model)
    got = {}
    for world in (2, 3):
        gloo.spawn(_ddp_rank, world, tmp_path, str(tmp_path))
        got[world] = torch.load(tmp_path / f"world{world}.pt")
    # 2 workers: 10 sequences each, 5 x 2; 3 workers: 7/7/6, rank 0 runs 7 x 1 (rank 2: 2 x 3)
    assert [(got[w]["micro"], got[w]["accumulation"]) for w in (2, 3)] == [(2, 5), (1, 7)]
    for world in (2, 3):
        assert torch.allclose(got[world]["grad"], reference, atol=1e-5), world
        assert abs(got[world]["loss"] - loss.item()) < 1e-5
    print(json.dumps({w: {"micro": got[w]["micro"], "accumulation": got[w]["accumulation"]}
                      for w in got}))


def _shard(rows: int, micro: int, drop_last: bool):
    """A worker's shard as Ray Data's iter_batches gives it: micro-batches of `micro` rows."""
    sizes = [micro] * (rows // micro) + ([] if drop_last or rows % micro == 0 else [rows % micro])
    return iter([{"input_ids": [0] * n} for n in sizes])


def _steps(mine, rows: int) -> int:
    """Optimizer steps the loop makes from this shard (it takes `accumulation` batches a step
    and stops at the first short step)."""
    batches, steps = mine.paced(_shard(rows, mine.micro, drop_last=mine.equal)), 0
    while True:
        step = [b for b in (next(batches, None) for _ in range(mine.accumulation)) if b is not None]
        if len(step) < mine.accumulation:
            return steps
        assert all(len(b["input_ids"]) == mine.micro for b in step)  # never a partial batch
        steps += 1


@pytest.mark.parametrize("g, world, fits", [(20, 3, 4), (2048, 3, 300), (2048, 7, 64), (100, 6, 7)])
def test_workers_with_unequal_shares_run_out_of_data_at_the_same_step(g, world, fits):
    """Ray Train splits the data into equal shards; a worker with a smaller share would make
    more steps from its shard than the largest share's worker, and wait forever in a collective
    the other never joins. Every rank stops at the largest share's last step."""
    group = [worker_batch(batch.Resolved(None, g, fits=fits), world, r) for r in range(world)]
    assert not group[-1].equal
    for rows in list(range(0, 3 * g // world)) + [10 * g + 7, 100 * g // world]:
        steps = {_steps(mine, rows) for mine in group}
        assert steps == {rows // group[0].share}, (rows, steps)


def test_equal_shares_read_the_shard_as_before():
    mine = worker_batch(batch.Resolved(None, 2048, fits=64), 8, 3)
    shard = _shard(1000, mine.micro, drop_last=True)
    assert mine.equal and mine.paced(shard) is shard
