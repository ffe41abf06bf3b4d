"""JobSpec: the single source of defaults and validation for a training job.

CLI flags (`submitter.cli`), the job file (`-f job.yaml`), the Helm chart's `values.yaml` /
`values.schema.json` and the template variables all derive from the fields below, or are
checked against them by a test. Defaults live here and nowhere else.

Stdlib only (a frozen dataclass, not pydantic): `submitter render` must start fast.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from submitter.errors import SpecError

#: The Ray version the image and `rayClusterSpec.rayVersion` are built for.
RAY_VERSION = "2.60.0"
#: The image built from this repository's Dockerfile (`docker build -t submitter-gpt2:0.1.0 .`).
DEFAULT_IMAGE = "submitter-gpt2:0.1.0"
#: The offline corpus local runs default to: text every Python installation has.
OFFLINE_DATASET = "python-stdlib"
MODELS = ("gpt2-small", "tiny")
ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany", "ReadWriteOncePod")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")

# KubeRay appends a suffix to the RayJob name for the RayCluster and its services, and
# validates RayJob names to at most 47 characters; services also need a DNS-1035 label.
MAX_NAME_LENGTH = 47
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
# Values that end up in the RayJob's shell `entrypoint` must need no quoting at all (the
# characters `shlex.quote` leaves alone). Then the Python renderer and the Helm chart build the
# same string, and no value can inject a shell word.
_SHELL_SAFE = re.compile(r"^[\w@%+=:,./-]+$", re.ASCII)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMAGE = re.compile(r"^[a-z0-9]+([._/:@-][A-Za-z0-9_.-]+)*$")


def _f(default: Any = dataclasses.MISSING, *, help: str, short: str | None = None,
       metavar: str | None = None, entrypoint: bool = False) -> Any:
    """A JobSpec field with the metadata the CLI, the job file and the Helm chart derive from.

    entrypoint: the value is passed to `python -m training` in the RayJob's shell entrypoint
    and must therefore be shell-safe.
    """
    meta = {"help": help, "short": short, "metavar": metavar, "entrypoint": entrypoint}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class JobSpec:
    """Everything that defines one training job. Construct it with `JobSpec.build(...)`."""

    # --- identity -------------------------------------------------------------------------
    name: str = _f("", help="job name (DNS-1035, <=47 chars); the RayJob, the Ray Train run "
                   "name and the PVC are derived from it", entrypoint=True)
    namespace: str = _f("default", help="Kubernetes namespace", short="-n")

    # --- cluster shape --------------------------------------------------------------------
    replicas: int = _f(2, help="worker pods (with --local: CPU workers)")
    gpu_per_pod: int = _f(0, help="GPUs per worker pod (nvidia.com/gpu); 0 = CPU training")
    cpu_per_pod: str = _f("4", help="CPU request and limit per worker pod")
    memory_per_pod: str = _f("16Gi", help="memory request and limit per worker pod")
    head_cpu: str = _f("2", help="CPU request and limit of the Ray head pod")
    head_memory: str = _f("8Gi", help="memory request and limit of the Ray head pod")
    image: str = _f(DEFAULT_IMAGE, help="container image with this project installed "
                    "(see the Dockerfile)")
    image_pull_policy: str = _f("IfNotPresent", help="Always | IfNotPresent | Never")
    env: dict = _f({}, help="extra environment variable for the Ray containers, KEY=VALUE "
                   "(repeatable)", metavar="KEY=VALUE")

    # --- storage: checkpoints must outlive the job ------------------------------------------
    storage_path: Optional[str] = _f(None, help="Ray Train storage_path: a path under "
                                     "--storage-mount (default: the mount itself) or an object "
                                     "store URI (s3://, gs://, abfss://...)", entrypoint=True)
    storage_mount: str = _f("/mnt/checkpoints", help="where the ReadWriteMany PVC is mounted in "
                            "every Ray pod", entrypoint=True)
    storage_size: str = _f("100Gi", help="size of the PVC the plan creates")
    storage_class: Optional[str] = _f(None, help="StorageClass of the PVC (must support "
                                      "ReadWriteMany, e.g. NFS/EFS/Filestore); default: the "
                                      "cluster's default class")
    storage_access_mode: str = _f("ReadWriteMany", help="access mode of the PVC; only "
                                  "ReadWriteMany is accepted")
    existing_pvc: Optional[str] = _f(None, help="mount this existing ReadWriteMany PVC instead "
                                     "of creating one")

    # --- training (passed to `python -m training`) ----------------------------------------
    model: str = _f("gpt2-small", help="model preset: gpt2-small (124M) | tiny (CPU)",
                    entrypoint=True)
    epochs: int = _f(2, help="training epochs", entrypoint=True)
    max_steps_per_epoch: Optional[int] = _f(None, help="cap the optimizer steps per epoch "
                                            "(default: the whole epoch)", entrypoint=True)
    batch_size_per_worker: int = _f(8, help="sequences per worker per step", entrypoint=True)
    learning_rate: float = _f(6e-4, help="peak learning rate (warmup + cosine decay)",
                              entrypoint=True)
    dataset: str = _f("Salesforce/wikitext", help="Hugging Face dataset name, or "
                      f"{OFFLINE_DATASET} (offline corpus)", entrypoint=True)
    dataset_config: Optional[str] = _f("wikitext-103-raw-v1", help="Hugging Face dataset "
                                       "config", entrypoint=True)
    data: Optional[str] = _f(None, help="train on these files instead of --dataset (text, "
                             "parquet or jsonl; local path or object-store URI)",
                             entrypoint=True)
    bpe_file: Optional[str] = _f(None, help="GPT-2 BPE ranks file (tiktoken format) to build "
                                 "the GPT-2 encoding offline", entrypoint=True)
    max_failures: int = _f(3, help="worker-group restarts Ray Train may make (FailureConfig)",
                           entrypoint=True)
    num_to_keep: int = _f(2, help="checkpoints to keep (best by val_loss)", entrypoint=True)
    seed: int = _f(1337, help="random seed", entrypoint=True)
    fsdp: bool = _f(False, help="shard the model with FSDP instead of DDP (GPUs only: needs "
                    "--gpu-per-pod)", entrypoint=True)
    allow_ephemeral_storage: bool = _f(False, help="let the entrypoint train although the "
                                       "storage path is not on a network filesystem inside the "
                                       "pod (e.g. a hostPath test volume): checkpoints may die "
                                       "with the node", entrypoint=True)

    # --- lifecycle ------------------------------------------------------------------------
    ttl_seconds_after_finished: int = _f(600, help="seconds the Ray cluster stays after the "
                                         "job finishes (for logs), then KubeRay deletes it")
    backoff_limit: int = _f(1, help="RayJob retries after a failed attempt (each resumes "
                            "from the last checkpoint)")
    active_deadline_seconds: Optional[int] = _f(None, help="fail the RayJob after this many "
                                                "seconds")

    # --------------------------------------------------------------------------------------
    @classmethod
    def build(cls, values: Mapping[str, Any] | None = None, **overrides: Any) -> "JobSpec":
        """Validate a mapping (job file) plus overrides (flags; None = not given) into a spec.

        Keys may be snake_case or kebab-case. Unknown keys and wrong types raise `SpecError`.
        """
        merged = normalize_keys(values or {})
        for key, value in overrides.items():
            if value is not None:
                merged[_field_name(key)] = value
        return cls(**{k: _coerce(k, v) for k, v in merged.items()})

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_field(f.name, getattr(self, f.name))
        if self.fsdp and not self.gpu_per_pod:
            raise SpecError(FSDP_NEEDS_GPUS)

    # --- derived values (pure, used by render and by the chart parity test) ----------------
    @property
    def run_name(self) -> str:
        """Ray Train run name: the job name, never random, so retries resume the same run."""
        return self.name

    @property
    def resolved_storage_path(self) -> str:
        return self.storage_path if self.storage_path is not None else self.storage_mount

    @property
    def num_train_workers(self) -> int:
        """Ray Train workers: one per GPU, or one per pod on CPU."""
        return self.replicas * self.gpu_per_pod if self.gpu_per_pod else self.replicas

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data (job-file form, snake_case)."""
        return {f.name: _copy(getattr(self, f.name)) for f in dataclasses.fields(self)}


#: What `submit --local` uses for the settings a user leaves alone: a small CPU job on an offline
#: corpus that every machine has, finishing in a few minutes on 2 cores. Job file and flags win.
#: (The local storage path defaults to `$PWD/runs`, computed at run time.)
LOCAL_DEFAULTS: dict[str, Any] = {
    "name": "gpt2-local",
    "model": "tiny",
    "dataset": OFFLINE_DATASET,
    "dataset_config": None,
    "epochs": 2,
    "max_steps_per_epoch": 120,
    "batch_size_per_worker": 8,
    "learning_rate": 2e-3,
    "max_failures": 2,
}


#: Ray Train's FSDP wraps only GPU workers (prepare_model raises on CPU, inside the pod).
FSDP_NEEDS_GPUS = ("--fsdp shards the model across GPUs: add --gpu-per-pod N, or leave out "
                   "--fsdp to train on CPUs with DDP")


def fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(JobSpec)


def defaults() -> dict[str, Any]:
    """Every field's default: the one place other layers (CLI help, chart) read them from."""
    out = {}
    for f in dataclasses.fields(JobSpec):
        out[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return out


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def normalize_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """A job file's mapping with snake_case field names (kebab-case accepted); unknown keys
    raise SpecError with a suggestion."""
    return {_field_name(key): value for key, value in dict(values).items()}


# --- validation ---------------------------------------------------------------------------

def _field_name(key: str) -> str:
    name = str(key).replace("-", "_")
    valid = {f.name for f in dataclasses.fields(JobSpec)}
    if name not in valid:
        import difflib  # only on this error path: keeps render's start-up lean

        close = difflib.get_close_matches(name, sorted(valid), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(valid))}"
        raise SpecError(f"unknown job setting {key!r}{hint}")
    return name


_TYPES = {f.name: f.type for f in dataclasses.fields(JobSpec)}


def _coerce(name: str, value: Any) -> Any:
    """Turn job-file / flag values into the field's type, or raise SpecError naming the field."""
    kind = _TYPES[name].replace("Optional[", "").rstrip("]")
    flag = flag_name(name)
    if value is None:
        return None
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise SpecError(f"{flag} must be a whole number, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise SpecError(f"{flag} must be a whole number, got {value!r}") from None
    if kind == "float":
        if isinstance(value, bool):
            raise SpecError(f"{flag} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise SpecError(f"{flag} must be a number, got {value!r}") from None
    if kind == "bool":
        if not isinstance(value, bool):
            raise SpecError(f"{flag} must be true or false, got {value!r}")
        return value
    if kind == "dict":
        if not isinstance(value, Mapping):
            raise SpecError(f"{flag} must be a mapping of NAME: value, got {value!r}")
        return {str(k): _scalar_str(flag, v) for k, v in value.items()}
    # str (quantities may come from YAML as numbers: cpu_per_pod: 4)
    return _scalar_str(flag, value)


def _scalar_str(flag: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SpecError(f"{flag} must be a string, got {value!r}")
    return str(value)


def _check_field(name: str, value: Any) -> None:
    for text in _strings(value):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise SpecError(f"{flag_name(name)}: {text!r} is not valid Unicode text") from None
    check = _CHECKS.get(name)
    if check is not None and value is not None:
        problem = check(value)
        if problem:
            raise SpecError(f"{flag_name(name)}: {problem}")
    meta = _META[name]
    if meta["entrypoint"] and isinstance(value, str):
        _check_entrypoint_value(name, value)


def _check_entrypoint_value(name: str, value: str) -> None:
    if value == "":
        raise SpecError(f"{flag_name(name)}: must not be empty (leave it out to use the default)")
    if name == "storage_path" and value.startswith("~"):
        return  # the storage policy refuses it with the real reason ('~' is not expanded)
    if not _SHELL_SAFE.fullmatch(value):
        raise SpecError(f"{flag_name(name)}: {value!r} has characters that need shell quoting; "
                        "use letters, digits and _ @ % + = : , . / - only")


def _name(v: str) -> str | None:
    if not v:
        return "a job name is required, e.g. --name gpt2-demo"
    if len(v) > MAX_NAME_LENGTH:
        return f"{v!r} is {len(v)} characters; KubeRay allows at most {MAX_NAME_LENGTH}"
    if not _DNS1035.fullmatch(v):
        return (f"{v!r} is not a valid name: use lower-case letters, digits and '-', "
                "starting with a letter and ending with a letter or digit")
    return None


def _dns_label(what: str) -> Any:
    def check(v: str) -> str | None:
        if len(v) > 63 or not _DNS1123_LABEL.fullmatch(v):
            return (f"{v!r} is not a valid {what}: use at most 63 lower-case letters, digits "
                    "and '-', starting and ending with a letter or digit")
        return None
    return check


def _subdomain(what: str) -> Any:
    def check(v: str) -> str | None:
        if len(v) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(v):
            return (f"{v!r} is not a valid {what}: use lower-case letters, digits, '-' and '.', "
                    "starting and ending with a letter or digit")
        return None
    return check


def _quantity(v: str) -> str | None:
    if not _QUANTITY.fullmatch(v):
        return f"{v!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)"
    return None


def _at_least(n: int) -> Any:
    def check(v: int) -> str | None:
        return None if v >= n else f"must be at least {n}, got {v}"
    return check


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(v: str) -> str | None:
        return None if v in choices else f"{v!r} is not one of: {', '.join(choices)}"
    return check


def _image(v: str) -> str | None:
    if len(v) > 512 or not _IMAGE.fullmatch(v):
        return f"{v!r} is not a container image reference (e.g. registry/repo:tag)"
    return None


#: Environment variables the plan sets itself; user --env may not override them.
RESERVED_ENV_PREFIX = "SUBMITTER_"


def _env(v: dict) -> str | None:
    for key, value in v.items():
        if not _ENV_NAME.fullmatch(key):
            return f"{key!r} is not a valid environment variable name"
        if key.startswith(RESERVED_ENV_PREFIX):
            return f"{key} is reserved (the {RESERVED_ENV_PREFIX}* variables are set by submitter)"
        if "\x00" in value:
            return f"the value of {key} contains a NUL character"
    return None


def _positive_float(v: float) -> str | None:
    return None if v > 0 and v < float("inf") else f"must be a positive number, got {v}"


def _path_text(v: str) -> str | None:
    return None if v.strip() == v and v else f"{v!r} is empty or has surrounding spaces"


_CHECKS: dict[str, Any] = {
    "name": _name,
    "namespace": _dns_label("namespace"),
    "replicas": _at_least(1),
    "gpu_per_pod": _at_least(0),
    "cpu_per_pod": _quantity,
    "memory_per_pod": _quantity,
    "head_cpu": _quantity,
    "head_memory": _quantity,
    "image": _image,
    "image_pull_policy": _one_of(PULL_POLICIES),
    "env": _env,
    "storage_path": _path_text,
    "storage_mount": _path_text,
    "storage_size": _quantity,
    "storage_class": _subdomain("storage class name"),
    "storage_access_mode": _one_of(ACCESS_MODES),
    "existing_pvc": _subdomain("PVC name"),
    "model": _one_of(MODELS),
    "epochs": _at_least(1),
    "max_steps_per_epoch": _at_least(1),
    "batch_size_per_worker": _at_least(1),
    "learning_rate": _positive_float,
    "max_failures": _at_least(0),
    "num_to_keep": _at_least(1),
    "seed": _at_least(0),
    "ttl_seconds_after_finished": _at_least(0),
    "backoff_limit": _at_least(0),
    "active_deadline_seconds": _at_least(1),
}
_META = {f.name: f.metadata for f in dataclasses.fields(JobSpec)}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for kv in value.items() for s in kv]
    return []


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value
