"""TrainConfig: every knob of one training run, in one dataclass (nanoGPT style).

The fields a user can set through `submitter` take their defaults from `submitter.spec`
(JobSpec); the defaults written here are the ones that exist only inside the entrypoint (block
size, warmup, logging cadence...). Stdlib only: the driver, the Ray workers
and the tests all import it cheaply.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Optional

from submitter.spec import defaults

#: JobSpec's defaults: the fields a user sets through `submitter` take them from there.
_JOB = defaults()


@dataclass(frozen=True)
class TrainConfig:
    # --- identity and storage -------------------------------------------------------------
    name: str = _JOB["name"]           # the job name (RayJob name, or the local run's name)
    run_name: str = _JOB["name"]       # Ray Train run directory under storage_path (never random)
    storage_path: str = _JOB["storage_mount"]  # where checkpoints and events.jsonl live
    # train even if storage_path is on a pod's own disk (in Kubernetes)
    allow_ephemeral_storage: bool = _JOB["allow_ephemeral_storage"]
    # --- workers ------------------------------------------------------------------------
    num_workers: int = _JOB["replicas"]  # Ray Train workers (one per GPU, or CPU processes)
    use_gpu: bool = False              # one GPU per worker, bf16 autocast
    cpus_per_worker: float = 1.0       # logical CPUs a worker reserves; the rest feed Ray Data
    fsdp: bool = _JOB["fsdp"]          # shard the model with FSDP instead of DDP
    # --- data ---------------------------------------------------------------------------
    dataset: str = _JOB["dataset"]     # HF dataset name, or "python-stdlib" (offline corpus)
    dataset_config: Optional[str] = _JOB["dataset_config"]  # HF dataset config
    data: Optional[str] = _JOB["data"]  # train on these files instead (text/parquet/jsonl)
    data_format: str = "auto"          # reader for --data: auto (by extension)|text|parquet|jsonl
    text_column: str = "text"          # column holding the text in parquet/jsonl/HF rows
    tokenizer: str = "auto"            # auto (bpe-file, else tiktoken gpt2, else byte) | gpt2 | byte
    bpe_file: Optional[str] = _JOB["bpe_file"]  # GPT-2 ranks file (tiktoken format): BPE offline
    block_size: Optional[int] = None   # tokens per training sequence (default: the preset's)
    val_percent: float = 5.0           # % of blocks held out (by content hash) when no val split
    val_steps: int = 20                # validation batches per worker per evaluation (0 = all)
    # --- model --------------------------------------------------------------------------
    model: str = _JOB["model"]         # preset: gpt2-small (124M) | tiny (CPU)
    # --- optimization -------------------------------------------------------------------
    epochs: int = _JOB["epochs"]       # passes over the training data
    max_steps_per_epoch: Optional[int] = _JOB["max_steps_per_epoch"]  # cap optimizer steps per epoch
    batch_size_per_worker: int = _JOB["batch_size_per_worker"]  # sequences per worker per step
    learning_rate: float = _JOB["learning_rate"]  # peak LR after warmup
    min_lr_ratio: float = 0.1          # cosine decays to learning_rate * min_lr_ratio
    warmup_steps: Optional[int] = None  # linear warmup (default: 5% of the total steps)
    weight_decay: float = 0.1          # AdamW decay on matrices (not on biases/LayerNorms)
    beta1: float = 0.9                 # AdamW betas (GPT-2/3 values)
    beta2: float = 0.95
    grad_clip: float = 1.0             # clip the global gradient norm (0 = off)
    seed: int = _JOB["seed"]           # seeds the model init and the data order
    # --- fault tolerance ----------------------------------------------------------------
    max_failures: int = _JOB["max_failures"]  # worker-group restarts Ray Train may make
    num_to_keep: int = _JOB["num_to_keep"]  # checkpoints kept (best by val_loss)
    checkpoint_every: int = 0          # also checkpoint every N steps mid-epoch (0 = epoch ends)
    # --- reporting ----------------------------------------------------------------------
    progress_every: int = 10           # emit a progress event every N optimizer steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
