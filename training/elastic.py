"""Elastic worker groups (`--replicas MIN:MAX`): what changes when the group resizes, and what
must not.

Ray Train 2.60 runs an elastic group with `ScalingConfig(num_workers=(min, max))`: its
ElasticScalingPolicy starts a group as large as the reserved resources allow (at least min, at
most max); when a node is lost, the group fails and restarts smaller from the last checkpoint;
every `elastic_resize_monitor_interval_s` a healthy group is checked and restarted larger when
more workers fit. Each start builds new dataset shards for the new world size
(`streaming_split(world_size)` in Ray Train's DatasetsCallback), so the data is re-sharded.

What stays the same is the optimizer step: with `--global-batch-size`, each worker accumulates
`global / (world x per-worker batch)` micro-batches, recomputed on every (re)start from the
group's actual size (`get_context().get_world_size()`); the spec refuses a global batch that
some size in MIN..MAX cannot reach with whole micro-batches. Pure functions here; the driver
and the loop call them.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Union

from submitter.contract.spec import accumulation_steps

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


def group_batch(global_batch: Optional[int], world_size: int, per_worker: int,
                block: int) -> dict[str, int]:
    """How one optimizer step is made with this group: worker count, micro-batches each
    accumulates, sequences and tokens per step (the same for every size when a global batch
    is set)."""
    accum = accumulation_steps(global_batch, world_size, per_worker)
    sequences = world_size * per_worker * accum
    return {"world_size": world_size, "accumulation_steps": accum,
            "global_batch_size": sequences, "tokens_per_step": sequences * block}
