"""What a checkpoint costs the training loop: the stall per checkpoint, sync vs async (not a test).

The loop (training/gpt2/loop.py `save`) gathers the full state into host memory (`get_state_dict`,
full_state_dict + cpu_offload; on CPU the tensors are cloned, `checkpoint_io.snapshot`), then
`state.pt` is written to a local directory (`save_state`) and uploaded to the run's storage.
Before issue #18 all of it ran in the training thread (SYNC); now the write and the upload run
in Ray Train's upload thread (ASYNC with the loop's checkpoint_upload_fn; the preemption
checkpoint aside). Ray's upload is a `pyarrow.fs.copy_files` of that directory; this benchmark
does the same, without Ray, so the figures are the checkpoint's own:

  sync    gather + write + upload in the training thread: the stall of a SYNC save;
  async   gather + snapshot: the stall of an ASYNC save (checkpoint_saved's `stall_s`);
  steps   optimizer-step time while a background write + upload runs, over step time without
          one (its thread and I/O compete with training: on a GPU worker the step is GPU time
          and the ratio stays near 1; on this 2-core CPU it is the worst case).

Storage is a local directory by default (a PVC would be NFS, slower: async gains more); pass
--storage s3://bucket/x with AWS_ENDPOINT_URL etc. for an object store. Run:

    python benchmarks/bench_checkpoint.py                 # gpt2-small state (~1.5 GB), ~2 min
    python benchmarks/bench_checkpoint.py --model tiny    # seconds
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2-small", choices=("gpt2-small", "tiny"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--storage", default=None, help="where checkpoints go (default: a temp dir)")
    p.add_argument("--steps", type=int, default=3, help="steps timed with and without an upload")
    args = p.parse_args()

    import pyarrow.fs as pafs
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from training.run.checkpoint_io import save_state, snapshot
    from training.gpt2.model import build_model, build_optimizer, gpt2_config

    torch.manual_seed(0)
    vocab = 50257 if args.model == "gpt2-small" else 257
    model = build_model(gpt2_config(args.model, vocab, vocab - 1, 64))
    optimizer = build_optimizer(model, 6e-4, 0.1, (0.9, 0.95))
    x = torch.randint(0, vocab, (1, 64))

    def train_step() -> float:
        t = time.perf_counter()
        model(input_ids=x, labels=x).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    train_step()  # AdamW's state exists from here on: the checkpoint is full-sized
    storage_tmp = None
    if args.storage is None:
        storage_tmp = tempfile.mkdtemp(prefix="bench-storage-")
        fs, base = pafs.LocalFileSystem(), storage_tmp
    else:
        fs, base = pafs.FileSystem.from_uri(args.storage)

    def gather() -> dict:
        """What the training thread does in an ASYNC save (the loop's stall)."""
        model_sd, optim_sd = get_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return snapshot({"model": model_sd, "optimizer": optim_sd}, "cpu")

    def upload(state: dict, name: str) -> None:
        """What Ray Train's upload thread does: write state.pt locally, copy it to storage."""
        local = tempfile.mkdtemp(prefix="checkpoint-")
        save_state(local, **state, scheduler={}, epoch=0, step=1, step_in_epoch=1,
                   epoch_done=False, config={}, model_config={})
        fs.create_dir(f"{base}/{name}", recursive=True)
        pafs.copy_files(local, f"{base}/{name}", destination_filesystem=fs)
        shutil.rmtree(local, ignore_errors=True)  # delete_local_checkpoint_after_upload

    stall_async, stall_sync, steps_alone, steps_during = [], [], [], []
    upload_s, size = 0.0, 0
    try:
        for i in range(args.repeats):
            t = time.perf_counter()
            upload(gather(), f"sync_{i}")
            stall_sync.append(time.perf_counter() - t)

            steps_alone += [train_step() for _ in range(args.steps)]
            t = time.perf_counter()
            state = gather()
            stall_async.append(time.perf_counter() - t)
            thread = threading.Thread(target=upload, args=(state, f"async_{i}"))
            t_up = time.perf_counter()
            thread.start()
            while thread.is_alive() and len(steps_during) < (i + 1) * args.steps:
                steps_during.append(train_step())
            thread.join()
            upload_s = time.perf_counter() - t_up
            del state
        size = sum(f.size for f in fs.get_file_info(pafs.FileSelector(f"{base}/sync_0")))
    finally:
        if storage_tmp:
            shutil.rmtree(storage_tmp, ignore_errors=True)

    med = statistics.median
    print(f"model {args.model}: checkpoint {size / 1e6:.0f} MB (weights + AdamW state), "
          f"{args.repeats} repeats, storage {args.storage or 'a local directory'}, "
          f"{os.cpu_count()} CPUs")
    print(f"stall per checkpoint, SYNC (gather + write + upload): {med(stall_sync):.2f} s")
    print(f"stall per checkpoint, ASYNC (gather into host memory; write + upload behind "
          f"training): {med(stall_async):.2f} s  -> sync/async "
          f"{med(stall_sync) / med(stall_async):.1f}x")
    if steps_during:
        print(f"step time during a background write + upload / alone: "
              f"{med(steps_during) / med(steps_alone):.2f} ({len(steps_during)} steps during "
              f"uploads of ~{upload_s:.2f} s)")
    else:
        print("step time during a background upload: the upload ended before a step did")
    return 0


if __name__ == "__main__":
    sys.exit(main())
