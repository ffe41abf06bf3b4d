"""Does the data keep up? The input pipeline alone, in tokens/s per core (not a test).

What one GPU eats: gpt2-small at 40% MFU on an H100 (989 TFLOP/s bf16 dense) trains on
~0.4 × 989e12 / (6 × 124e6 + 6 × 12 × 256 × 768) ≈ 0.5 M tokens/s. What one core feeds, measured
here on WikiText-2 with GPT-2's BPE (tiktoken, from ../shared/data/gpt2.tiktoken):

  (a) in one thread, no Ray: read the lines, tokenize and cut into blocks
      (training.data.pipeline.chunk_batch, the function Ray Data runs), batch, copy to the device
      (pinned memory and non_blocking on CUDA), with a prefetching thread as the loop has;
      tokens per CPU-second of this process;
  (b) the same through Ray Data on a Ray with ONE CPU (`ray.init(num_cpus=1)`): read_text,
      map_batches(chunk_batch), iter_torch_batches(prefetch_batches=2, pin_memory on CUDA);
      tokens per wall-second from the first request to the last batch (Ray Data's start-up of
      ~1-2 s included: a lower bound on the steady rate). The consumer (this process) is not
      one of Ray's CPUs, as the training worker's own CPU is not Ray Data's.

It prints the CPUs per GPU that 0.5 M tokens/s needs at each rate and the constant the contract
uses (submitter.contract.spec.DATA_CPUS_PER_GPU). Run:

    python benchmarks/bench_data_pipeline.py            # ~1 minute
    python benchmarks/bench_data_pipeline.py --no-ray   # (a) only, a few seconds
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: ../shared/data beside the project, or /work/shared/data (worktrees live deeper).
DATA = next((p for p in (ROOT.parent / "shared" / "data", Path("/work/shared/data"))
             if (p / "gpt2.tiktoken").exists()), ROOT.parent / "shared" / "data")
#: One H100 at 40% MFU, gpt2-small (see the docstring).
GPU_TOKENS_PER_S = 0.5e6
BLOCK, MICRO = 256, 64


def device_copy(device, prefetch: int = 2):
    """A generator stage: numpy batches -> tensors on `device`, `prefetch` batches ahead in a
    thread (pinned memory and non_blocking where the device is CUDA)."""
    import torch

    pin = device.type == "cuda"

    def run(batches):
        q: queue.Queue = queue.Queue(maxsize=prefetch)

        def fill():
            for b in batches:
                t = torch.from_numpy(b)
                if pin:
                    t = t.pin_memory()
                q.put(t.to(device, non_blocking=pin))
            q.put(None)

        threading.Thread(target=fill, daemon=True).start()
        while (item := q.get()) is not None:
            yield item
    return run


def in_process(lines: list[str], tokenizer, device) -> tuple[int, float, float]:
    """(tokens, CPU seconds, wall seconds) of read -> tokenize -> batch -> device, one core."""
    import numpy as np

    from training.data.pipeline import ROWS_PER_BATCH, chunk_batch

    def micro_batches():
        pending = np.empty((0, BLOCK), dtype=np.int64)
        for i in range(0, len(lines), ROWS_PER_BATCH):
            blocks = chunk_batch({"text": np.array(lines[i:i + ROWS_PER_BATCH], dtype=object)},
                                 tokenizer, BLOCK)["input_ids"]
            pending = np.concatenate([pending, blocks])
            while len(pending) >= MICRO:
                yield pending[:MICRO]
                pending = pending[MICRO:]

    cpu0, wall0, tokens = time.process_time(), time.perf_counter(), 0
    for batch in device_copy(device)(micro_batches()):
        tokens += batch.numel()
    return tokens, time.process_time() - cpu0, time.perf_counter() - wall0


def through_ray(path: str, tokenizer, device) -> tuple[int, float]:
    """(tokens, wall seconds) through Ray Data on one CPU, after a warm-up batch."""
    import ray

    from training.data.pipeline import token_datasets, Corpus

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        corpus = Corpus(train=ray.data.read_text(path), val=ray.data.read_text(path),
                        description="bench", text_bytes=os.path.getsize(path))
        train, _ = token_datasets(corpus, tokenizer, BLOCK, 0.0)
        wall0, tokens = time.perf_counter(), 0  # from the first request: Ray Data's start-up counts
        for batch in train.iter_torch_batches(batch_size=MICRO, prefetch_batches=2,
                                              pin_memory=device.type == "cuda", device=device,
                                              drop_last=True):
            tokens += batch["input_ids"].numel()
        return tokens, time.perf_counter() - wall0
    finally:
        ray.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=8, help="copies of WikiText-2 valid (1.1 MB)")
    p.add_argument("--no-ray", action="store_true", help="skip (b)")
    args = p.parse_args()

    import torch

    from submitter.contract.spec import DATA_CPUS_PER_GPU
    from training.data.tokens import TokenizerSpec

    bpe = DATA / "gpt2.tiktoken"
    if not bpe.exists():
        print(f"needs {bpe} (see ../shared/data/README.md)")
        return 2
    tokenizer = TokenizerSpec("bpe-file", str(bpe))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    text = (DATA / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")
    lines = text.splitlines() * args.repeat
    print(f"corpus: WikiText-2 valid x {args.repeat} ({len(text) * args.repeat / 1e6:.1f} MB), "
          f"GPT-2 BPE, block {BLOCK}, micro-batch {MICRO}, device {device}")

    tokens, cpu, wall = in_process(lines, tokenizer, device)
    per_core = tokens / cpu
    print(f"(a) one thread, no Ray: {tokens:,} tokens, {cpu:.2f} CPU-s, {wall:.2f} s wall: "
          f"{per_core / 1e6:.2f} M tokens/s per core -> {GPU_TOKENS_PER_S / per_core:.2f} "
          f"cores per GPU at 0.5 M tokens/s")
    rates = [per_core]
    if not args.no_ray:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "corpus.txt")
            Path(path).write_text("\n".join(lines), encoding="utf-8")
            tokens, wall = through_ray(path, tokenizer, device)
        rate = tokens / wall
        rates.append(rate)
        print(f"(b) Ray Data on 1 CPU: {tokens:,} tokens in {wall:.2f} s: {rate / 1e6:.2f} M "
              f"tokens/s per core -> {GPU_TOKENS_PER_S / rate:.2f} cores per GPU")
    need = math.ceil(GPU_TOKENS_PER_S / min(rates))
    print(f"CPUs per GPU needed at 40% MFU (gpt2-small, H100): {need}; the contract gives Ray "
          f"Data {DATA_CPUS_PER_GPU} per GPU (DATA_CPUS_PER_GPU)"
          + ("" if DATA_CPUS_PER_GPU >= need else "  <-- TOO FEW"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
