"""Every name both sides must agree on: objects, labels, environment variables, ConfigMap keys.

The CLI derives object names and labels from a job's name; the pod finds its job document, its
progress ConfigMap and its namespace in environment variables the plan sets. Defined once here,
so a renamed key cannot leave one side behind.
"""

from __future__ import annotations

import hashlib

# --- objects and labels ---------------------------------------------------------------------
APP = "submitter"
#: Label that names the job an object belongs to (with the ownership annotation, see below).
JOB_LABEL = "submitter.dev/job"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
#: Name of the checkpoint volume in the Ray pods.
CHECKPOINT_VOLUME = "checkpoints"


def object_names(name: str, existing_pvc: str | None = None) -> dict[str, str]:
    """Every object name derived from the job name (one place, so delete/watch/render agree)."""
    return {
        "rayjob": name,
        "pvc": existing_pvc or f"{name}-checkpoints",
        "progress": f"{name}-progress",  # ServiceAccount, Role, RoleBinding and ConfigMap
        "code": f"{name}-code",  # a --script job's code bundle (binaryData)
    }


#: Annotation every object and pod of a job carries: the job's identity. An object of a derived
#: name that lacks it (or carries another job's) is not ours: submit refuses to adopt it and
#: delete leaves it alone.
JOB_UID_ANNOTATION = "submitter.dev/job-uid"
#: Annotation on the checkpoint PVC: the last job document submitted for it (it outlives the
#: RayJob), so `resume NAME` after `delete NAME` needs no flags retyped.
JOB_DOCUMENT_ANNOTATION = "submitter.dev/job-document"
#: Annotation on the RayJob `submit` applies: the likely estimate (`submitter estimate -o json`,
#: compact JSON), so `watch`/`status`/`report` can compare the run against it (#38).
ESTIMATE_ANNOTATION = "submitter.dev/estimate"
#: A local run's estimate for its run.json (key RUN_ESTIMATE_KEY): `submit --local` passes it to
#: `python -m training` in this variable (compact JSON), the driver records it with the run.
ENV_ESTIMATE = "SUBMITTER_ESTIMATE"
RUN_ESTIMATE_KEY = "estimate"


def job_uid(namespace: str, name: str) -> str:
    """The identity of the job `namespace/name`: deterministic (render stays pure, GitOps diffs
    stay clean), and different for the same name in another namespace."""
    return hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:16]


def annotations(namespace: str, name: str) -> dict[str, str]:
    """The identity annotations every object and pod of a job carries."""
    return {JOB_UID_ANNOTATION: job_uid(namespace, name)}


def labels(name: str) -> dict[str, str]:
    """The labels every object and pod of a job carries."""
    return {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/instance": name,
        MANAGED_BY_LABEL: APP,
        JOB_LABEL: name,
    }


# --- the pod's environment ----------------------------------------------------------------------
#: The validated job settings as one JSON document (`JobSpec.document()`): what
#: `python -m training` reads in a pod. The RayJob's entrypoint is constant.
ENV_JOB = "SUBMITTER_JOB"
#: The progress ConfigMap the entrypoint patches, and the namespace it lives in.
ENV_PROGRESS_CONFIGMAP = "SUBMITTER_PROGRESS_CONFIGMAP"
ENV_NAMESPACE = "SUBMITTER_NAMESPACE"
#: Set by the project's images (Dockerfile): the GPT-2 BPE ranks file (tiktoken format) baked in
#: at build time, the training side's default `bpe_file` when the job names none.
ENV_GPT2_BPE = "SUBMITTER_GPT2_BPE"
#: Where the images keep that file.
IMAGE_GPT2_BPE = "/opt/submitter/gpt2.tiktoken"
#: Environment variables the plan sets itself; user --env may not override them.
RESERVED_ENV_PREFIX = "SUBMITTER_"

# --- Ray resources ------------------------------------------------------------------------------
#: A custom Ray resource each worker pod advertises once per Ray Train worker it was rendered for
#: (rayStartParams `resources`), and each Ray Train worker reserves one of: a pod then never
#: holds more training workers than it was sized for, whatever CPUs it has left. Without it an
#: elastic group that lost a pod restarted with two workers on the one 2-CPU pod left, taking
#: the CPU meant for Ray Data, and Ray Data waited forever (FACTS.md).
TRAIN_SLOT_RESOURCE = "submitter_train_slot"


def ray_start_resources(resources: dict[str, int]) -> str:
    """rayStartParams' `resources` value as KubeRay's documentation spells it: JSON inside a
    pair of double quotes, since KubeRay pastes `--resources=<value>` into the bash command
    that starts Ray (`"{\\"name\\": 1}"` reaches `ray start` as `{"name": 1}`)."""
    inner = ", ".join(f'\\"{k}\\": {int(v)}' for k, v in sorted(resources.items()))
    return '"{' + inner + '}"'


# --- the progress ConfigMap's keys --------------------------------------------------------------
CONFIGMAP_STATE_KEY = "state.json"     # the folded ProgressState, JSON
CONFIGMAP_EVENTS_KEY = "events.jsonl"  # the last CONFIGMAP_MAX_EVENTS events, JSON lines
CONFIGMAP_MAX_EVENTS = 50

# --- files under a run directory ----------------------------------------------------------------
#: The append-only event log under `<storage_path>/<run_name>/`.
EVENTS_FILE = "events.jsonl"

# --- data -----------------------------------------------------------------------------------------
#: The offline corpus local runs default to: the source text every Python installation has.
OFFLINE_DATASET = "python-stdlib"


#: Environment variable names that hold credentials: --env would write them in plain text into
#: the RayJob (and every GitOps copy of it); --secret-env takes them from a Secret instead; the
#: run's stored logs redact their values (contract.run_logs). Here, a leaf, so that the log
#: redaction in the pods' emitter does not import the whole JobSpec for one pattern.
CREDENTIAL_ENV = r"(?i)(SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)"
