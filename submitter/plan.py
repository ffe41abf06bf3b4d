"""Plan: the rendered objects of one job, and their YAML/JSON/directory forms."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def to_yaml(objects: Any, *, stream: bool = True) -> str:
    """Deterministic YAML: insertion order kept, no anchors, no line folding."""
    dump = yaml.dump_all if stream else yaml.dump
    return dump(objects, Dumper=_DUMPER, sort_keys=False, default_flow_style=False,
                width=1 << 30, allow_unicode=False)


@dataclass(frozen=True)
class Plan:
    """The manifests of one job, in apply order. `str(plan)` is the YAML stream."""

    objects: tuple[dict[str, Any], ...]

    def __str__(self) -> str:
        return to_yaml(list(self.objects))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.objects)

    def __len__(self) -> int:
        return len(self.objects)

    def to_json(self) -> str:
        """A Kubernetes `List`, as `kubectl get -o json` prints several objects."""
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(self.objects)},
                          indent=2) + "\n"

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str) -> dict[str, Any] | None:
        found = self.of_kind(kind)
        return found[0] if found else None

    def files(self) -> dict[str, str]:
        """One file per object plus a kustomization.yaml listing them (a GitOps directory)."""
        out: dict[str, str] = {}
        for obj in self.objects:
            out[f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"] = to_yaml(obj, stream=False)
        out["kustomization.yaml"] = to_yaml({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [name for name in out],
        }, stream=False)
        return out

    def write_dir(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write `files()` into `directory` (created if needed). Other files there are left alone;
        each file is replaced atomically so a GitOps checkout never sees half a manifest."""
        import tempfile  # only here: it costs render's start-up ~5 ms

        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.files().items():
            target = root / name
            fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{name}.")
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, target)
            written.append(target)
        return written
