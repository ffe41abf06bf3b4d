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
