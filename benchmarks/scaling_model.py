"""Scaling on paper (#18 item 6): the expected data-parallel efficiency of the default GPU job on
1, 8, 64 and 512 GPUs at 25 / 100 / 400 Gb/s per GPU, and where it breaks. No GPU, no torch.

The model itself (its formulas and every assumption, stated) lives in
submitter.contract.scaling, where `submitter estimate` uses it; this script prints its table.

    python benchmarks/scaling_model.py                  # the defaults (gpt2-small, H100 at 40%)
    python benchmarks/scaling_model.py --mfu 0.25 --block 1024 --latency-us 30
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from submitter.contract.scaling import (  # noqa: E402,F401  (stdlib only; re-exported)
    ADAMW_BYTES_PER_PARAM, BANDWIDTHS_GBPS, DDP_BUCKET_MB, GPUS, Settings, Step, breaks,
    bucket_sizes, efficiency, exposed_comm_s, format_table, micro_step_s, ring_allreduce_s, step,
    table)


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Settings):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                       help=f"[default: {f.default}]")
    return Settings(**vars(p.parse_args(argv)))


def report(s: Settings) -> str:
    head = (f"gpt2 ({s.params / 1e6:.1f} M parameters, block {s.block}), "
            f"{s.per_token / 1e6:.0f} MFLOP/token, global batch {s.global_batch_tokens:,} tokens, "
            f"micro-batch <= {s.micro_tokens:,} ({s.gpu_type}), {s.grad_bytes / 1e6:.0f} MB of bf16 "
            f"gradients per step ({s.tied_bytes / 1e6:.0f} MB of them the tied embedding's), "
            f"DDP buckets {s.bucket_cap_mb:g} MiB; {s.peak_tflops:g} TFLOP/s at MFU {s.mfu:.0%}, "
            f"ring latency {s.latency_us:g} us")
    notes = breaks(s)
    return "\n".join([head, "", format_table(table(s)), "", "Where it breaks:"]
                     + [f"- {n}" for n in notes or ["nowhere in this range"]])


if __name__ == "__main__":
    print(report(parse_args()))
