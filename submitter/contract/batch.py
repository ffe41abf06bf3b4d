"""How many tokens an optimizer step takes, and how it gets there (pure; stdlib only).

The rule (docs/gpus/batch.md):
- **CPU jobs** keep the small defaults: 8 sequences per worker, one micro-batch per step.
- **GPU jobs** aim at GPT-2's optimizer step, 524,288 tokens over all workers, reached by
  gradient accumulation from the largest micro-batch that fits one GPU (`micro_batch_that_fits`):
  the GPU's memory, less the training state (fp32 weights, gradients, AdamW's two moments, a
  bf16 copy: 18 bytes a parameter), a workspace and a safety share, divided by the activations
  one token keeps for backward (`activation_bytes_per_token`), rounded down to a power of two
  sequences. The GPU's memory comes from `--gpu-type` when it names a known card (or says e.g.
  "80GB"), else the smallest card the project supports (16 GiB, T4/V100) is assumed: a micro-batch
  that fits every card, which costs little, since the step's size is reached by accumulation.
- An explicit `--batch-size-per-worker` or `--global-batch-size` wins over the rule.

Why so large: DDP all-reduces the whole gradient once per optimizer step, so the bytes sent per
training token fall as the step grows. gpt2-small's 124 M gradients in bf16 are 249 MB: over
8 × 8 × 256 = 16,384 tokens (the old default) that was 15 KB a token; over 524,288 it is 475 B.

Everything here is a function of the job's settings alone, so `submitter render` shows the same
figures the pod uses (the job document's `resolved` block), and a retry resumes with the same
optimizer step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

#: GPT-2's optimizer step (0.5 M tokens), the target of a GPU job's default.
TARGET_TOKENS_PER_STEP = 524_288
#: CPU jobs: sequences per worker per step (one micro-batch), as before.
CPU_MICRO_BATCH = 8
#: GPU memory (GiB) assumed when --gpu-type does not say: the smallest card supported (T4, V100).
ASSUMED_GPU_MEMORY_GIB = 16.0
#: Memory (GiB) by product name, for --gpu-type values that do not spell it (NVIDIA GPU feature
#: discovery labels, e.g. "NVIDIA-H100-80GB-HBM3" does, "NVIDIA-L4" does not). Longest first.
GPU_MEMORY_GIB = (("H200", 141.0), ("H100", 80.0), ("A100", 40.0), ("L40S", 48.0), ("L40", 48.0),
                  ("A10G", 24.0), ("L4", 24.0), ("T4", 16.0), ("V100", 16.0))
#: Bytes of training state per parameter: fp32 weights, gradients, AdamW m and v, a bf16 copy.
STATE_BYTES_PER_PARAM = 18
#: CUDA context, cuBLAS/NCCL workspaces, allocator slack (GiB), and the share of the rest used.
WORKSPACE_GIB = 1.0
USABLE_SHARE = 0.8
#: Model shapes by preset (n_layer, n_embd, vocab; the tokenizer's for "tiny": GPT-2's assumed,
#: the larger). training.model.PRESETS holds the same figures (tests hold them together).
MODEL_SHAPES = {"gpt2-small": (12, 768, 50257), "tiny": (2, 128, 50257)}
#: Default block size (tokens per sequence) by preset, as training.model.PRESETS.
MODEL_BLOCK = {"gpt2-small": 256, "tiny": 128}
#: DDP on CUDA all-reduces gradients in bf16/fp16 (training.parallel's compression hook).
GPU_GRAD_BYTES = 2


def gpu_memory_gib(gpu_type: Optional[str]) -> float:
    """The memory of the card --gpu-type names ("...-80GB..." or a known product), else the
    assumed smallest card."""
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


def activation_bytes_per_token(n_layer: int, n_embd: int, vocab: int) -> int:
    """Bytes one token keeps for backward in a bf16 step with a fused attention kernel: about
    34 × n_embd per layer (Korthikanti et al. 2022, without the attention-score term flash/SDPA
    attention avoids), plus the logits in bf16 and in fp32 for the loss (6 bytes a vocab entry:
    an upper bound; a chunked or compiled loss keeps less)."""
    return n_layer * 34 * n_embd + 6 * vocab


def micro_batch_that_fits(model: str, block: int, memory_gib: float) -> int:
    """Sequences per micro-batch for one GPU of `memory_gib`: a power of two, at least 1."""
    n_layer, n_embd, vocab = MODEL_SHAPES[model]
    state = param_count(n_layer, n_embd, vocab, block) * STATE_BYTES_PER_PARAM
    usable = USABLE_SHARE * memory_gib * 2**30 - WORKSPACE_GIB * 2**30 - state
    sequences = usable / (activation_bytes_per_token(n_layer, n_embd, vocab) * block)
    return 2 ** int(math.log2(sequences)) if sequences >= 1 else 1


@dataclass(frozen=True)
class BatchPlan:
    """One optimizer step of a group of `workers`."""

    micro_batch: int          # sequences per worker per forward/backward
    accumulation: int         # micro-batches per worker per optimizer step
    global_batch: int         # sequences per optimizer step, all workers
    tokens_per_step: int      # global_batch × block

    def to_dict(self) -> dict[str, int]:
        return {"microBatchSize": self.micro_batch, "accumulationSteps": self.accumulation,
                "globalBatchSize": self.global_batch, "tokensPerStep": self.tokens_per_step}


def _lcm(values: range | list[int]) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


def default_global_batch(block: int, micro: int, min_workers: int, max_workers: int) -> int:
    """A GPU job's global batch: the multiple of every group's micro-batch round (workers ×
    micro, for each group size an elastic job may run with) nearest TARGET_TOKENS_PER_STEP."""
    unit = _lcm([n * micro for n in range(min_workers, max_workers + 1)])
    return max(1, round(TARGET_TOKENS_PER_STEP / block / unit)) * unit


def fitting_micro_batch(fits: int, global_batch: int, min_workers: int, max_workers: int) -> int:
    """The largest micro-batch <= `fits` that every group size divides `global_batch` into
    whole micro-batches with (1 when none does: the spec's check then says why)."""
    for m in range(min(fits, global_batch), 0, -1):
        if all(global_batch % (n * m) == 0 for n in range(min_workers, max_workers + 1)):
            return m
    return 1


def resolve(*, gpu: bool, model: str, block: int, micro: Optional[int],
            global_batch: Optional[int], min_workers: int, max_workers: int,
            gpu_type: Optional[str] = None) -> tuple[int, Optional[int]]:
    """(micro-batch, global batch or None) for the settings: explicit values win; CPU jobs
    default to CPU_MICRO_BATCH and one micro-batch a step (None); GPU jobs to the rule above."""
    if not gpu:
        return (micro or CPU_MICRO_BATCH), global_batch
    fits = micro or micro_batch_that_fits(model, block, gpu_memory_gib(gpu_type))
    if global_batch is None:
        return fits, default_global_batch(block, fits, min_workers, max_workers)
    if micro is None:
        return fitting_micro_batch(fits, global_batch, min_workers, max_workers), global_batch
    return micro, global_batch


def plan_for(micro: int, global_batch: Optional[int], workers: int, block: int) -> BatchPlan:
    """The step of a group of `workers` (global_batch None: one micro-batch per worker)."""
    sequences = global_batch if global_batch is not None else micro * workers
    accumulation = max(1, sequences // (micro * workers))
    return BatchPlan(micro, accumulation, sequences, sequences * block)


def grad_bytes_per_token(params: int, grad_bytes: int, tokens_per_step: int) -> float:
    """Gradient bytes all-reduced per optimizer step (one all-reduce of every gradient) over the
    tokens that step trained on, all workers together."""
    return params * grad_bytes / tokens_per_step
