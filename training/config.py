"""TrainConfig: every knob of one training run, in one dataclass (nanoGPT style).

The defaults of the fields a user can set through `submitter` come from `submitter.spec`
(JobSpec) via `training.args`; the defaults written here are the ones that exist only inside the
entrypoint (block size, warmup, logging cadence...). Stdlib only: the driver, the Ray workers
and the tests all import it cheaply.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class TrainConfig:
    # --- identity and storage -------------------------------------------------------------
    name: str = "gpt2"                 # the job name (RayJob name, or the local run's name)
    run_name: str = "gpt2"             # Ray Train run directory under storage_path (never random)
    storage_path: str = "/mnt/checkpoints"  # where checkpoints and events.jsonl live
    allow_ephemeral_storage: bool = False  # train even if storage_path is a pod's own disk
    # --- workers ------------------------------------------------------------------------
    num_workers: int = 2               # Ray Train workers (one per GPU, or CPU processes)
    use_gpu: bool = False              # one GPU per worker, bf16 autocast
    cpus_per_worker: float = 1.0       # logical CPUs a worker reserves; the rest feed Ray Data
    fsdp: bool = False                 # shard the model with FSDP instead of DDP
    # --- data ---------------------------------------------------------------------------
    dataset: str = "Salesforce/wikitext"  # HF dataset name, or "python-stdlib" (offline corpus)
    dataset_config: Optional[str] = "wikitext-103-raw-v1"  # HF dataset config
    data: Optional[str] = None         # train on these files instead (text/parquet/jsonl)
    data_format: str = "auto"          # reader for --data: auto (by extension)|text|parquet|jsonl
    text_column: str = "text"          # column holding the text in parquet/jsonl/HF rows
    tokenizer: str = "auto"            # auto (bpe-file, else tiktoken gpt2, else byte) | gpt2 | byte
    bpe_file: Optional[str] = None     # GPT-2 ranks file (tiktoken format) for offline GPT-2 BPE
    block_size: Optional[int] = None   # tokens per training sequence (default: the preset's)
    val_percent: float = 5.0           # % of blocks held out (by content hash) when no val split
    val_steps: int = 20                # validation batches per worker per evaluation (0 = all)
    # --- model --------------------------------------------------------------------------
    model: str = "gpt2-small"          # preset: gpt2-small (124M) | tiny (CPU)
    # --- optimization -------------------------------------------------------------------
    epochs: int = 2                    # passes over the training data
    max_steps_per_epoch: Optional[int] = None  # cap optimizer steps per epoch
    batch_size_per_worker: int = 8     # sequences per worker per step
    learning_rate: float = 6e-4        # peak LR after warmup
    min_lr_ratio: float = 0.1          # cosine decays to learning_rate * min_lr_ratio
    warmup_steps: Optional[int] = None  # linear warmup (default: 5% of the total steps)
    weight_decay: float = 0.1          # AdamW decay on matrices (not on biases/LayerNorms)
    beta1: float = 0.9                 # AdamW betas (GPT-2/3 values)
    beta2: float = 0.95
    grad_clip: float = 1.0             # clip the global gradient norm (0 = off)
    seed: int = 1337                   # seeds the model init and the data order
    # --- fault tolerance ----------------------------------------------------------------
    max_failures: int = 3              # worker-group restarts Ray Train may make
    num_to_keep: int = 2               # checkpoints kept (best by val_loss)
    checkpoint_every: int = 0          # also checkpoint every N steps mid-epoch (0 = epoch ends)
    # --- reporting ----------------------------------------------------------------------
    progress_every: int = 10           # emit a progress event every N optimizer steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
