"""render(spec) -> Plan: JobSpec to Kubernetes objects, through the Jinja2 templates in `manifests/`.

Pure: no cluster, no network, no clock, no random names, so the same spec gives byte-identical
output and GitOps diffs stay clean. Templates produce data, never text: every value goes
through `|tojson` and the result is parsed with `yaml.safe_load` at once.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import yaml

from submitter.plan import Plan
from submitter.spec import RAY_VERSION, JobSpec
from submitter.storage import StorageDecision, check_access_mode, check_cluster_storage

#: One template per object kind, in apply order (the PVC and RBAC exist before the RayJob).
TEMPLATES = ("pvc", "serviceaccount", "role", "rolebinding", "configmap", "rayjob")
#: Ray Train's data/config/progress sinks find these in the container's environment.
ENV_PROGRESS_CONFIGMAP = "SUBMITTER_PROGRESS_CONFIGMAP"
ENV_NAMESPACE = "SUBMITTER_NAMESPACE"
CHECKPOINT_VOLUME = "checkpoints"


def names(spec: JobSpec) -> dict[str, str]:
    """Every object name derived from the job name (one place, so delete/watch agree)."""
    return {
        "rayjob": spec.name,
        "pvc": spec.existing_pvc or f"{spec.name}-checkpoints",
        "progress": f"{spec.name}-progress",  # ServiceAccount, Role, RoleBinding and ConfigMap
    }


def labels(spec: JobSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "submitter",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/managed-by": "submitter",
        "submitter.dev/job": spec.name,
    }


def storage_decision(spec: JobSpec) -> StorageDecision:
    """Apply the storage policy (raises StoragePolicyError with the fix)."""
    decision = check_cluster_storage(spec.resolved_storage_path, spec.storage_mount)
    if decision.kind == "shared-mount":
        check_access_mode(spec.storage_access_mode)
    return decision


def training_args(spec: JobSpec, storage_path: str) -> list[str]:
    """The `python -m training` command line; every value is shell-safe (checked by JobSpec)."""
    args = ["python", "-m", "training",
            "--name", spec.name,
            "--storage-path", storage_path,
            "--num-workers", str(spec.num_train_workers)]
    if spec.gpu_per_pod:
        args.append("--use-gpu")
    args += ["--model", spec.model,
             "--epochs", str(spec.epochs),
             "--batch-size-per-worker", str(spec.batch_size_per_worker),
             "--learning-rate", repr(spec.learning_rate),
             "--max-failures", str(spec.max_failures),
             "--num-to-keep", str(spec.num_to_keep),
             "--seed", str(spec.seed)]
    if spec.max_steps_per_epoch is not None:
        args += ["--max-steps-per-epoch", str(spec.max_steps_per_epoch)]
    if spec.data is not None:
        args += ["--data", spec.data]
    else:
        args += ["--dataset", spec.dataset]
        if spec.dataset_config is not None:
            args += ["--dataset-config", spec.dataset_config]
    if spec.bpe_file is not None:
        args += ["--bpe-file", spec.bpe_file]
    if spec.fsdp:
        args.append("--fsdp")
    if spec.allow_ephemeral_storage:
        args.append("--allow-ephemeral-storage")
    return args


def context(spec: JobSpec) -> dict[str, Any]:
    """The template variables: the spec plus everything derived from it."""
    decision = storage_decision(spec)
    n = names(spec)
    on_pvc = decision.kind == "shared-mount"
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"},
           {"name": ENV_PROGRESS_CONFIGMAP, "value": n["progress"]},
           {"name": ENV_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    env += [{"name": k, "value": v} for k, v in sorted(spec.env.items())]
    return {
        "spec": spec.to_dict(),
        "names": n,
        "labels": labels(spec),
        "ray_version": RAY_VERSION,
        "create_pvc": on_pvc and spec.existing_pvc is None,
        "mount_pvc": on_pvc,
        "checkpoint_volume": CHECKPOINT_VOLUME,
        "entrypoint": " ".join(training_args(spec, decision.path)),
        "env": env,
    }


def render(spec: JobSpec) -> Plan:
    """Render every object of the job, validated by the storage policy first."""
    ctx = context(spec)
    objects = []
    for name in TEMPLATES:
        text = _template(name).render(ctx)
        obj = yaml.load(text, Loader=_LOADER)
        if obj is not None:  # a template may render nothing (e.g. no PVC for s3://)
            objects.append(obj)
    return Plan(tuple(objects))


@lru_cache(maxsize=None)
def _template(name: str) -> Any:
    return _environment().get_template(f"{name}.yaml.j2")


_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")


def _yaml_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def tojson(value: Any) -> str:
    """JSON that is also safe YAML: all non-ASCII escaped, astral characters as YAML's
    `\\UXXXXXXXX` (JSON's surrogate pairs are invalid in YAML), keys sorted."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return _NOT_PRINTABLE_ASCII.sub(_yaml_escape, text)


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    from manifests import TEMPLATE_DIR

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        bytecode_cache=_bytecode_cache(jinja2),
    )
    env.filters["tojson"] = tojson
    return env


def _bytecode_cache(jinja2: Any) -> Any:
    """Compiling the templates is a third of `render`'s start-up; Jinja's own bytecode cache
    (keyed by template source checksum, so never stale) removes it after the first run."""
    import os
    from pathlib import Path

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    directory = Path(base) / "submitter" / "jinja2"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # read-only home: compile every time, still correct
    if not os.access(directory, os.W_OK):
        return None
    return jinja2.FileSystemBytecodeCache(str(directory))


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
