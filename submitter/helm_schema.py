"""The Helm chart's `values.yaml` and `values.schema.json`, generated from JobSpec.

Defaults, help texts and validation live in `submitter.spec`; this module only translates them
for Helm, so the chart never holds a second copy. `tests/test_helm_chart.py` checks that the
committed files equal what this module generates, and probes JobSpec at every constraint's
boundary so the schema and the spec cannot drift apart.

Regenerate after changing JobSpec:

    python -m submitter.helm_schema
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from submitter import spec as S
from submitter.helm_values import camel, default_values

CHART_DIR = Path(__file__).resolve().parents[1] / "charts" / "submitter"

#: What the chart does beyond JobSpec for a key (added to that key's comment and description).
CHART_NOTES = {
    "name": 'empty ("") = the Helm release name',
    "namespace": "when left at the default, the release namespace (helm -n) is used instead",
}

# --- JSON-schema fragments for JobSpec's checks (Go's regexp runs these: RE2 syntax) -----------
def _re2(pattern: Any) -> str:
    """A JobSpec regex for Go's RE2, which knows `\\z` but not Python's `\\Z`."""
    return pattern.pattern.replace(r"\Z", "$")


_QUANTITY = {"anyOf": [{"type": "string", "pattern": _re2(S._QUANTITY)},
                       {"type": "integer", "minimum": 0}]}
_SHELL_SAFE = {"type": "string", "pattern": _re2(S._SHELL_SAFE)}


def _subdomain() -> dict[str, Any]:
    return {"type": "string", "maxLength": 253, "pattern": _re2(S._DNS1123_SUBDOMAIN)}


def _minimum(n: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": n}


#: One schema per JobSpec field; `tests/test_helm_chart.py` holds each against JobSpec.
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "name": {"anyOf": [{"type": "string", "maxLength": 0},
                       {"type": "string", "maxLength": S.MAX_NAME_LENGTH,
                        "pattern": _re2(S._DNS1035)}]},
    "namespace": {"type": "string", "maxLength": 63, "pattern": _re2(S._DNS1123_LABEL)},
    "replicas": _minimum(1),
    "gpu_per_pod": _minimum(0),
    "cpu_per_pod": _QUANTITY,
    "memory_per_pod": _QUANTITY,
    "head_cpu": _QUANTITY,
    "head_memory": _QUANTITY,
    "image": {"type": "string", "maxLength": 512, "pattern": _re2(S._IMAGE)},
    "image_pull_policy": {"type": "string", "enum": list(S.PULL_POLICIES)},
    "env": {"type": "object",
            "propertyNames": {"pattern": _re2(S._ENV_NAME),
                              "not": {"pattern": "^" + S.RESERVED_ENV_PREFIX}},
            "additionalProperties": {"anyOf": [{"type": "string", "pattern": "^[^\\x00]*$"},
                                               {"type": "integer"}]}},
    # A leading "~" passes the schema so that the chart's storage policy refuses it with the
    # reason and the fix (`fail`), rather than a bare "does not match pattern".
    "storage_path": {"type": "string", "pattern": "^~?" + _re2(S._SHELL_SAFE).lstrip("^")},
    "storage_mount": _SHELL_SAFE,
    "storage_size": _QUANTITY,
    "storage_class": _subdomain(),
    "storage_access_mode": {"type": "string", "enum": list(S.ACCESS_MODES)},
    "existing_pvc": _subdomain(),
    "model": {"type": "string", "enum": list(S.MODELS)},
    "epochs": _minimum(1),
    "max_steps_per_epoch": _minimum(1),
    "batch_size_per_worker": _minimum(1),
    # `--set learningRate=0.001` arrives as a string (Helm parses only ints and bools there).
    "learning_rate": {"anyOf": [{"type": "number", "exclusiveMinimum": 0},
                                {"type": "string",
                                 "pattern": "^([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$"}]},
    "dataset": _SHELL_SAFE,
    "dataset_config": _SHELL_SAFE,
    "data": _SHELL_SAFE,
    "bpe_file": _SHELL_SAFE,
    "max_failures": _minimum(0),
    "num_to_keep": _minimum(1),
    "seed": _minimum(0),
    "fsdp": {"type": "boolean"},
    "allow_ephemeral_storage": {"type": "boolean"},
    "ttl_seconds_after_finished": _minimum(0),
    "backoff_limit": _minimum(0),
    "active_deadline_seconds": _minimum(1),
}


def _help(field_name: str) -> str:
    text = {f.name: f for f in S.fields()}[field_name].metadata["help"]
    note = CHART_NOTES.get(field_name)
    return f"{text}; {note}" if note else text


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """Optional[...] fields also take null (= not set)."""
    return {"anyOf": [{"type": "null"}, schema]}


def values_schema() -> dict[str, Any]:
    properties = {}
    for f in S.fields():
        prop = dict(CONSTRAINTS[f.name])
        if f.type.startswith("Optional["):
            prop = _nullable(prop)
        properties[camel(f.name)] = {"description": _help(f.name), **prop}
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": "submitter chart values (generated from submitter.spec.JobSpec)",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        # JobSpec's one rule across fields (FSDP_NEEDS_GPUS); Helm merges the defaults in first.
        "if": {"properties": {"fsdp": {"const": True}}, "required": ["fsdp"]},
        "then": {"properties": {"gpuPerPod": {"minimum": 1}}},
    }


def values_yaml() -> str:
    """A documented values.yaml: JobSpec's defaults, each under its help text."""
    out = ["# Values of the submitter chart: one key per JobSpec field (camelCase), with JobSpec's",
           "# defaults. Generated by `python -m submitter.helm_schema`; do not edit by hand.",
           "# `submitter render --helm-values ...` writes a values file for the same job. The",
           "# comments name CLI flags (--storage-mount); here they are keys (storageMount).",
           ""]
    for f in S.fields():
        key = camel(f.name)
        out.append(f"# -- {_help(f.name)}")
        out.append(yaml.safe_dump({key: default_values()[key]}, default_flow_style=False,
                                  width=1 << 30).rstrip("\n"))
    return "\n".join(out) + "\n"


def schema_json() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


def write(chart_dir: Path = CHART_DIR) -> None:
    (chart_dir / "values.yaml").write_text(values_yaml())
    (chart_dir / "values.schema.json").write_text(schema_json())


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else CHART_DIR)
