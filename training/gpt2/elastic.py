"""Elastic worker groups (`--replicas MIN:MAX`): what changes when the group resizes, and what
must not.

Ray Train 2.60 runs an elastic group with `ScalingConfig(num_workers=(min, max))`: its
ElasticScalingPolicy starts a group as large as the reserved resources allow (at least min, at
most max); when a node is lost, the group fails and restarts smaller from the last checkpoint;
every `elastic_resize_monitor_interval_s` a healthy group is checked and restarted larger when
more workers fit. Each start builds new dataset shards for the new world size
(`streaming_split(world_size)` in Ray Train's DatasetsCallback), so the data is re-sharded.

What stays the same is the optimizer step and the learning rate: the job document fixes the
global batch (submitter.contract.batch), and every (re)start recomputes each worker's share of it
for the group's actual size (`get_context().get_world_size()`), its micro-batch (from its GPU's
free memory: training.gpt2.microbatch) and its accumulation. A size that does not divide the global
batch gets near-equal shares and unequal accumulation, each micro-batch's loss weighted so that
the gradient stays the mean over the step's tokens. Pure functions here; the driver and the loop
call them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Union

if TYPE_CHECKING:
    from training.gpt2.microbatch import WorkerBatch

#: Seconds between Ray Train's checks for room to grow a healthy group (Ray's default, 60 s;
#: each growth restarts the group from its last checkpoint, so not much more often).
RESIZE_INTERVAL_S = 60.0
#: Environment variable overriding RESIZE_INTERVAL_S (e.g. a test that cannot wait a minute).
RESIZE_INTERVAL_ENV = "SUBMITTER_ELASTIC_RESIZE_INTERVAL_S"


def num_workers(min_workers: int, max_workers: int) -> Union[int, tuple[int, int]]:
    """ScalingConfig's num_workers: an int for a fixed group, (min, max) for an elastic one."""
    return max_workers if min_workers == max_workers else (min_workers, max_workers)


def scaling_options(min_workers: int, max_workers: int,
                    environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """ScalingConfig keyword arguments for the group's size (and its resize cadence)."""
    out: dict[str, Any] = {"num_workers": num_workers(min_workers, max_workers)}
    if min_workers < max_workers:
        out["elastic_resize_monitor_interval_s"] = float(
            environ.get(RESIZE_INTERVAL_ENV) or RESIZE_INTERVAL_S)
    return out


def cpus_per_worker(elastic: bool, cpus_per_train_worker: int, default: float) -> float:
    """CPUs a Ray Train worker reserves. An elastic group counts how many workers the nodes
    can hold (each node's CPUs // this), so a worker reserves its pod's share
    (JobSpec.cpus_per_train_worker): a pod then holds exactly its workers, and the CPU left
    over stays Ray Data's. A fixed group keeps the default."""
    return float(cpus_per_train_worker) if elastic else default


def group_batch(mine: "WorkerBatch", world_size: int, block: int) -> dict[str, int]:
    """How this group makes one optimizer step (the worker-group events' fields): its size,
    rank 0's micro-batch and accumulation, and the step's sequences and tokens (the same for
    every size when the global batch is fixed)."""
    return {"world_size": world_size, "accumulation_steps": mine.accumulation,
            "micro_batch_size": mine.micro, "global_batch_size": mine.global_batch,
            "tokens_per_step": mine.global_batch * block}
