"""What a real kube-apiserver (v1.34) decides about a request, for the emulator to answer alike.

Each rule here was measured against a real API server with `tests/support/api_parity.py`; the
emulator (`tests/support/kube_emulator.py`) asks these functions instead of guessing, so its
answers carry the real server's status codes and message shapes:

- label selectors (equality- and set-based, 400 on a selector the server cannot parse) and field
  selectors (`=`, `==`, `!=`; 400 on a field the resource does not index);
- object names (RFC 1123 subdomain, DNS label for Namespaces: 422 Invalid);
- which kinds carry `metadata.generation` (custom resources, Pods, NetworkPolicies; not
  ConfigMaps, Secrets, RBAC objects, PVCs, ServiceAccounts or Namespaces);
- a CRD's structural schema: unknown fields (refused with `fieldValidation=Strict`, pruned
  otherwise) and defaults, from the CRDs in ../shared/kuberay-crds;
- `managedFields` entries (manager, operation, subresource; the field sets themselves are not
  tracked).

Where the emulator still answers otherwise, on purpose: type and CEL checks of a RayJob's fields
(opt-in through `emulator.validate()`: jsonschema's words, not the server's); a deleted Namespace
goes at once (a real one stays Terminating a while); a watch from an old resourceVersion is 410
only after `compact()` (a real server's answer depends on when etcd compacted); and no
controller fills a new namespace (`kube-root-ca.crt`, the `default` ServiceAccount).
"""

from __future__ import annotations

import copy
import re
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

#: API groups the API server serves itself; everything else is a custom resource (a CRD).
BUILTIN_GROUPS = frozenset({
    "", "apps", "batch", "autoscaling", "policy", "rbac.authorization.k8s.io", "networking.k8s.io",
    "storage.k8s.io", "coordination.k8s.io", "events.k8s.io", "apiextensions.k8s.io",
    "scheduling.k8s.io", "discovery.k8s.io", "node.k8s.io", "certificates.k8s.io",
    "admissionregistration.k8s.io", "apiregistration.k8s.io", "authentication.k8s.io",
    "authorization.k8s.io", "flowcontrol.apiserver.k8s.io", "resource.k8s.io"})
#: Built-in kinds whose strategy sets `metadata.generation` (measured: pods and networkpolicies
#: do on 1.34; configmaps, secrets, serviceaccounts, roles, rolebindings, PVCs, namespaces don't).
GENERATION_PLURALS = frozenset({"pods", "networkpolicies", "deployments", "statefulsets",
                                "daemonsets", "replicasets", "jobs", "cronjobs", "poddisruptionbudgets"})
#: Fields each built-in resource indexes for field selectors beyond metadata.name/namespace.
FIELD_LABELS: dict[str, frozenset[str]] = {
    "pods": frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                       "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
                       "status.podIPs", "status.nominatedNodeName"}),
    "events": frozenset({"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                         "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                         "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}),
    "secrets": frozenset({"type"}),
    "namespaces": frozenset({"status.phase"}),
}
#: Resources that answer an unknown field selector with the 1.34 message naming the fields it
#: knows; the others (pods, events, custom resources) say "field label not supported".
KNOWN_FIELDS_MESSAGE = frozenset({"configmaps", "serviceaccounts", "persistentvolumeclaims",
                                  "roles", "rolebindings", "networkpolicies"})
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
SUBDOMAIN_MESSAGE = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                     "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
                     "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_MESSAGE = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                 "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
                 "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")


#: ObjectMeta's fields: a strict decode refuses any other key under `metadata`.
OBJECT_META = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers", "managedFields"})


class SelectorError(ValueError):
    """A selector the API server refuses with 400 BadRequest (the message is the server's)."""


# --- label selectors -----------------------------------------------------------------------

_SET_TERM = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s*(.*)$")


def split_terms(selector: str) -> list[str]:
    """Split on the commas outside parentheses (`a in (x,y),b` is two terms)."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


def label_matcher(selector: str) -> list[Any]:
    """Parse a label selector into predicates over a labels dict; SelectorError as the server's."""
    return [_label_term(term) for term in split_terms(selector)]


def _label_term(term: str) -> Any:
    found = _SET_TERM.match(term)
    if found:
        key, op, rest = found.groups()
        if not (rest.startswith("(") and rest.endswith(")")):
            word = rest.split()[0] if rest.split() else ""
            raise SelectorError(f"unable to parse requirement: found '{word}' expected: '('")
        values = {v.strip() for v in rest[1:-1].split(",") if v.strip()}
        return (lambda labels: labels.get(key) in values) if op == "in" else \
            (lambda labels: labels.get(key) not in values)
    if term.startswith("!"):
        return lambda labels: term[1:].strip() not in labels
    for op in ("!=", "==", "="):
        if op in term:
            key, value = (part.strip() for part in term.split(op, 1))
            if "=" in value:
                raise SelectorError("found '=', expected: ',' or 'end of string'")
            return (lambda labels: labels.get(key) != value) if op == "!=" else \
                (lambda labels: labels.get(key) == value)
    return lambda labels: term in labels


# --- field selectors -----------------------------------------------------------------------

def field_matcher(selector: str, plural: str, custom: bool) -> list[Any]:
    """Parse a field selector for `plural` into predicates over an object."""
    return [_field_term(term, plural, custom) for term in split_terms(selector)]


def _field_term(term: str, plural: str, custom: bool) -> Any:
    op = next((o for o in ("!=", "==", "=") if o in term), None)
    if op is None:
        raise SelectorError(f"invalid selector: '{term}'; can't understand '{term}'")
    key, value = (part.strip() for part in term.split(op, 1))
    known = {"metadata.name", "metadata.namespace"} | set(FIELD_LABELS.get(plural, ()))
    if key not in known:
        if not custom and plural in KNOWN_FIELDS_MESSAGE:
            only = ", ".join(f'"{k}"' for k in sorted(known))
            raise SelectorError(f'"{key}" is not a known field selector: only {only}')
        raise SelectorError(f"field label not supported: {key}")

    def actual(obj: dict) -> str:
        found: Any = obj
        for part in key.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        return "" if found is None else str(found).lower() if isinstance(found, bool) else str(found)

    return (lambda obj: actual(obj) != value) if op == "!=" else (lambda obj: actual(obj) == value)


def selected(obj: dict, labels: list[Any], fields: list[Any]) -> bool:
    own = (obj.get("metadata") or {}).get("labels") or {}
    return all(match(own) for match in labels) and all(match(obj) for match in fields)


# --- names and generation ------------------------------------------------------------------

def invalid_name(name: str | None, plural: str) -> str | None:
    """The server's complaint about `metadata.name`, or None when the name is valid."""
    if not name:
        return "metadata.name: Required value: name or generateName is required"
    limit, pattern, message = (63, LABEL, LABEL_MESSAGE) if plural == "namespaces" else \
        (253, SUBDOMAIN, SUBDOMAIN_MESSAGE)
    if len(name) > limit:
        return f'metadata.name: Invalid value: "{name}": must be no more than {limit} characters'
    if not pattern.fullmatch(name):
        return f'metadata.name: Invalid value: "{name}": {message}'
    return None


def is_custom(group: str) -> bool:
    return group not in BUILTIN_GROUPS


def has_generation(group: str, plural: str) -> bool:
    return is_custom(group) or plural in GENERATION_PLURALS


# --- managedFields -------------------------------------------------------------------------

def managed_entry(manager: str, operation: str, api_version: str, subresource: str | None) -> dict:
    entry = {"manager": manager, "operation": operation, "apiVersion": api_version,
             "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "fieldsType": "FieldsV1", "fieldsV1": {}}
    if subresource:
        entry["subresource"] = subresource
    return entry


def record_manager(obj: dict, entry: dict) -> None:
    """One entry per (manager, operation, subresource), as the server keeps them."""
    key = (entry["manager"], entry["operation"], entry.get("subresource"))
    meta = obj.setdefault("metadata", {})
    kept = [m for m in meta.get("managedFields") or []
            if (m.get("manager"), m.get("operation"), m.get("subresource")) != key]
    meta["managedFields"] = kept + [entry]


# --- CRD structural schemas ------------------------------------------------------------------

@lru_cache(maxsize=None)
def crd_schema(plural: str, group: str, version: str) -> dict | None:
    """The openAPIV3Schema of a CRD in ../shared/kuberay-crds (None: no schema known)."""
    import yaml

    from tests.conftest import SHARED

    path = SHARED / "kuberay-crds" / f"{group}_{plural}.yaml"
    if not path.exists():
        return None
    crd = yaml.safe_load(path.read_text())
    return next((v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version), None)


def unknown_fields(obj: Any, schema: dict, path: str = "") -> list[str]:
    """Dotted paths of fields the structural schema does not declare (metadata is the server's)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, dict) and "properties" in schema:
        found = []
        for key, value in obj.items():
            where = f"{path}.{key}" if path else key
            if where == "metadata" and isinstance(value, dict):
                found += [f"metadata.{k}" for k in value if k not in OBJECT_META]
            elif key in schema["properties"]:
                found += unknown_fields(value, schema["properties"][key], where)
            elif key not in ("apiVersion", "kind"):
                found.append(where)
        return found
    if isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [f for key, value in obj.items()
                for f in unknown_fields(value, schema["additionalProperties"], f"{path}.{key}")]
    if isinstance(obj, list) and "items" in schema:
        return [f for i, value in enumerate(obj) for f in unknown_fields(value, schema["items"], f"{path}[{i}]")]
    return []


def prune(obj: Any, schema: dict, top: bool = True) -> Any:
    """Drop undeclared fields, as the server does for a custom resource without Strict."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return obj
    if isinstance(obj, dict) and "properties" in schema:
        keep = set(schema["properties"]) | ({"apiVersion", "kind", "metadata"} if top else set())
        return {k: (_prune_meta(v) if top and k == "metadata" else
                    prune(v, schema["properties"].get(k, {}), False)) for k, v in obj.items() if k in keep}
    if isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: prune(v, schema["additionalProperties"], False) for k, v in obj.items()}
    if isinstance(obj, list) and "items" in schema:
        return [prune(v, schema["items"], False) for v in obj]
    return obj


def _prune_meta(meta: Any) -> Any:
    return {k: v for k, v in meta.items() if k in OBJECT_META} if isinstance(meta, dict) else meta


def apply_defaults(obj: Any, schema: dict) -> Any:
    """Fill in the schema's `default`s for absent fields of present objects (structural
    defaulting: a default inside an absent object is not applied)."""
    if isinstance(obj, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj and key != "metadata":
                apply_defaults(obj[key], sub)
    elif isinstance(obj, list) and "items" in schema:
        for value in obj:
            apply_defaults(value, schema["items"])
    return obj
