"""TrainConfig: one training run = the job's settings (JobSpec) + what the driver derives.

The settings themselves (epochs, learning rate, data, ...) live in `submitter.contract.spec`
and nowhere else; they read as attributes here (`cfg.epochs` is `cfg.job.epochs`). What a run
adds is where it writes, under which name, and with how many workers of which kind. Stdlib
only: the driver, the Ray workers and the tests all import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from submitter.contract.spec import JobSpec


@dataclass(frozen=True)
class TrainConfig:
    job: JobSpec                 # the validated job settings (the pod's job document)
    storage_path: str            # where checkpoints and events.jsonl live (checked, normalized)
    run_name: str                # Ray Train run directory under storage_path (never random)
    num_workers: int             # Ray Train workers (one per GPU, or CPU processes)
    use_gpu: bool                # one GPU per worker
    cpus_per_worker: float = 1.0  # logical CPUs a worker reserves; the rest feed Ray Data

    def __getattr__(self, name: str) -> Any:
        """A job setting, e.g. `cfg.epochs`. (Only called for names the dataclass lacks.)"""
        if name.startswith("__") or name == "job":  # pickling probes these before `job` exists
            raise AttributeError(name)
        return getattr(self.job, name)

    @classmethod
    def from_spec(cls, spec: JobSpec, storage_path: str | None = None, **derived: Any) -> "TrainConfig":
        """The run of a job: its storage path (default: the spec's), run name and workers."""
        return cls(job=spec, storage_path=storage_path or spec.resolved_storage_path,
                   run_name=spec.run_name, num_workers=spec.num_train_workers,
                   use_gpu=spec.gpu_per_pod > 0, **derived)

    def with_job(self, **changes: Any) -> "TrainConfig":
        """The same run with some job settings changed (validated again)."""
        job = JobSpec.build({**self.job.to_dict(), **changes})
        return TrainConfig(job, self.storage_path, self.run_name, self.num_workers,
                           self.use_gpu, self.cpus_per_worker)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (what the workers receive, and what a checkpoint records)."""
        return {"job": self.job.to_dict(), "storage_path": self.storage_path,
                "run_name": self.run_name, "num_workers": self.num_workers,
                "use_gpu": self.use_gpu, "cpus_per_worker": self.cpus_per_worker}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainConfig":
        values = dict(data)
        return cls(job=JobSpec.build(values.pop("job")), **values)
