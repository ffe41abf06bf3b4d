"""Validators for rendered objects: the KubeRay CRD schema (jsonschema) and core kinds
(kubernetes-validate, strict). Shared by the render and Helm tests."""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

import yaml

from tests.conftest import shared_file

KUBE_VERSION = "1.30"


def _strict(schema: Any) -> Any:
    """The API server prunes unknown fields silently; make them errors instead, so a typo in a
    template fails a test rather than vanishing in the cluster."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (out.get("type") == "object" and "properties" in out
                and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@lru_cache(maxsize=1)
def rayjob_validator() -> Any:
    import jsonschema

    crd = yaml.safe_load(shared_file("kuberay-crds", "ray.io_rayjobs.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    # metadata is validated by the API server itself, not by the CRD schema
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def rayjob_errors(obj: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in rayjob_validator().iter_errors(obj)]


def core_errors(obj: dict) -> list[str]:
    """Strict validation of a core object (or of a RayJob's pod templates as PodTemplates)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [str(e).splitlines()[0]]
    return []


def validate_plan(objects: list[dict]) -> list[str]:
    """Every problem in a plan: RayJob against the CRD and its pod templates strictly as core
    PodTemplates; every other object strictly against Kubernetes' own schema."""
    problems = []
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "RayJob":
            problems += [f"{where}: {p}" for p in rayjob_errors(obj)]
            for label, template in pod_templates(obj):
                pod = {"apiVersion": "v1", "kind": "PodTemplate",
                       "metadata": {"name": "t"}, "template": template}
                problems += [f"{where} {label}: {p}" for p in core_errors(pod)]
        else:
            problems += [f"{where}: {p}" for p in core_errors(obj)]
    return problems


def pod_templates(rayjob: dict) -> list[tuple[str, dict]]:
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    out = [("head", cluster["headGroupSpec"]["template"])]
    out += [(f"worker {g['groupName']}", g["template"]) for g in cluster["workerGroupSpecs"]]
    if "submitterPodTemplate" in spec:
        out.append(("submitter", spec["submitterPodTemplate"]))
    return out
