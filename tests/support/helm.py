"""Render charts/submitter with helm-python-sdk (Helm's own Go code), offline, into dicts."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

CHART_DIR = ROOT / "charts" / "submitter"
NOTES = "submitter/templates/NOTES.txt"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster than pure Python

Key = tuple[str, str]  # (kind, metadata.name)


def helm() -> Any:
    """The helm_python module (installed with the test extras; CI has it)."""
    return pytest.importorskip("helm_python", reason="helm-python-sdk is a test dependency")


@lru_cache(maxsize=1)
def chart() -> Any:
    return helm().Chart.load(str(CHART_DIR))


def render_chart(values: dict[str, Any], *, release: str = "rel",
                 namespace: str | None = None) -> dict[Key, dict[str, Any]]:
    """The chart's objects keyed by (kind, name); raises helm's error when the chart fails."""
    out = chart().render(values, name=release, namespace=namespace)
    return by_key(doc for path, text in sorted(out.items()) if path != NOTES
                  for doc in yaml.load_all(text, Loader=_LOADER))


def render_notes(values: dict[str, Any], *, release: str = "rel",
                 namespace: str | None = None) -> str:
    return chart().render(values, name=release, namespace=namespace)[NOTES]


def by_key(objects: Any) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for obj in objects:
        if obj is None:  # a template that rendered nothing (no PVC for s3://)
            continue
        key = (obj["kind"], obj["metadata"]["name"])
        assert key not in out, f"two objects named {key}"
        out[key] = obj
    return out


def spec_from_values(values: dict[str, Any], release_name: str | None = None,
                     release_namespace: str | None = None) -> Any:
    """The JobSpec a set of chart values stands for, resolving name and namespace as the chart
    does: an empty name is the release name; the default namespace yields to the release's."""
    from submitter.contract.spec import JobSpec, defaults

    data = dict(values)
    if not data.get("name") and release_name:
        data["name"] = release_name
    default_namespace = defaults()["namespace"]
    if release_namespace and values.get("namespace", default_namespace) == default_namespace:
        data["namespace"] = release_namespace
    return JobSpec.build(data)


def job_document(objects: dict[Key, dict[str, Any]]) -> str:
    """The SUBMITTER_JOB value of the (one) RayJob's head container."""
    (rayjob,) = [o for (kind, _), o in objects.items() if kind == "RayJob"]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return next(e["value"] for e in head["env"] if e["name"] == "SUBMITTER_JOB")


def normalized(objects: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Objects with the job document parsed: Go's toJson and Python's json.dumps spell the
    same settings differently (number formats, HTML escapes), and the pod reads settings."""
    import copy

    from submitter.contract.spec import JobSpec

    out = copy.deepcopy(objects)
    for (kind, _), obj in out.items():
        if kind == "RayJob":
            head = obj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
            for env in head["env"]:
                if env["name"] == "SUBMITTER_JOB":
                    env["value"] = JobSpec.from_document(env["value"]).to_dict()
    return out
