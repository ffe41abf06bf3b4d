"""JobSpec <-> values of the Helm chart in `charts/submitter/` (same fields, camelCase keys).

The chart renders the same objects as `submitter render` for the values this module produces;
a parity test holds both to that, and checks that the chart's `values.yaml` defaults and
`values.schema.json` keys are exactly JobSpec's.
"""

from __future__ import annotations

from typing import Any

from submitter.spec import JobSpec, defaults


def camel(field_name: str) -> str:
    head, *rest = field_name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def helm_values(spec: JobSpec) -> dict[str, Any]:
    """All of the spec's fields as chart values, in field order."""
    return {camel(k): v for k, v in spec.to_dict().items()}


def default_values() -> dict[str, Any]:
    """What the chart's `values.yaml` must hold: JobSpec's defaults (name empty: release name)."""
    return {camel(k): v for k, v in defaults().items()}


def spec_from_values(values: dict[str, Any], release_name: str | None = None,
                     release_namespace: str | None = None) -> JobSpec:
    """The JobSpec a set of chart values stands for, resolving name and namespace as the chart
    does: an empty name is the release name; the default namespace yields to the release's."""
    by_camel = {camel(k): k for k in defaults()}
    data = {by_camel[k]: v for k, v in values.items() if k in by_camel}
    if not data.get("name") and release_name:
        data["name"] = release_name
    default_namespace = defaults()["namespace"]
    if release_namespace and values.get("namespace", default_namespace) == default_namespace:
        data["namespace"] = release_namespace  # the chart: the default yields to `helm -n`
    return JobSpec.build(data)
