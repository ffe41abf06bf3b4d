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

from submitter.contract import naming, pod_network
from submitter.contract.spec import (RAY_VERSION, JobSpec, parse_secret_ref, parse_selector,
                                     parse_toleration)
from submitter.contract.shutdown import RAY_STOP_MARGIN_S, exit_chain
from submitter.contract.storage import StorageDecision, check_job_storage, check_pod_file
from submitter.plan import Plan

#: One template per object kind, in apply order (the PVC and RBAC exist before the RayJob).
TEMPLATES = ("pvc", "serviceaccount", "role", "rolebinding", "configmap", "code", "networkpolicy",
             "rayjob")
#: Kueue's label naming the LocalQueue of a workload; a RayJob for Kueue starts suspended.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Kueue's opt-in to workload slicing (Kueue >= 0.13, feature gate ElasticJobsViaWorkloadSlices):
#: without it Kueue's webhook refuses a queued RayJob with enableInTreeAutoscaling ("a kueue
#: managed job should only use autoscaling when workload slicing is enabled").
KUEUE_ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
#: The RayJob's entrypoint: constant. The job's settings reach it as data (env `SUBMITTER_JOB`).
ENTRYPOINT = "python -m training"
#: The other programs a RayJob may run, given the same job document: `submitter data prepare`'s
#: (tokenize a source once into a prepared corpus, on CPU workers).
PROGRAMS = {"prepare": "python -m training.prepare",
            # `data prepare --force`: every shard made again, whole or not
            "prepare-force": "python -m training.prepare --force"}


def storage_decision(spec: JobSpec) -> StorageDecision:
    """Apply the storage policy (raises StoragePolicyError with the fix), and refuse files the
    pod reads that only exist on this machine."""
    decision = check_job_storage(spec.resolved_storage_path, spec.storage_mount,
                                 spec.storage_access_mode)
    for flag, path in (("--data", spec.data), ("--val-data", spec.val_data),
                       ("--bpe-file", spec.bpe_file)):
        if path is not None and not (flag == "--data" and (spec.data_path.name
                                                            or spec.data_path.mixture)):
            check_pod_file(flag, path, spec.storage_mount)  # (a corpus NAME is the storage's)
    return decision


def pod_settings(spec: JobSpec, service_account: str, role: str) -> dict[str, Any]:
    """The pod-level scheduling and identity settings of one pod template ("head", "worker" or
    "submitter"). Every pod gets the user's nodeSelector, tolerations, priority and runtime
    class and pull secrets (a cluster whose every node is tainted must place the head and the
    submitter too); the GPU type and the GPU taint's toleration go to GPU workers only. Only the
    head, where the driver patches the progress ConfigMap, mounts the service-account token: the
    workers never call the Kubernetes API, and the submitter pod only runs `ray job submit`
    against the dashboard over HTTP (KubeRay gives it the Ray token, not a Kubernetes one)."""
    gpu_worker = role == "worker" and spec.gpu_per_pod > 0
    node_selector = dict(spec.node_selector)
    tolerations = [parse_toleration(t) for t in spec.toleration]
    if gpu_worker and spec.gpu_type is not None:
        node_selector[spec.gpu_type_label] = spec.gpu_type
    if gpu_worker and spec.gpu_toleration is not None:
        tolerations.append(parse_toleration(spec.gpu_toleration))
    out: dict[str, Any] = {"serviceAccountName": service_account,
                           "automountServiceAccountToken": role == "head"}
    if role != "submitter":  # the Ray pods: time to write a last checkpoint on SIGTERM
        out["terminationGracePeriodSeconds"] = spec.termination_grace_period
    if node_selector:
        out["nodeSelector"] = node_selector
    if tolerations:
        out["tolerations"] = tolerations
    if spec.priority_class is not None:
        out["priorityClassName"] = spec.priority_class
    if spec.runtime_class is not None:
        out["runtimeClassName"] = spec.runtime_class
    if spec.image_pull_secret:
        out["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secret]
    return out


#: Seconds of the grace period left to `ray start`'s own shutdown after the preStop hook.
PRESTOP_MARGIN = RAY_STOP_MARGIN_S


def lifecycle(spec: JobSpec) -> dict[str, Any]:
    """The Ray containers' preStop hook (training/prestop.py): kubelet runs it before its SIGTERM,
    which KubeRay's PID 1 (bash) would never pass on; it SIGTERMs the pod's driver and Ray Train
    workers (a preemption checkpoint, then exit 143 for the RayJob's retry) and waits for them,
    within the grace period (its wait: submitter.contract.shutdown, the whole chain of waits)."""
    wait = exit_chain(spec.termination_grace_period).prestop_s
    return {"preStop": {"exec": {"command": ["python", "-m", "training.prestop", "--timeout",
                                             f"{wait:g}"]}}}


def _env(spec: JobSpec, progress: str, plain: dict[str, str]) -> list[dict[str, Any]]:
    """A Ray container's env: the pod's own variables, `plain` (sorted), the secret ones."""
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"},
           {"name": naming.ENV_PROGRESS_CONFIGMAP, "value": progress},
           {"name": naming.ENV_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    env += [{"name": k, "value": v} for k, v in sorted(plain.items())]
    for key, ref in sorted(spec.secret_env.items()):
        secret, secret_key = parse_secret_ref(ref)
        env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": secret_key}}})
    return env


def context(spec: JobSpec, program: str | None = None) -> dict[str, Any]:
    """The template variables: the spec plus everything derived from it. `program`: one of
    PROGRAMS instead of the GPT-2 entrypoint (or a --script job's runner)."""
    decision = storage_decision(spec)
    n = naming.object_names(spec.name, spec.existing_pvc)
    on_pvc = decision.kind == "shared-mount"
    env = _env(spec, n["progress"], spec.env)
    # GPU workers: NCCL's socket transport tuned for pod networks (submitter.contract.pod_network)
    worker_env = _env(spec, n["progress"], pod_network.worker_env(spec.gpu_per_pod, spec.env,
                                                                  spec.secret_env))
    labels = {**spec.label, **naming.labels(spec.name)}
    code = code_context(spec) if program is None else {"entrypoint": PROGRAMS[program],
                                                        "configmap": None, "env": []}
    service_account = spec.service_account or n["progress"]
    return {
        "spec": spec.to_dict(),
        "names": n,
        # --replicas N or MIN:MAX (an elastic group: KubeRay's autoscaler between the two)
        "replicas": {"min": spec.min_replicas, "max": spec.max_replicas, "elastic": spec.elastic},
        # each worker pod holds exactly its Ray Train workers (naming.TRAIN_SLOT_RESOURCE)
        "worker_ray_start_params": {"resources": naming.ray_start_resources(
            {naming.TRAIN_SLOT_RESOURCE: spec.workers_per_pod})},
        "labels": labels,
        "annotations": {**spec.annotation, **naming.annotations(spec.namespace, spec.name)},
        # a queued elastic group (--queue with --replicas MIN:MAX) is a Kueue elastic job
        "rayjob_annotations": ({**spec.annotation, **naming.annotations(spec.namespace, spec.name),
                                KUEUE_ELASTIC_ANNOTATION: "true"}
                               if spec.queue is not None and spec.elastic else
                               {**spec.annotation, **naming.annotations(spec.namespace, spec.name)}),
        "rayjob_labels": ({**labels, KUEUE_QUEUE_LABEL: spec.queue} if spec.queue is not None
                          else labels),
        "image": spec.resolved_image,
        "image_pull_policy": spec.resolved_image_pull_policy,
        "service_account": service_account,
        "create_service_account": spec.service_account is None,
        "pods": {role: pod_settings(spec, service_account, role)
                 for role in ("head", "worker", "submitter")},
        "job_label": naming.JOB_LABEL,
        # --dashboard-cidr: NetworkPolicy peers admitted to the dashboard port only
        "ip_blocks": [{"ipBlock": {"cidr": cidr}} for cidr in spec.dashboard_cidr],
        "operator_labels": parse_selector(spec.operator_selector),  # --operator-selector
        "metrics_labels": parse_selector(spec.metrics_selector),  # --metrics-selector
        "env_from": [{"secretRef": {"name": s}} for s in spec.env_from_secret],
        "ray_version": RAY_VERSION,
        "create_pvc": on_pvc and spec.existing_pvc is None,
        "mount_pvc": on_pvc,
        "checkpoint_volume": naming.CHECKPOINT_VOLUME,
        "entrypoint": code["entrypoint"],
        "code": code,
        "lifecycle": lifecycle(spec),
        "env": env,
        "worker_env": worker_env,
        # the driver runs on the head: only its container carries the job document
        "head_env": env + [{"name": naming.ENV_JOB, "value": spec.document()}] + code["env"],
    }


def code_context(spec: JobSpec) -> dict[str, Any]:
    """A --script job's program and code (submitter.code_plan): the runner's entrypoint, the
    bundle's ConfigMap (base64 binaryData) and the head's SUBMITTER_CODE; the GPT-2 job's
    entrypoint otherwise. The cluster side knows nothing else of which program runs."""
    if spec.script is None:  # the GPT-2 job: render's start-up pays for no zip or hashing
        return {"entrypoint": ENTRYPOINT, "configmap": None, "env": []}
    from submitter.code_plan import SCRIPT_ENTRYPOINT
    from submitter.contract.code import ENV_CODE
    from submitter.helm_code import code_values

    code = code_values(spec)  # the chart's `code` values: the same ConfigMap and reference
    assert code is not None
    return {"entrypoint": SCRIPT_ENTRYPOINT, **code,
            "env": [{"name": ENV_CODE, "value": code["ref"]}]}


def render(spec: JobSpec, program: str | None = None) -> Plan:
    """Render every object of the job, validated by the storage policy first; `program` names
    another of PROGRAMS than the training job."""
    ctx = context(spec, program)
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


# `submitter.render(spec)` (the Python API) is this module called: see submitter/_callable.py.
from submitter._callable import make_callable  # noqa: E402

make_callable(__name__, "submitter.api:render")
