"""How many tokens an optimizer step takes, and how each worker gets there (pure; stdlib only).

The rule (docs/gpus/batch.md):
- **The global batch is fixed in the job document** (sequences per optimizer step, all
  workers): `--global-batch-size`, else near GPT-2's 524,288 tokens on GPUs and one
  micro-batch of 8 sequences per worker on CPU. It depends on the model's block and the group's
  worker counts only: never on `--gpu-type`, which schedules and changes nothing trained.
- **Each worker's share** of it (`shares`): equal when the group's size divides it, else
  multiples of a quantum that differ by one quantum (at most ~1/8 of a share for the defaults),
  so an elastic group of any size keeps the same step. The loss is weighted by each worker's
  share (`loss_weight`) so that the all-reduced gradient is the mean over all the step's tokens.
- **The micro-batch is chosen on the worker** (training.gpt2.microbatch) from the device's free memory
  and the precision: the largest that fits (`sequences_that_fit`) and divides its share; the
  accumulation is share / micro-batch. `submitter render` shows an estimate for the card
  `--gpu-type` names (else the smallest supported, 16 GiB). An explicit `--batch-size-per-worker`
  fixes the micro-batch instead (CPU jobs: 8).

Why so large: DDP all-reduces the whole gradient once per optimizer step, so the bytes sent per
training token fall as the step grows. gpt2-small's 124 M gradients in bf16 are 249 MB: over
8 × 8 × 256 = 16,384 tokens (the old default) that was 15 KB a token; over 524,288 it is 475 B.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

#: GPT-2's optimizer step (0.5 M tokens), the target of a GPU job's default.
TARGET_TOKENS_PER_STEP = 524_288
#: The range a default step must fall in (else render asks for --global-batch-size).
MIN_TOKENS_PER_STEP, MAX_TOKENS_PER_STEP = 262_144, 2_097_152
#: CPU jobs: sequences per worker per step (one micro-batch), as before.
CPU_MICRO_BATCH = 8
#: Unequal shares are made of at least this many quanta each: they differ by at most 1/8.
SPLIT_UNITS = 8
#: GPU memory (GiB) assumed when --gpu-type does not say: the smallest card supported (T4, V100).
ASSUMED_GPU_MEMORY_GIB = 16.0
#: Memory (GiB) by product name, for --gpu-type values that do not spell it (NVIDIA GPU feature
#: discovery labels, e.g. "NVIDIA-H100-80GB-HBM3" does, "NVIDIA-L4" does not). Longest first.
GPU_MEMORY_GIB = (("H200", 141.0), ("H100", 80.0), ("A100", 40.0), ("L40S", 48.0), ("L40", 48.0),
                  ("A10G", 24.0), ("L4", 24.0), ("T4", 16.0), ("V100", 16.0))
#: Bytes of training state per parameter: fp32 weights, gradients, AdamW m and v (16), plus the
#: 16-bit copy autocast keeps of the weights (2) when training in bf16/fp16.
STATE_BYTES_PER_PARAM = 18
FP32_STATE_BYTES_PER_PARAM = 16
#: A checkpoint's host copy per parameter: fp32 weights and AdamW's two moments.
HOST_STATE_BYTES_PER_PARAM = 12
#: CUDA context, cuBLAS/NCCL workspaces, allocator slack (GiB), and the share of the rest used.
WORKSPACE_GIB = 1.0
USABLE_SHARE = 0.8
#: Model shapes by preset (n_layer, n_embd, vocab; the tokenizer's for "tiny": GPT-2's assumed,
#: the larger). training.gpt2.model.PRESETS holds the same figures (tests hold them together).
MODEL_SHAPES = {"gpt2-small": (12, 768, 50257), "tiny": (2, 128, 50257)}
#: Default block size (tokens per sequence) by preset, as training.gpt2.model.PRESETS.
MODEL_BLOCK = {"gpt2-small": 256, "tiny": 128}
#: DDP on CUDA all-reduces gradients in bf16/fp16 (training.gpt2.parallel's compression hook).
GPU_GRAD_BYTES = 2


@lru_cache(maxsize=256)
def gpu_memory_gib(gpu_type: Optional[str]) -> float:
    """The memory of the card --gpu-type names ("...-80GB..." or a known product), else the
    assumed smallest card. (Cached: a job has one --gpu-type; the grid test asks for 166 k.)"""
    if not gpu_type:
        return ASSUMED_GPU_MEMORY_GIB
    spelled = re.search(r"(\d+)\s*Gi?B\b", gpu_type, re.IGNORECASE)
    if spelled and int(spelled[1]) >= 4:
        return float(spelled[1])
    upper = gpu_type.upper()
    for product, gib in GPU_MEMORY_GIB:
        if re.search(rf"(^|[^A-Z0-9]){product}([^A-Z0-9]|$)", upper):
            return gib
    return ASSUMED_GPU_MEMORY_GIB


def param_count(n_layer: int, n_embd: int, vocab: int, block: int) -> int:
    """GPT-2's parameters with tied embeddings (124,439,808 for gpt2-small at block 1024)."""
    return vocab * n_embd + block * n_embd + n_layer * (12 * n_embd ** 2 + 13 * n_embd) + 2 * n_embd


def host_state_bytes(model: str, block: int) -> int:
    """One host copy of the training state a checkpoint holds (weights and AdamW's moments in
    fp32): ~1.5 GB for gpt2-small."""
    n_layer, n_embd, vocab = MODEL_SHAPES[model]
    return param_count(n_layer, n_embd, vocab, block) * HOST_STATE_BYTES_PER_PARAM


def activation_bytes_per_token(n_layer: int, n_embd: int, vocab: int, precision: str = "bf16") -> int:
    """Bytes one token keeps for backward with a fused attention kernel: about 34 × n_embd per
    layer in a 16-bit step (Korthikanti et al. 2022, without the attention-score term flash/SDPA
    attention avoids), plus the logits in 16 bits and in fp32 for the loss (6 bytes a vocab
    entry: an upper bound; a chunked or compiled loss keeps less). In fp32 every activation
    takes 4 bytes: twice the layers' share, 8 bytes a vocab entry."""
    if precision == "fp32":
        return n_layer * 68 * n_embd + 8 * vocab
    return n_layer * 34 * n_embd + 6 * vocab


def sequences_that_fit(model: str, block: int, free_bytes: float, precision: str = "bf16",
                       vocab: Optional[int] = None) -> int:
    """Sequences one micro-batch may hold on a GPU with `free_bytes` free before training: the
    share of it we use, less a workspace and the training state, over one sequence's
    activations. At least 1 (the worker then learns at its first step whether it fits)."""
    n_layer, n_embd, default_vocab = MODEL_SHAPES[model]
    vocab = vocab or default_vocab
    per_param = FP32_STATE_BYTES_PER_PARAM if precision == "fp32" else STATE_BYTES_PER_PARAM
    state = param_count(n_layer, n_embd, vocab, block) * per_param
    usable = USABLE_SHARE * free_bytes - WORKSPACE_GIB * 2**30 - state
    return max(1, int(usable // (activation_bytes_per_token(n_layer, n_embd, vocab, precision)
                                 * block)))


def micro_batch_that_fits(model: str, block: int, memory_gib: float,
                          precision: str = "bf16") -> int:
    """Sequences per micro-batch for one GPU of `memory_gib`, as a power of two (render's
    estimate of what a worker on that card chooses)."""
    fits = sequences_that_fit(model, block, memory_gib * 2**30, precision)
    return 2 ** int(math.log2(fits))


def largest_divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of `n` that is <= `limit` (1 at least): a worker's micro-batch."""
    best = 1
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            for c in (d, n // d):
                if best < c <= limit:
                    best = c
    return best


def _pow2_floor(x: float) -> int:
    return 2 ** int(math.log2(x)) if x >= 1 else 1


def quantum(global_batch: int, workers: int, micro: Optional[int] = None) -> int:
    """The unit a group of `workers` splits `global_batch` in: one equal share each when the
    group divides it (in whole micro-batches, when `micro` is fixed), else the fixed micro-batch,
    else the largest power of two dividing it of which every worker gets >= SPLIT_UNITS."""
    if global_batch % (workers * (micro or 1)) == 0:
        return global_batch // workers
    if micro:
        return micro
    q = _pow2_floor(global_batch / (SPLIT_UNITS * workers))
    while global_batch % q:
        q //= 2
    return q


def shares(global_batch: int, workers: int, micro: Optional[int] = None) -> list[int]:
    """Sequences per step of each rank of a group of `workers`: whole quanta, balanced, the
    larger shares first; they sum to `global_batch`."""
    q = quantum(global_batch, workers, micro)
    units, extra = divmod(global_batch // q, workers)
    return [(units + (rank < extra)) * q for rank in range(workers)]


def loss_weight(share: int, micro: int, workers: int, global_batch: int) -> float:
    """What one micro-batch's mean loss is multiplied by so that the gradient DDP/FSDP average
    over `workers` is the mean over all `global_batch` sequences of the step: its sequences'
    part of the step, times the world size the average divides by (1/accumulation when the
    shares are equal)."""
    return micro * workers / global_batch


def lcm(values: range | list[int]) -> int:
    """The least common multiple of `values` (1 for none)."""
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


def group_sizes(min_workers: int, max_workers: int, step: int = 1) -> range:
    """The worker counts an elastic group may train with (pods x GPUs: steps of `step`)."""
    return range(min_workers, max_workers + 1, step)


def default_global_batch(block: int, min_workers: int, max_workers: int,
                         micro: Optional[int] = None, equal: bool = False,
                         step: int = 1) -> int:
    """A GPU job's global batch, near TARGET_TOKENS_PER_STEP. A fixed group gets one that it
    splits equally, in whole `micro`-batches when the micro-batch is fixed; an elastic one a
    power of two (times `micro`) that any size splits into near-equal shares, or, with `equal`
    (FSDP: every rank must run as many micro-batches), a multiple of every size's."""
    base = TARGET_TOKENS_PER_STEP / block
    m = micro or 1
    if min_workers == max_workers or equal:
        unit = lcm(group_sizes(min_workers, max_workers, step)) * m
        q = _pow2_floor(base / (SPLIT_UNITS * unit))
        return unit * q * max(1, round(base / (unit * q)))
    units = 2 ** max(0, round(math.log2(max(1.0, base / m))))
    while units < max_workers:
        units *= 2
    return units * m


def default_problem(block: int, global_batch: int, min_workers: int, max_workers: int,
                    micro: Optional[int], equal: bool, step: int) -> Optional[str]:
    """Why the default step is no good for this group (outside MIN..MAX_TOKENS_PER_STEP), with
    a --global-batch-size that works; None when it is good."""
    tokens = global_batch * block
    if MIN_TOKENS_PER_STEP <= tokens <= MAX_TOKENS_PER_STEP:
        return None
    m = micro or 1
    works = (lcm(group_sizes(min_workers, max_workers, step)) * m if equal
             else max_workers * m)
    group = (f"{max_workers} workers" if min_workers == max_workers
             else f"groups of {min_workers} to {max_workers} workers")
    if equal and min_workers < max_workers:
        return (f"--fsdp needs a global batch that every size of {group} splits equally, and "
                f"none is 0.25-2 M tokens at block {block}: narrow --replicas, leave out --fsdp, "
                f"or set --global-batch-size {works} (the smallest that works)")
    return (f"no default optimizer step of 0.25-2 M tokens suits {group} at block {block} "
            f"({tokens:,} tokens): set --global-batch-size {works} (or a multiple of it), or "
            "fewer workers")


@dataclass(frozen=True)
class BatchPlan:
    """One optimizer step of a group of `workers` (rank 0's micro-batch and accumulation)."""

    micro_batch: int          # sequences per worker per forward/backward
    accumulation: int         # micro-batches per worker per optimizer step
    global_batch: int         # sequences per optimizer step, all workers
    tokens_per_step: int      # global_batch × block

    def to_dict(self) -> dict[str, int]:
        return {"microBatchSize": self.micro_batch, "accumulationSteps": self.accumulation,
                "globalBatchSize": self.global_batch, "tokensPerStep": self.tokens_per_step}


@dataclass(frozen=True)
class Resolved:
    """What the settings fix, and what is left to the worker: `micro` None = chosen on the
    device (`fits`: render's estimate of the sequences that fit, for --gpu-type's card)."""

    micro: Optional[int]          # the fixed micro-batch (explicit, or CPU's), else None
    global_batch: Optional[int]   # None: CPU default, one micro-batch per worker
    fits: Optional[int] = None    # the estimate (GPU jobs without a fixed micro-batch)
    memory_gib: Optional[float] = None  # the card the estimate is for

    def plan(self, workers: int, block: int) -> BatchPlan:
        """The step of a group of `workers` as rank 0 makes it."""
        if self.global_batch is None:
            assert self.micro is not None
            return BatchPlan(self.micro, 1, self.micro * workers, self.micro * workers * block)
        share = shares(self.global_batch, workers, self.micro)[0]
        micro = self.micro or largest_divisor_at_most(share, self.fits or 1)
        return BatchPlan(micro, share // micro, self.global_batch, self.global_batch * block)


def resolve(*, gpu: bool, model: str, block: int, micro: Optional[int],
            global_batch: Optional[int], min_workers: int, max_workers: int,
            gpu_type: Optional[str] = None, precision: str = "auto", equal: bool = False,
            step: int = 1) -> Resolved:
    """The batch the settings make: explicit values win; CPU jobs default to CPU_MICRO_BATCH
    and one micro-batch a step; GPU jobs to the rule above, the micro-batch left to the worker
    (with an estimate for the card --gpu-type names, which changes nothing else)."""
    if not gpu:
        return Resolved(micro or CPU_MICRO_BATCH, global_batch)
    if global_batch is None:
        global_batch = default_global_batch(block, min_workers, max_workers, micro, equal, step)
    if micro:
        return Resolved(micro, global_batch)
    gib = gpu_memory_gib(gpu_type)
    return Resolved(None, global_batch, sequences_that_fit(model, block, gib * 2**30, precision),
                    gib)


def grad_bytes_per_token(params: int, grad_bytes: int, tokens_per_step: int) -> float:
    """Gradient bytes all-reduced per optimizer step (one all-reduce of every gradient) over the
    tokens that step trained on, all workers together."""
    return params * grad_bytes / tokens_per_step
