"""An elastic group that goes 2 -> 3 -> 2 workers trains each sequence of the epoch exactly
once: every rank reads its slice of each step from the prepared corpus (training.data.reader)
with its group's share (training.gpt2.microbatch), the position is checkpointed between the
groups, and the next group continues from it (gloo on CPU, one process per rank)."""

from __future__ import annotations

import json

import pyarrow.fs as pafs

from submitter.contract import batch
from tests.support import gloo
from tests.support.corpus import GPT2, make_corpus

BLOCK, GLOBAL, SEED, EPOCH = 8, 16, 11, 2


def _phase(rank: int, world: int, group, root: str, state: str, steps: int) -> None:
    """One worker group of `world`: resume at the checkpointed position, train `steps` steps
    (each step's sequences gathered on rank 0), checkpoint the new position."""
    import torch.distributed as dist

    from training.data.reader import open_corpus
    from training.gpt2.microbatch import worker_batch

    with open(state) as f:
        saved = json.load(f)
    # GPU-style: the global batch fixed, each worker's share of it, its micro-batch (<= 2)
    mine = worker_batch(batch.Resolved(None, GLOBAL, fits=2), world, rank)
    reader = open_corpus(root, BLOCK)
    batches = reader.batches(reader.order(SEED, EPOCH), saved["sequences_in_epoch"], GLOBAL,
                             mine.offset, mine.share, mine.micro)
    for _ in range(steps):
        mine_ids = [int(i) for _ in range(mine.accumulation)
                    for i in next(batches)["input_ids"][:, 0]]
        gathered = [None] * world
        dist.all_gather_object(gathered, mine_ids, group=group)
        if rank == 0:
            saved["steps"].append({"world": world, "ids": [i for r in gathered for i in r]})
            saved["sequences_in_epoch"] += GLOBAL  # the checkpoint's position
    if rank == 0:
        with open(state, "w") as f:
            json.dump(saved, f)
    reader.close()


def _ranks(rank: int, world: int, rendezvous: str, root: str, state: str) -> None:
    """Three processes play the groups one after the other: ranks 0-1, then 0-2, then 0-1
    (a group's own process group; a barrier of all three between groups)."""
    import torch.distributed as dist

    gloo.join(rank, world, rendezvous)
    for size, steps in PHASES:
        group = dist.new_group(list(range(size)))
        if rank < size:
            _phase(rank, size, group, root, state, steps)
        dist.barrier()
    gloo.leave()


PHASES = ((2, 3), (3, 2), (2, 3))


def test_a_group_that_resizes_2_3_2_trains_each_sequence_once(tmp_path):
    root = str(tmp_path / "corpus")
    make_corpus(pafs.LocalFileSystem(), root, [BLOCK * 70 + 5, BLOCK * 60], block=BLOCK,
                tokenizer=GPT2)  # 130 sequences: 8 steps of 16, 2 left over
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"sequences_in_epoch": 0, "steps": []}))
    gloo.spawn(_ranks, 3, tmp_path, root, str(state))
    steps = json.loads(state.read_text())["steps"]
    assert [s["world"] for s in steps] == [2] * 3 + [3] * 2 + [2] * 3
    trained = [i for s in steps for i in s["ids"]]
    assert all(len(s["ids"]) == GLOBAL for s in steps)
    assert len(trained) == len(set(trained)) == 128  # each sequence once, none twice
    assert set(trained) <= set(range(130))
    # step by step, the sequences a group that never resized trains
    from training.data.reader import open_corpus

    order = open_corpus(root, BLOCK).order(SEED, EPOCH)
    assert [sorted(s["ids"]) for s in steps] == [
        sorted(order.ids(k * GLOBAL, (k + 1) * GLOBAL).tolist()) for k in range(8)]
