"""Fail fast on the wrong image: before any worker starts, a GPU job checks that this image has
CUDA and NCCL and that Ray sees enough GPUs for its workers.

Without it, a GPU job on a CPU image retries `init_process_group` `--max-failures` times
before the RayJob fails with a stack trace about NCCL. `gpu_problem` is pure (fed the facts),
`check_gpus_here` gathers them on the driver (the head pod) and raises `GpuImageError` with one
line naming the fix. The driver's torch is the image's torch: the workers run the same image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from submitter.contract.errors import SpecError

IMAGE_FIX = "use the -gpu image or --image with a CUDA build of torch"


class GpuImageError(SpecError):
    """The job wants GPUs this image or cluster cannot give (one line, with the fix)."""


@dataclass(frozen=True)
class GpuFacts:
    cuda_built: bool          # torch was built with CUDA (torch.version.cuda)
    nccl_available: bool      # torch.distributed.is_nccl_available()
    cluster_gpus: float       # GPUs in the Ray cluster (ray.cluster_resources())
    local_cuda: Optional[bool] = None  # torch.cuda.is_available() here (None: not asked)


def gpu_problem(use_gpu: bool, workers: int, facts: GpuFacts, autoscaling: bool = False) -> Optional[str]:
    """What stops a job with `workers` GPU workers from starting, or None.

    The driver runs on the head, which usually has no GPU: `local_cuda` is informative only;
    what decides is the image's torch build and the GPUs Ray reports. With an autoscaler
    (`autoscaling`), GPUs may appear later, so only the image is checked.
    """
    if not use_gpu:
        return None
    if not facts.cuda_built:
        return f"this image has no CUDA (torch is a CPU build): {IMAGE_FIX}"
    if not facts.nccl_available:
        return f"this image's torch has no NCCL, which multi-GPU training needs: {IMAGE_FIX}"
    if not autoscaling and facts.cluster_gpus < workers:
        return (f"the job needs {workers} GPU worker(s) but the Ray cluster has "
                f"{facts.cluster_gpus:g} GPU(s): check the nodes' nvidia.com/gpu resources, "
                "the GPU device plugin, and --gpu-per-pod x --replicas")
    return None


def gather_facts() -> GpuFacts:
    """The facts on this process (needs ray initialized)."""
    import ray
    import torch
    import torch.distributed as dist

    return GpuFacts(cuda_built=torch.version.cuda is not None,
                    nccl_available=dist.is_available() and dist.is_nccl_available(),
                    cluster_gpus=float(ray.cluster_resources().get("GPU", 0)),
                    local_cuda=torch.cuda.is_available())


#: How long the GPU count may take to reach the job's (worker nodes whose pods run but whose
#: raylets have not joined yet); the image checks fail at once.
GPU_WAIT_S = 60.0


def check_gpus_here(use_gpu: bool, workers: int, autoscaling: bool = False,
                    wait_s: float = GPU_WAIT_S) -> None:
    """Raise GpuImageError when the GPU job cannot start here (no-op for CPU jobs)."""
    import time

    if not use_gpu:
        return
    deadline = time.monotonic() + wait_s
    while True:
        facts = gather_facts()
        problem = gpu_problem(use_gpu, workers, facts, autoscaling)
        if problem is None:
            return
        if not (facts.cuda_built and facts.nccl_available) or time.monotonic() >= deadline:
            raise GpuImageError(problem)
        time.sleep(2.0)


def _probe() -> dict:
    """On a GPU worker node: what its CUDA can do (a Ray task with one GPU). bf16: native
    only (a T4 or V100 emulates it; those train in fp16)."""
    import torch

    from training.gpt2.precision import bf16_native

    ok = torch.cuda.is_available()
    return {"cuda": ok, "bf16": bool(ok and bf16_native()),
            "gpu": torch.cuda.get_device_name(0) if ok else None}


def probe_gpu_node(timeout_s: float = 120.0) -> Optional[dict]:
    """Run `_probe` on a node with a GPU (None when none answers within the timeout). A GPU
    the node's torch cannot use (driver too old for the image's CUDA) fails here, once,
    instead of in every worker of every retry."""
    import ray

    try:
        ref = ray.remote(num_gpus=1, num_cpus=0, max_retries=0)(_probe).remote()
        facts = ray.get(ref, timeout=timeout_s)
    except Exception:  # noqa: BLE001 - no answer: the workers decide, as before
        return None
    if not facts["cuda"]:
        raise GpuImageError("the GPU node's torch cannot use its GPU (torch.cuda.is_available() "
                            f"is False there): check the node's NVIDIA driver against the image's "
                            f"CUDA, or {IMAGE_FIX}")
    return facts
