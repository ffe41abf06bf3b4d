"""Evaluation cannot hang (issue 37 item 4): every rank evaluates the same number of validation
batches, on the prepared-corpus path (`val_batches` deals equal shares) and on any path that
yields uneven shares (training.gpt2.evaluation's lock-step, as for Ray Data's shard). Three ranks
under FSDP2 over gloo, a tiny GPT-2, a validation split of 7 micro-batches (not divisible by 3)."""

from __future__ import annotations

import datetime
import json
import os

import pyarrow.fs as pafs
import pytest

from tests.support import gloo
from tests.support.corpus import make_corpus
from training.data import shards as sh
from training.data.reader import open_corpus, val_batch_count

VOCAB, EOT, BLOCK, MICRO, WORLD = 257, 256, 16, 2, 3
VAL_SEQUENCES = 7 * MICRO  # 7 micro-batches: 3 ranks get 3, 2, 2 when dealt round-robin


def test_every_rank_gets_the_same_number_of_validation_batches(tmp_path):
    make_corpus(pafs.LocalFileSystem(), str(tmp_path), [BLOCK * 8], val=BLOCK * VAL_SEQUENCES + 5,
                block=BLOCK)
    reader = open_corpus(str(tmp_path), BLOCK, check=True)
    assert reader.sequences(sh.VAL) == VAL_SEQUENCES
    counts = [len(list(reader.val_batches(r, WORLD, MICRO))) for r in range(WORLD)]
    assert counts == [2, 2, 2]
    firsts = [int(b["input_ids"][0, 0]) for r in range(WORLD) for b in reader.val_batches(r, WORLD, MICRO)]
    assert len(set(firsts)) == 6  # six distinct micro-batches, none twice
    assert [len(list(reader.val_batches(r, WORLD, MICRO, limit=1))) for r in range(WORLD)] == [1] * 3
    reader.close()
    assert val_batch_count(VAL_SEQUENCES, MICRO, WORLD) == 2
    assert val_batch_count(5, MICRO, WORLD) == 0  # fewer batches than ranks: none anywhere
    assert val_batch_count(100, MICRO, WORLD, limit=4) == 4


def _worker(rank: int, world: int, rendezvous: str, root: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from training.gpt2.evaluation import evaluate_loss
    from training.gpt2.model import build_model, gpt2_config
    from training.gpt2.parallel import shard_fsdp
    from training.gpt2.precision import choose_precision

    torch.set_num_threads(1)
    # a hang shows as a failure within a minute, not the default half hour
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = shard_fsdp(build_model(gpt2_config("tiny", VOCAB, EOT, BLOCK)),
                       choose_precision("fp32", "cpu", False))
    reader = open_corpus(root, BLOCK)

    def to_device(batch):
        return torch.as_tensor(batch["input_ids"])

    prepared = evaluate_loss(model, reader.val_batches(rank, world, MICRO), "cpu", to_device)
    generator = torch.Generator().manual_seed(rank)
    uneven = [{"input_ids": torch.randint(0, VOCAB, (MICRO, BLOCK), generator=generator).numpy()}
              for _ in range(3 if rank == 0 else 2)]  # a streaming shard one batch longer on rank 0
    streamed = evaluate_loss(model, uneven, "cpu", to_device)
    limited = evaluate_loss(model, uneven, "cpu", to_device, limit=1)
    reader.close()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"prepared": prepared, "streamed": streamed, "limited": limited,
                   "training": model.training}, f)
    gloo.leave()


@pytest.mark.slow  # three processes, each importing torch and transformers
def test_evaluation_under_fsdp_with_3_ranks_and_an_uneven_split_does_not_hang(tmp_path):
    corpus = tmp_path / "corpus"
    make_corpus(pafs.LocalFileSystem(), str(corpus), [BLOCK * 8], val=BLOCK * VAL_SEQUENCES + 5,
                block=BLOCK)
    gloo.spawn(_worker, WORLD, tmp_path, str(corpus), str(tmp_path))
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for case, count in (("prepared", 2), ("streamed", 2), ("limited", 1)):
        losses = {r[case][0] for r in results}
        assert [r[case][1] for r in results] == [count] * WORLD, case
        assert len(losses) == 1 and 0 < losses.pop() < 20, case  # one mean, all ranks
    assert all(r["training"] for r in results)  # back in training mode after the pass
