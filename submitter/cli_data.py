"""`submitter data ...`: prepared corpora. `data prepare` tokenizes a source once into token
shards plus a manifest on the runs' storage (`<storage>/<namespace>/corpora/<name>` on a cluster,
`<storage>/corpora/<name>` locally), as a RayJob of its own on CPU workers (the program
`python -m training.prepare`, given the job document a training job gets), or here with --local.
"""

from __future__ import annotations

import dataclasses
import sys
from functools import lru_cache
from typing import Any, Callable

import click

from submitter.cli_help import GroupedCommand
from submitter.cli_options import (HintGroup, add_params, apply_options, cluster_options, given_settings, job_option,
                                   refuse_local_dry_run, request_timeout, shown_default)
from submitter.contract.data_path import PREPARED, data_path
from submitter.contract.errors import UsageError
from submitter.contract.spec import DEFAULT_IMAGE, OFFLINE_DATASET, JobSpec, defaults

#: The job settings `data prepare` takes: the job's identity, its pods (CPU workers), their
#: scheduling, the storage, the data flags `submit` has, the RayJob's lifecycle, and Ray's
#: token auth (`--ray-auth disabled` for a KubeRay older than 1.5.1, whose CRD lacks it).
PREPARE_SETTINGS = (
    "name", "namespace", "image", "image_pull_policy", "env", "secret_env", "env_from_secret",
    "label", "annotation",
    "replicas", "cpu_per_pod", "memory_per_pod", "head_cpu", "head_memory",
    "node_selector", "toleration", "priority_class", "queue", "runtime_class",
    "service_account", "image_pull_secret",
    "storage_path", "storage_mount", "storage_size", "storage_class", "storage_access_mode",
    "existing_pvc", "allow_ephemeral_storage",
    "dataset", "dataset_config", "data", "data_format", "text_column", "tokenizer", "bpe_file",
    "val_percent",
    "ttl_seconds_after_finished", "backoff_limit", "active_deadline_seconds", "ray_auth")


def prepare_options(func: Callable[..., Any]) -> Callable[..., Any]:
    return add_params(func, _prepare_params())


@lru_cache(maxsize=1)
def _prepare_params() -> tuple[click.Parameter, ...]:
    def holder() -> None: ...

    default = defaults()
    # the source's flags say what prepare reads, not what submit trains on (submit's texts)
    helps = {"name": "the prepared corpus's name, and its job's (required)",
             "replicas": "CPU worker pods that tokenize (N, or MIN:MAX)",
             "namespace": "Kubernetes namespace [default: the kubeconfig context's, as kubectl]",
             "image": f"container image with this project installed [default: {DEFAULT_IMAGE}]",
             "dataset": f"the source when --data is not given: a Hugging Face dataset (its Parquet "
                        f"files read by ranged reads), or {OFFLINE_DATASET} (the offline corpus) "
                        f"[default: {default['dataset']}; with --local: {OFFLINE_DATASET}]",
             "dataset_config": f"the Hugging Face dataset's config [default: "
                               f"{default['dataset_config']}; with --local: none]",
             "data": "the source's files instead of --dataset: text, Parquet or JSONL files, a "
                     "directory of them, or an object-store URI (with --local: a path here, "
                     "relative ones too)",
             # training.data.prepare.HOLD_OUT_TOKENS (submitter never imports training)
             "val_percent": f"% of the documents held out for validation when the source has no "
                            f"validation split, at most ~100,000,000 tokens (llm.c's one shard) "
                            f"[default: {default['val_percent']}]"}
    func: Any = holder
    for f in reversed([f for f in dataclasses.fields(JobSpec) if f.name in PREPARE_SETTINGS]):
        given = helps.get(f.name)
        func = job_option(f, "" if given else shown_default(default[f.name]), given)(func)
    return tuple(func.__click_params__)


def prepare_flags(options: dict[str, Any]) -> dict[str, Any]:
    """The settings given on the command line (JobSpec checks and coerces them)."""
    flags = given_settings(options, PREPARE_SETTINGS)
    if not flags.get("name"):
        raise UsageError("data prepare needs the corpus's name: --name NAME (lower-case letters, "
                         "digits and '-'), e.g. --name fineweb-edu-10bt")
    data = flags.get("data")
    if data is not None and data_path(str(data), "").kind == PREPARED:
        raise UsageError(f"--data {data} names a prepared corpus; data prepare reads a source: "
                         "files or a directory of text, Parquet or JSONL by absolute path or "
                         "bucket URI (or --dataset for a Hub dataset)")
    return flags


@click.group(cls=HintGroup)
def data() -> None:
    """Prepared corpora: a source tokenized once onto the runs' storage.

    \b
    Examples:
      submitter data prepare --name wiki --local --data ./wiki.txt --bpe-file gpt2.tiktoken
      submitter data prepare --name fineweb-edu-10bt --dataset HuggingFaceFW/fineweb-edu \\
          --dataset-config sample-10BT --replicas 8 --cpu-per-pod 16 --watch
    """


@data.command(cls=GroupedCommand)
@prepare_options
@cluster_options
@click.option("--local", is_flag=True,
              help="run the prepare program (python -m training.prepare) here, on an embedded "
                   "Ray with this machine's CPUs (needs submitter-gpt2[train])")
@click.option("--force", is_flag=True,
              help="make every shard of the corpus again, whole or not (without it, a prepare "
                   "of an existing name remakes only what is missing or damaged)")
@apply_options
def prepare(local: bool, force: bool, dry_run: str, watch_after: bool, output: str, kube_context: str | None,
            kubeconfig: str | None, **options: Any) -> None:
    """Tokenize a source once into token shards (llm.c's format) plus a manifest, under the
    storage path's corpora/NAME, for `submit --data` to train on without tokenizing.

    The source: --dataset NAME [--dataset-config C] (a Hub dataset, read as Parquet by ranged
    reads, never downloaded whole), --data PATH|URI (text, Parquet or JSONL files or a bucket),
    or the offline corpus. Preparing the same source and tokenizer again checks each shard's
    header and size and makes again only what is missing or damaged (nothing, when the corpus
    is whole; --force: everything); an interrupted prepare continues shard by shard; another
    source under the same name is refused.

    \b
    Examples:
      submitter data prepare --name wiki --local --data /data/wiki.txt --bpe-file gpt2.tiktoken
      submitter data prepare --name fineweb-edu-10bt --dataset HuggingFaceFW/fineweb-edu \\
          --dataset-config sample-10BT --replicas 8 --cpu-per-pod 16 --watch
      submitter data prepare --name fineweb-edu-10bt --dataset HuggingFaceFW/fineweb-edu \\
          --dataset-config sample-10BT --dry-run=client -o yaml > prepare.yaml   # GitOps
      submitter watch fineweb-edu-10bt
    """
    refuse_local_dry_run("data prepare", local, dry_run)
    flags = prepare_flags(options)
    if local:
        from submitter.local import run_prepare_local

        sys.exit(run_prepare_local(flags, output=output, force=force))
    from submitter import api

    spec = JobSpec.build(**flags)
    sys.exit(api.prepare(spec, dry_run=dry_run, watch=watch_after, output=output,
                         context=kube_context, kubeconfig=kubeconfig,
                         request_timeout=request_timeout(), out=sys.stdout,
                         err=sys.stderr, force=force).exit_code)
