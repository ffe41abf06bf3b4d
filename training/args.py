"""`python -m training` flags -> TrainConfig.

The flags `submitter.render.training_args()` emits map onto JobSpec fields and take their
defaults and validation from `submitter.spec` (no default lives twice); the entrypoint-only
flags default to TrainConfig's. Bad input raises UsageError (one line, exit 2).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from typing import Any, Optional, Sequence

from submitter.errors import UsageError
from submitter.spec import MODELS, JobSpec
from training.config import TrainConfig

_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: JobSpec fields with a `python -m training` flag of the same name.
SPEC_FLAGS = ("name", "storage_path", "model", "epochs", "max_steps_per_epoch",
              "batch_size_per_worker", "learning_rate", "max_failures", "num_to_keep", "seed",
              "dataset", "dataset_config", "data", "bpe_file", "fsdp", "allow_ephemeral_storage")
#: TrainConfig fields with a flag that JobSpec does not have.
EXTRA_FLAGS = ("run_name", "cpus_per_worker", "block_size",
               "progress_every", "tokenizer", "data_format", "text_column", "val_percent",
               "val_steps", "checkpoint_every", "warmup_steps", "weight_decay", "grad_clip")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise UsageError(f"{message} (see python -m training --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m training",
                description="GPT-2 pre-training on Ray Train (the RayJob entrypoint).")
    g = p.add_argument_group("job (defaults: submitter.spec.JobSpec)")
    g.add_argument("--name", help="job name; the run name defaults to it")
    g.add_argument("--storage-path", help="Ray Train storage_path (shared mount or s3://...)")
    g.add_argument("--num-workers", "--replicas", dest="num_workers", type=int,
                   help="Ray Train workers (local: CPU workers)")
    g.add_argument("--use-gpu", action="store_true", default=None, help="one GPU per worker")
    g.add_argument("--model", choices=MODELS)
    g.add_argument("--epochs", type=int)
    g.add_argument("--max-steps-per-epoch", type=int)
    g.add_argument("--batch-size-per-worker", type=int)
    g.add_argument("--learning-rate", type=float)
    g.add_argument("--max-failures", type=int)
    g.add_argument("--num-to-keep", type=int)
    g.add_argument("--seed", type=int)
    g.add_argument("--data", help="text/parquet/jsonl files instead of --dataset")
    g.add_argument("--dataset", help="Hugging Face dataset name, or python-stdlib (offline)")
    g.add_argument("--dataset-config")
    g.add_argument("--bpe-file", help="GPT-2 ranks file (tiktoken format): GPT-2 BPE offline")
    g.add_argument("--fsdp", action="store_true", default=None, help="FSDP instead of DDP")
    g.add_argument("--allow-ephemeral-storage", action="store_true", default=None,
                   help="train even if --storage-path is on the pod's own disk")
    x = p.add_argument_group("entrypoint only (defaults: training.config.TrainConfig)")
    x.add_argument("--run-name", help="Ray Train run name [default: --name]")
    x.add_argument("--cpus-per-worker", type=float)
    x.add_argument("--block-size", type=int)
    x.add_argument("--progress-every", type=int, help="progress event every N steps")
    x.add_argument("--tokenizer", choices=("auto", "gpt2", "byte"))
    x.add_argument("--data-format", choices=("auto", "text", "parquet", "jsonl"))
    x.add_argument("--text-column")
    x.add_argument("--val-percent", type=float)
    x.add_argument("--val-steps", type=int)
    x.add_argument("--checkpoint-every", type=int, help="also checkpoint every N steps")
    x.add_argument("--warmup-steps", type=int)
    x.add_argument("--weight-decay", type=float)
    x.add_argument("--grad-clip", type=float)
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> TrainConfig:
    ns = vars(build_parser().parse_args(argv))
    spec_values = {k: ns[k] for k in SPEC_FLAGS if ns.get(k) is not None}
    if ns.get("num_workers") is not None:
        spec_values["replicas"] = ns["num_workers"]
    if ns.get("use_gpu"):
        spec_values["gpu_per_pod"] = 1
    spec = JobSpec.build(spec_values)
    extras = {k: ns[k] for k in EXTRA_FLAGS if ns.get(k) is not None}
    return config_from_spec(spec, spec.resolved_storage_path, **extras)


def config_from_spec(spec: JobSpec, storage_path: str, **extras: Any) -> TrainConfig:
    """The TrainConfig for a validated JobSpec plus entrypoint-only settings."""
    unknown = set(extras) - {f.name for f in fields(TrainConfig)}
    if unknown:
        raise UsageError(f"unknown training setting(s): {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {k: getattr(spec, k) for k in SPEC_FLAGS}
    values.update(storage_path=storage_path, run_name=spec.run_name,
                  num_workers=spec.num_train_workers, use_gpu=spec.gpu_per_pod > 0)
    values.update(extras)
    cfg = TrainConfig(**values)
    _check(cfg)
    return cfg


def _check(cfg: TrainConfig) -> None:
    if not _RUN_NAME.match(cfg.run_name):
        raise UsageError(f"--run-name {cfg.run_name!r}: use letters, digits, '.', '_' and '-'")
    positive = {"cpus_per_worker": cfg.cpus_per_worker, "progress_every": cfg.progress_every,
                "block_size": cfg.block_size or 1}
    for key, value in positive.items():
        if value <= 0:
            raise UsageError(f"--{key.replace('_', '-')} must be positive, got {value}")
    for key in ("val_steps", "checkpoint_every", "warmup_steps"):
        value = getattr(cfg, key)
        if value is not None and value < 0:
            raise UsageError(f"--{key.replace('_', '-')} must be >= 0, got {value}")
    if not 0 <= cfg.val_percent < 100:
        raise UsageError(f"--val-percent must be in [0, 100), got {cfg.val_percent}")
