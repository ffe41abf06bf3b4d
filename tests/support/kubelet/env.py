"""A container's environment as kubelet builds it: env (value, fieldRef, resourceFieldRef,
secretKeyRef, configMapKeyRef, each able to use $(VAR) of those before it), envFrom, and the
KUBERNETES_SERVICE_* variables; and `$(VAR)` expansion of command and args."""

from __future__ import annotations

import base64
import math
import re
from typing import Any, Callable

from tests.support.kubelet.api import Api, ApiError

_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
           "G": 10**9, "T": 10**12, "m": 1e-3, "": 1}


class ConfigError(Exception):
    """CreateContainerConfigError: a referenced Secret/ConfigMap or key is missing."""


def quantity(text: Any) -> float:
    """A Kubernetes resource quantity ("500m", "3Gi", 2) as a number (also the stand-in's)."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: $$ escapes, unknown references stay as written."""
    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


def field_value(pod: dict, path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
              "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
              "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.podIP": status.get("podIP", ""), "status.hostIP": status.get("hostIP", ""),
              "status.podIPs": status.get("podIP", ""), "status.hostIPs": status.get("hostIP", "")}
    if path in simple:
        return simple[path]
    if path in ("metadata.labels", "metadata.annotations"):
        values = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
    raise ConfigError(f"unsupported fieldPath {path!r}")


def resource_value(container: dict, ref: dict, node_capacity: dict[str, str]) -> str:
    resource = ref["resource"]
    kind, _, name = resource.partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:  # an unset limit is the node's allocatable
        value = node_capacity.get(name, "0")
    divisor = quantity(ref.get("divisor", "1"))
    return str(math.ceil(quantity(value) / divisor))


class Sources:
    """Secrets and ConfigMaps of one namespace, read once per container start."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api, self.namespace, self.cache = api, namespace, {}

    def data(self, kind: str, name: str, optional: bool = False) -> dict[str, str] | None:
        key = (kind, name)
        if key not in self.cache:
            try:
                obj = self.api.get(f"/api/v1/namespaces/{self.namespace}/{kind}/{name}")
            except ApiError as e:
                if e.status != 404:
                    raise
                if optional:
                    return None
                raise ConfigError(f'{kind[:-1]} "{name}" not found') from None
            data = dict(obj.get("data") or {})
            if kind == "secrets":
                data = {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
            else:
                data.update({k: base64.b64decode(v).decode(errors="replace")
                             for k, v in (obj.get("binaryData") or {}).items()})
            self.cache[key] = data
        return self.cache[key]


def container_env(pod: dict, container: dict, sources: Sources, base: dict[str, str],
                  node_capacity: dict[str, str]) -> dict[str, str]:
    """`base` (the image's env and kubelet's KUBERNETES_* variables), then envFrom, then env."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("secrets", "secretRef"), ("configmaps", "configMapRef")):
            if key in source:
                ref = source[key]
                data = sources.data(kind, ref["name"], ref.get("optional", False)) or {}
                env.update({prefix + k: v for k, v in data.items()})
    resolvers: dict[str, Callable[[dict], str | None]] = {
        "fieldRef": lambda r: field_value(pod, r["fieldPath"]),
        "resourceFieldRef": lambda r: resource_value(container, r, node_capacity),
        "secretKeyRef": lambda r: _key(sources, "secrets", r),
        "configMapKeyRef": lambda r: _key(sources, "configmaps", r),
    }
    for item in container.get("env") or []:
        if "valueFrom" not in item:
            env[item["name"]] = expand(str(item.get("value", "")), env)
            continue
        (how, ref), = item["valueFrom"].items()
        value = resolvers[how](ref)
        if value is not None:
            env[item["name"]] = value
    return env


def _key(sources: Sources, kind: str, ref: dict) -> str | None:
    data = sources.data(kind, ref["name"], ref.get("optional", False))
    if data is None:
        return None
    if ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise ConfigError(f'couldn\'t find key {ref["key"]} in {kind[:-1]} {sources.namespace}/{ref["name"]}')
    return data[ref["key"]]
