"""How long one optimizer step takes on the GPU --gpu-type names, and whether a preemption
checkpoint fits the grace period (pure; stdlib only: `submitter render` warns with it).

After SIGTERM the workers finish the step they are in, then save and upload the state before
the pod's preStop hook gives up (the grace period less the hook's margin). A step of 0.5 M
tokens takes ~20 s on one T4 and well under a second on eight H100s: a short grace period with
a slow card loses the checkpoint. The estimate is the scaling model's compute term
(submitter.contract.scaling): FLOPs per token x the step's tokens over the smallest group's
GPUs at ASSUMED_MFU of the card's dense 16-bit peak (submitter.contract.flops), plus the save:
one host copy of the state at SAVE_BYTES_PER_S.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from submitter.contract import batch
from submitter.contract.flops import flops_per_token, peak_for

if TYPE_CHECKING:
    from submitter.contract.spec import JobSpec

#: Model FLOPs utilisation assumed: the GPU smoke run (training.gpu_smoke) measured 18-27%
#: through Ray Train and 24-36% for one bare step, on an H200; the lower end, to warn early.
#: Also the estimate's last MFU source (submitter.contract.estimate: own runs, then the
#: measured table, then this).
ASSUMED_MFU = 0.25
#: Bytes a second for the preemption checkpoint: gather to host, write state.pt, upload it
#: (one stream to an object store or a network filesystem: ~100-500 MB/s; the low end).
SAVE_BYTES_PER_S = 100e6


@dataclass(frozen=True)
class StepEstimate:
    gpu: str                 # the peak table's name of the card
    workers: int             # the smallest group's workers (its steps are the longest)
    step_s: float            # one optimizer step
    save_s: float            # the preemption checkpoint (host copy, write, upload)


def estimate(spec: "JobSpec") -> Optional[StepEstimate]:
    """The step and save time of the job on --gpu-type's card, or None when no card is named
    or the card is not in the peak table (nothing to estimate from)."""
    peak = peak_for(spec.gpu_type) if spec.gpu_per_pod and spec.gpu_type else None
    plan = spec.batch_plan(spec.min_train_workers)
    if peak is None:
        return None
    n_layer, n_embd, vocab = batch.MODEL_SHAPES[spec.model]
    params = batch.param_count(n_layer, n_embd, vocab, spec.block)
    flops = flops_per_token(params, n_layer, n_embd, spec.block) * plan.tokens_per_step
    step = flops / (spec.min_train_workers * peak.tflops * 1e12 * ASSUMED_MFU)
    save = batch.host_state_bytes(spec.model, spec.block) / SAVE_BYTES_PER_S
    return StepEstimate(peak.label, spec.min_train_workers, step, save)


def grace_warning(spec: "JobSpec", margin_s: float) -> Optional[str]:
    """One line when a step plus the preemption checkpoint outlast what the grace period
    leaves the workers (--termination-grace-period less the preStop hook's `margin_s`), naming
    the flags that fix it; None when it fits or nothing can be estimated."""
    est = estimate(spec)
    if est is None:
        return None
    left = spec.termination_grace_period - margin_s
    need = est.step_s + est.save_s
    if need <= left:
        return None
    grace = math.ceil(need + margin_s)
    return (f"one optimizer step of {spec.batch_plan().tokens_per_step:,} tokens on "
            f"{est.workers} {est.gpu} GPU(s) takes ~{est.step_s:.0f} s (at "
            f"{ASSUMED_MFU:.0%} MFU) and the preemption checkpoint ~{est.save_s:.0f} s: more "
            f"than the {max(left, 0):g} s --termination-grace-period "
            f"{spec.termination_grace_period} leaves after the preStop margin; use "
            f"--termination-grace-period {grace} or more, or a smaller --global-batch-size")
