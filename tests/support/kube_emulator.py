"""A Kubernetes API server for tests: kmock's KubernetesEmulator with the gaps fixed.

kmock 0.8 gives us real HTTP, request parsing and discovery; its object store answers 200 on
create, never fills in uid/resourceVersion/namespace, never bumps resourceVersion, ignores
`resourceVersion` on watch, and knows no server-side apply. The official client (and our code)
relies on all of those, so this subclass keeps one versioned store of its own and serves the
object endpoints from it:

- create (201), get, list (with `kind`, `metadata.resourceVersion`, label/field selectors),
  JSON merge patch, server-side apply (create or merge; no-op applies do not bump
  resourceVersion), delete, `dryRun=All`, namespaces must exist for namespaced writes;
- watch from a resourceVersion, with `timeoutSeconds`, and 410 Gone after `compact()`;
- discovery: `/api/v1` says `groupVersion: v1`; `/api/v1/namespaces[/NAME]` parses;
- pod logs (`.../pods/NAME/log`, `follow`);
- faults: a status code (with Retry-After), a connection reset, a watch stream dropped after N
  events, a watch ERROR event, a hang (no answer for N seconds), a 200 with an HTML page (an
  auth proxy) or a truncated JSON body, each optionally only for dry-run or only for real
  requests; 403 for a verb on a resource; and a request log for counting;
- `metadata.generateName` on create, and finalizers: a delete of an object with finalizers only
  sets `deletionTimestamp`;
- where it once differed from a real kube-apiserver 1.34 (measured with
  `python -m tests.support.api_parity`; the rules live in `kube_semantics`): set-based label and
  checked field selectors, name validation (422), generation only on kinds that have one,
  managedFields, CRD unknown fields (Strict: 400, apply: 500, else pruned) and defaults, YAML
  apply bodies, status-only writes through `/status`, list items of built-in kinds without kind,
  the server's 403/404/409 shapes (a `metadata.uid` in a merge patch is 422 immutable, not a
  precondition), Foreground/Orphan/Namespace delete answers, bookmarks, subresource discovery.

The server runs in a thread with its own event loop (`running_emulator`), because the client is
blocking; tests and the fake operator mutate the store from their own thread through the
thread-safe methods below.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import parsing

from tests.support import kube_semantics as sem

# --- kmock fix: `/api/v1/namespaces[/NAME]` is the Namespace kind, not a namespace prefix ----

_original_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (3, 4):
        return parsing.ParsedPath(group="", version="v1", plural="namespaces",
                                  name=parts[3] if len(parts) == 4 else None)
    return _original_parse_path(path)


parsing.parse_path = _parse_path

RAYJOBS = "ray.io/v1/rayjobs"
RAYCLUSTERS = "ray.io/v1/rayclusters"
CRD_VERBS = {"get", "list", "watch", "create", "patch", "update", "delete", "deletecollection"}
#: Discovery of subresources as a real server lists them: (kind, verbs); kmock copies the
#: parent's kind and verbs onto every subresource.
SUBRESOURCES: dict[str, tuple[str | None, list[str]]] = {
    "status": (None, ["get", "patch", "update"]), "log": (None, ["get"]),
    "finalize": (None, ["update"]), "ephemeralcontainers": (None, ["get", "patch", "update"]),
    "resize": (None, ["get", "patch", "update"]), "scale": ("Scale", ["get", "patch", "update"]),
    "attach": ("PodAttachOptions", ["create", "get"]), "exec": ("PodExecOptions", ["create", "get"]),
    "portforward": ("PodPortForwardOptions", ["create", "get"]),
    "proxy": ("PodProxyOptions", ["create", "delete", "get", "patch", "update"]),
    "binding": ("Binding", ["create"]), "eviction": ("Eviction", ["create"]),
    "token": ("TokenRequest", ["create"]),
}


@dataclass
class Route:
    """An object endpoint: /api/v1/... or /apis/GROUP/VERSION/... (parsed by us, not kmock)."""

    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None

    @property
    def gvr(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}" if self.group else f"v1/{self.plural}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


def parse_route(path: str) -> Route | None:
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), "/".join(rest[2:]) or None
    return Route(group, version, plural, namespace, name, sub)


@dataclass
class Fault:
    """One injected failure for requests whose method and path match."""

    method: str
    path: re.Pattern[str]
    status: int | None = None         # answer this status (with a Status body)
    reset: bool = False               # or close the connection without an answer
    drop_after: int | None = None     # or (watch) drop the stream after this many events
    retry_after: str | None = None
    times: int = 1
    hits: int = 0
    hang: float | None = None         # or hold the request this many seconds first (a hung server)
    html: bool = False                # or answer 200 with an HTML login page (an auth proxy)
    truncated: bool = False           # or answer 200 with half a JSON body
    watch_error: int | None = None    # or (watch) send an ERROR event with this code, then end
    dry_run: bool | None = None       # only requests with (True) / without (False) dryRun=All

    def matches(self, method: str, path: str, params: dict | None = None) -> bool:
        if self.dry_run is not None and ((params or {}).get("dryRun") == "All") is not self.dry_run:
            return False
        return self.hits < self.times and method == self.method and bool(self.path.search(path))

    @property
    def streaming(self) -> bool:
        """Faults the watch handler plays (mid-stream), not the request handler."""
        return self.drop_after is not None or self.watch_error is not None


@attrs.define(kw_only=True)
class ApiEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator with a versioned store, watches from a resourceVersion and faults."""

    store: dict[tuple[str, str | None, str], dict] = attrs.field(factory=dict, init=False)
    history: list[tuple[int, str, str, dict]] = attrs.field(factory=list, init=False)
    rv: int = attrs.field(default=100, init=False)
    compacted: int = attrs.field(default=0, init=False)
    faults: list[Fault] = attrs.field(factory=list, init=False)
    denied: set[tuple[str, str]] = attrs.field(factory=set, init=False)
    validators: dict[str, Any] = attrs.field(factory=dict, init=False)
    #: As for a user without the `bind`/`escalate` verbs (a namespace admin): creating a
    #: RoleBinding resolves its Role, so it answers 404 while the Role does not exist yet.
    role_refs_checked: bool = attrs.field(default=True, init=False)
    pod_logs: dict[tuple[str, str], list[str]] = attrs.field(factory=dict, init=False)
    log: list[tuple[str, str, dict]] = attrs.field(factory=list, init=False)
    loop: asyncio.AbstractEventLoop | None = attrs.field(default=None, init=False)
    _tlock: threading.RLock = attrs.field(factory=threading.RLock, init=False)
    _changed: asyncio.Event | None = attrs.field(default=None, init=False)

    # --- declaring kinds -------------------------------------------------------------------
    def install_rayjob_crd(self) -> None:
        self.resources[RAYJOBS] = kmock.ResourceInfo(
            kind="RayJob", singular="rayjob", namespaced=True, subresources={"status"},
            verbs=CRD_VERBS)
        # KubeRay installs its CRDs together: the RayCluster a RayJob runs on comes with it.
        self.resources[RAYCLUSTERS] = kmock.ResourceInfo(
            kind="RayCluster", singular="raycluster", namespaced=True, subresources={"status"},
            verbs=CRD_VERBS)

    def uninstall_rayjob_crd(self) -> None:
        del self.resources[RAYJOBS]

    def _info(self, route: Route) -> Any | None:
        for res in self.resources:
            if (res.group, res.version, res.plural) == (route.group, route.version, route.plural):
                return self.resources[res]
        return None

    # --- thread-safe store API for tests and the fake operator ----------------------------
    def put(self, api_version: str, plural: str, obj: dict) -> dict:
        """Create or replace an object as the cluster would (used for fixtures)."""
        route = Route(*(api_version.split("/") if "/" in api_version else ("", api_version)),
                      plural, obj["metadata"].get("namespace"), obj["metadata"]["name"], None)
        with self._tlock:
            key = (route.gvr, route.namespace, route.name)
            if key in self.store:
                merged = copy.deepcopy(obj)
                merged["metadata"] = {**self.store[key]["metadata"], **obj["metadata"]}
                return self._commit("MODIFIED", route.gvr, key, merged)
            return self._commit("ADDED", route.gvr, key, self._new(obj, route))

    def get(self, gvr: str, namespace: str | None, name: str) -> dict | None:
        with self._tlock:
            obj = self.store.get((gvr, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def patch_status(self, gvr: str, namespace: str, name: str, status: dict) -> dict:
        return self.merge(gvr, namespace, name, {"status": status})

    def merge(self, gvr: str, namespace: str | None, name: str, patch: dict) -> dict:
        with self._tlock:
            key = (gvr, namespace, name)
            obj = merge_patch(copy.deepcopy(self.store[key]), patch)
            return self._commit("MODIFIED", gvr, key, obj)

    def remove(self, gvr: str, namespace: str | None, name: str) -> None:
        with self._tlock:
            key = (gvr, namespace, name)
            obj = self.store.pop(key)
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.history.append((self.rv, gvr, "DELETED", copy.deepcopy(obj)))
        self._wake()

    def compact(self) -> None:
        """Forget history up to now: watches from an older resourceVersion get 410 Gone."""
        with self._tlock:
            self.compacted = self.rv
            self.history = []

    def fail(self, method: str, path: str, *, status: int | None = None, reset: bool = False,
             drop_after: int | None = None, retry_after: str | None = None, times: int = 1,
             hang: float | None = None, html: bool = False, truncated: bool = False,
             watch_error: int | None = None, dry_run: bool | None = None) -> Fault:
        fault = Fault(method.upper(), re.compile(path), status, reset, drop_after, retry_after, times,
                      hang=hang, html=html, truncated=truncated, watch_error=watch_error, dry_run=dry_run)
        self.faults.append(fault)
        return fault

    def deny(self, verb: str, plural: str) -> None:
        self.denied.add((verb, plural))

    def validate(self, plural: str, errors: Any) -> None:
        """Validate created/applied objects of `plural` with `errors(obj) -> [problem, ...]`
        (e.g. the KubeRay CRD schema): the first problem is a 422 Invalid, dry runs included."""
        self.validators[plural] = errors

    def requests_since(self, mark: int) -> list[tuple[str, str, dict]]:
        return self.log[mark:]

    # --- internals -------------------------------------------------------------------------
    def _new(self, obj: dict, route: Route) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        if sem.has_generation(route.group, route.plural):
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if route.namespace is not None:
            meta["namespace"] = route.namespace
        if route.gvr == "v1/namespaces":  # what the Namespace strategy fills in
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj.setdefault("status", {}).setdefault("phase", "Active")
        info = self._info(route)
        obj.setdefault("apiVersion", route.api_version)
        if info is not None and info.kind:
            obj.setdefault("kind", info.kind)
        return obj

    def _commit(self, etype: str, gvr: str, key: tuple, obj: dict) -> dict:
        with self._tlock:
            old = self.store.get(key)
            if old is not None and "generation" in old["metadata"] and old.get("spec") != obj.get("spec"):
                obj["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.store[key] = obj
            self.history.append((self.rv, gvr, etype, copy.deepcopy(obj)))
        self._wake()
        return copy.deepcopy(obj)

    def _wake(self) -> None:
        if self.loop is not None and self._changed is not None:
            self.loop.call_soon_threadsafe(self._notify)

    def _notify(self) -> None:
        assert self._changed is not None
        self._changed.set()
        self._changed = asyncio.Event()

    async def _serve_version(self, request: Any) -> Any:  # kmock says "/v1" for the core group
        payload = await super()._serve_version(request)
        payload["groupVersion"] = payload["groupVersion"].lstrip("/")
        for resource in payload.get("resources", []):
            _, _, sub = resource.get("name", "").partition("/")
            if sub in SUBRESOURCES:
                kind, verbs = SUBRESOURCES[sub]
                resource["verbs"] = list(verbs)
                resource["kind"] = kind or resource.get("kind")
        return payload

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        if self._changed is None:
            self.loop, self._changed = asyncio.get_running_loop(), asyncio.Event()
        params = dict(raw.query)
        self.log.append((raw.method, raw.path, params))
        for fault in self.faults:
            if fault.matches(raw.method, raw.path, params) and not fault.streaming:
                fault.hits += 1
                if fault.hang is not None:
                    await asyncio.sleep(fault.hang)
                    if fault.status is None:
                        break  # a slow server: then answer normally
                if fault.html:
                    return aiohttp.web.Response(
                        status=200, content_type="text/html",
                        text="<!DOCTYPE html><html><head><title>Sign in</title></head><body>"
                             "<form action='/oauth2/start'>Sign in with SSO</form></body></html>")
                if fault.truncated:
                    return aiohttp.web.Response(status=200, content_type="application/json",
                                                text='{"kind": "RayJob", "apiVersion": "ray.io/v1", "meta')
                if fault.reset:
                    assert raw.transport is not None
                    raw.transport.abort()
                    return aiohttp.web.Response(status=500)
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                return _status(fault.status or 500, "InternalError", "injected fault", headers=headers)
        route = parse_route(raw.path)
        if route is None:
            return await super()._handle(request)  # discovery
        info = self._info(route)
        if info is None:  # a resource the server does not serve: a plain-text page, not a Status
            return aiohttp.web.Response(status=404, text="404 page not found\n", content_type="text/plain")
        if route.subresource not in (None, "log") and route.subresource not in (info.subresources or ()):
            return _status(404, "NotFound", "the server could not find the requested resource")
        verb = _verb(raw.method, route, params)
        if (verb, route.plural) in self.denied:
            return _forbidden(route, verb, "test")
        if route.subresource == "log":
            return await self._serve_log(raw, route, params)
        try:
            selectors = _selectors(route, params)
        except sem.SelectorError as e:
            return _status(400, "BadRequest", str(e))
        if verb == "watch":
            return await self._watch(raw, route, params, selectors)
        body = request.data
        if body is None and request.text and "yaml" in raw.content_type:
            try:  # an apply body in YAML (kubectl and most clients send JSON, which is YAML too)
                body = yaml.safe_load(request.text)
            except yaml.YAMLError as e:
                return _status(400, "BadRequest", f"error decoding YAML: {str(e).splitlines()[0]}")
        manager = params.get("fieldManager") or raw.headers.get("User-Agent", "unknown").split("/")[0]
        with self._tlock:
            return self._serve_object(raw.method, route, params, body, raw.content_type, info,
                                      selectors=selectors, manager=manager)

    def _serve_object(self, method: str, route: Route, params: dict, body: Any, ctype: str,
                      info: Any, *, selectors: tuple[list, list] = ([], []),
                      manager: str = "unknown") -> aiohttp.web.Response:
        dry = params.get("dryRun") == "All"
        if method == "GET" and route.name is None:
            return self._list(route, info, selectors)
        if method == "POST":
            meta = (body or {}).get("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            route.name = meta.get("name")
        key = (route.gvr, route.namespace, route.name)
        existing = self.store.get(key)
        if route.namespace is not None and method in ("POST", "PATCH") and \
                ("v1/namespaces", None, route.namespace) not in self.store:
            return _status(404, "NotFound", f'namespaces "{route.namespace}" not found',
                           {"name": route.namespace, "kind": "namespaces"})
        if method == "GET":
            return _not_found(route) if existing is None else aiohttp.web.json_response(existing)
        if method == "DELETE":
            return self._delete(route, key, existing, body or {}, dry)
        if method == "POST":
            return self._create(route, key, existing, body, params, manager, dry)
        if method == "PATCH":
            return self._patch(route, key, existing, body, ctype, params, manager, dry)
        return _status(405, "MethodNotAllowed", f"{method} is not supported here")

    def _list(self, route: Route, info: Any, selectors: tuple[list, list]) -> aiohttp.web.Response:
        """A list; items of built-in kinds carry no kind/apiVersion (custom resources' do)."""
        custom = sem.is_custom(route.group)
        items = []
        for (gvr, ns, _), obj in sorted(self.store.items()):
            if gvr == route.gvr and route.namespace in (None, ns) and sem.selected(obj, *selectors):
                item = copy.deepcopy(obj)
                if not custom:
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                items.append(item)
        return aiohttp.web.json_response({
            "apiVersion": route.api_version, "kind": f"{info.kind}List",
            "metadata": {"resourceVersion": str(self.rv)}, "items": items})

    def _create(self, route: Route, key: tuple, existing: dict | None, body: Any, params: dict,
                manager: str, dry: bool) -> aiohttp.web.Response:
        if existing is not None:
            return _status(409, "AlreadyExists", f'{route.plural} "{route.name}" already exists',
                           {"name": route.name, "kind": route.plural})
        decoded = self._decode(route, body, params)
        if isinstance(decoded, aiohttp.web.Response):
            return decoded
        obj = self._new(decoded, route)
        invalid = self._invalid(route, obj)
        if invalid is not None:
            return invalid
        self._manage(route, obj, manager, "Update")
        return aiohttp.web.json_response(obj if dry else self._commit("ADDED", route.gvr, key, obj), status=201)

    def _decode(self, route: Route, body: Any, params: dict, *, apply: bool = False) -> Any:
        """A custom resource's unknown fields, as the server's structural schema treats them:
        Strict refuses them (create: 400; apply: the 500 a real server answers), otherwise they
        are pruned; the schema's defaults are filled in."""
        schema = sem.crd_schema(route.plural, route.group, route.version) if sem.is_custom(route.group) else None
        if schema is None or not isinstance(body, dict):
            return body
        unknown = sem.unknown_fields(body, schema)
        if unknown and apply:
            return _status(500, "", f"failed to create typed patch object ({route.namespace}/{route.name}; "
                           f"{route.api_version}, Kind={self._info(route).kind}): .{unknown[0]}: field not "
                           "declared in schema", reason_field=False)
        if unknown and params.get("fieldValidation") == "Strict":
            kind = self._info(route).kind
            fields = ", ".join(f'unknown field "{f}"' for f in unknown)
            return _status(400, "BadRequest", f'{kind} in version "{route.version}" cannot be handled as a '
                           f"{kind}: strict decoding error: {fields}")
        return sem.apply_defaults(sem.prune(copy.deepcopy(body), schema), schema)

    def _defaulted(self, route: Route, obj: dict) -> dict:
        """A custom resource as the server decodes it: the schema's defaults filled in (a status
        written later gets its defaults too)."""
        schema = sem.crd_schema(route.plural, route.group, route.version) if sem.is_custom(route.group) else None
        return obj if schema is None else sem.apply_defaults(obj, schema)

    def _manage(self, route: Route, obj: dict, manager: str, operation: str) -> None:
        sem.record_manager(obj, sem.managed_entry(manager, operation, route.api_version, route.subresource))

    def _delete(self, route: Route, key: tuple, existing: dict | None, options: dict,
                dry: bool) -> aiohttp.web.Response:
        """A delete answers Status when the object is gone at once, the object itself while it
        is only marked (finalizers, or the Foreground/Orphan finalizer the GC then clears)."""
        if existing is None:
            return _not_found(route)
        uid = existing["metadata"]["uid"]
        precondition = (options.get("preconditions") or {}).get("uid")
        if precondition and precondition != uid:
            return _status(409, "Conflict", f'Operation cannot be fulfilled on {self._info(route).kind} '
                           f'"{route.name}": the UID in the precondition ({precondition}) does not match the '
                           f"UID in record ({uid}). The object might have been deleted and then recreated",
                           {"name": route.name, "kind": route.plural})
        if route.gvr == "v1/namespaces":
            return self._delete_namespace(route, key, existing, dry)
        policy = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}.get(options.get("propagationPolicy", ""))
        if existing["metadata"].get("finalizers") or policy:
            marked = copy.deepcopy(existing)
            marked["metadata"].setdefault("deletionTimestamp", _now())
            if policy and policy not in marked["metadata"].get("finalizers", []):
                marked["metadata"]["finalizers"] = marked["metadata"].get("finalizers", []) + [policy]
            if dry:
                return aiohttp.web.json_response(marked)
            if marked != existing:
                marked = self._commit("MODIFIED", route.gvr, key, marked)
            if marked["metadata"]["finalizers"] == [policy]:  # no dependents here: the GC finishes
                self.remove(route.gvr, route.namespace, route.name)
            return aiohttp.web.json_response(marked)
        if not dry:
            self.remove(route.gvr, route.namespace, route.name)
        details = {"name": route.name, "group": route.group, "kind": route.plural, "uid": uid}
        return aiohttp.web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                          "details": {k: v for k, v in details.items() if v}})

    def _delete_namespace(self, route: Route, key: tuple, existing: dict, dry: bool) -> aiohttp.web.Response:
        """The answer is the Namespace, Terminating; the namespace controller (instant here)
        then deletes what it holds and the Namespace itself."""
        marked = copy.deepcopy(existing)
        marked["metadata"].setdefault("deletionTimestamp", _now())
        marked.setdefault("status", {})["phase"] = "Terminating"
        if dry:
            return aiohttp.web.json_response(marked)
        marked = self._commit("MODIFIED", route.gvr, key, marked)
        for gvr, ns, name in [k for k in self.store if k[1] == route.name]:
            self.remove(gvr, ns, name)
        self.remove(route.gvr, None, route.name)
        return aiohttp.web.json_response(marked)

    def _patch(self, route: Route, key: tuple, existing: dict | None, body: Any, ctype: str,
               params: dict, manager: str, dry: bool) -> aiohttp.web.Response:
        if "apply-patch" in ctype:
            decoded = self._decode(route, body, params, apply=True)
            if isinstance(decoded, aiohttp.web.Response):
                return decoded
            if existing is None:
                if route.subresource is not None:
                    return _not_found(route)
                obj = self._new(decoded, route)
                invalid = self._invalid(route, obj)
                if invalid is not None:
                    return invalid
                self._manage(route, obj, manager, "Apply")
                return aiohttp.web.json_response(
                    obj if dry else self._commit("ADDED", route.gvr, key, obj), status=201)
            merged = apply_merge(copy.deepcopy(existing), self._only_status(route, decoded))
            invalid = self._invalid(route, merged)
            if invalid is not None:
                return invalid
            operation = "Apply"
        elif "merge-patch" in ctype:
            if existing is None:
                return _not_found(route)
            precondition = ((body or {}).get("metadata") or {}).get("uid")
            if precondition and precondition != existing["metadata"]["uid"]:
                return self._immutable_uid(route, precondition)
            unknown = self._unknown_in_patch(route, existing, body, params)
            if unknown is not None:
                return unknown
            merged = merge_patch(copy.deepcopy(existing), self._only_status(route, body))
            operation = "Update"
        else:
            return _status(415, "UnsupportedMediaType", f"unsupported patch type {ctype}")
        merged = self._defaulted(route, merged)
        if merged == existing:
            return aiohttp.web.json_response(merged)  # a no-op writes nothing: no new resourceVersion
        self._manage(route, merged, manager, operation)
        if dry:
            return aiohttp.web.json_response(merged)
        return aiohttp.web.json_response(self._commit("MODIFIED", route.gvr, key, merged))

    def _only_status(self, route: Route, body: Any) -> Any:
        """Through the status subresource only `status` changes (metadata and spec are ignored)."""
        if route.subresource != "status" or not isinstance(body, dict):
            return body
        return {"status": body.get("status")}

    def _immutable_uid(self, route: Route, uid: str) -> aiohttp.web.Response:
        """A patch that names another uid: the real server refuses the change of an immutable
        field (422), it does not treat the uid as a precondition (that is DELETE's)."""
        kind = self._info(route).kind
        what = f"{kind}.{route.group}" if route.group else kind
        return _status(422, "Invalid", f'{what} "{route.name}" is invalid: metadata.uid: Invalid value: '
                       f'"{uid}": field is immutable',
                       _details(name=route.name, group=route.group, kind=kind,
                                causes=[{"reason": "FieldValueInvalid", "field": "metadata.uid"}]))

    def _unknown_in_patch(self, route: Route, existing: dict, body: Any, params: dict) -> aiohttp.web.Response | None:
        """A merge patch that adds an undeclared field under Strict: 422, as the server says it."""
        if params.get("fieldValidation") != "Strict":
            return None
        decoded = self._decode(route, merge_patch(copy.deepcopy(existing), body), params)
        if not isinstance(decoded, aiohttp.web.Response):
            return None
        message = json.loads(decoded.text)["message"].split("strict decoding error: ", 1)[-1]
        return _status(422, "Invalid", f' "" is invalid: patch: Invalid value: "{json.dumps(body)}": '
                       f"strict decoding error: {message}", {"causes": [{"reason": "FieldValueInvalid"}]})

    def _invalid(self, route: Route, obj: dict) -> aiohttp.web.Response | None:
        bad_name = sem.invalid_name(obj.get("metadata", {}).get("name"), route.plural)
        if bad_name is not None:
            return self._unprocessable(route, bad_name)
        ref = obj.get("roleRef") or {}
        if route.plural == "rolebindings" and self.role_refs_checked and ref.get("kind") == "Role" and \
                ("rbac.authorization.k8s.io/v1/roles", route.namespace, ref.get("name")) not in self.store:
            return _status(404, "NotFound", f'roles.rbac.authorization.k8s.io "{ref.get("name")}" not found',
                           {"name": ref.get("name"), "group": "rbac.authorization.k8s.io", "kind": "roles"})
        check = self.validators.get(route.plural)
        problems = check(obj) if check else []
        if not problems:
            return None
        return self._unprocessable(route, problems[0])

    def _unprocessable(self, route: Route, problem: str) -> aiohttp.web.Response:
        """422 Invalid, in the server's words: `Kind.group "name" is invalid: problem`."""
        info = self._info(route)
        kind = f"{info.kind}.{route.group}" if route.group else info.kind
        return _status(422, "Invalid", f'{kind} "{route.name}" is invalid: {problem}',
                       _details(name=route.name, group=route.group, kind=info.kind,
                                causes=[{"reason": "FieldValueInvalid", "message": problem}]))

    async def _watch(self, raw: Any, route: Route, params: dict,
                     selectors: tuple[list, list] = ([], [])) -> aiohttp.web.StreamResponse:
        drop = next((f for f in self.faults
                     if f.matches(raw.method, raw.path) and f.drop_after is not None), None)
        if drop is not None:
            drop.hits += 1
        error = next((f for f in self.faults
                      if f.matches(raw.method, raw.path) and f.watch_error is not None), None)
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        if error is not None:
            error.hits += 1
            await response.write(json.dumps({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": error.watch_error,
                "reason": "InternalError", "message": "etcdserver: request timed out"}}).encode() + b"\n")
            await response.write_eof()
            return response
        loop = asyncio.get_running_loop()
        timeout = float(params.get("timeoutSeconds", 1800))
        deadline = loop.time() + timeout
        since = params.get("resourceVersion")
        sent = 0
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        next_bookmark = _next_bookmark(loop.time(), deadline)

        async def send(event: dict) -> bool:
            nonlocal sent
            if drop is not None and sent >= drop.drop_after:
                assert raw.transport is not None
                raw.transport.abort()  # a dropped stream: no chunk terminator, no goodbye
                return False
            await response.write(json.dumps(event).encode() + b"\n")
            sent += 1
            return True

        with self._tlock:
            if since not in (None, "", "0") and int(since) < self.compacted:
                await response.write(json.dumps({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                    "reason": "Expired", "message": f"too old resource version: {since} ({self.rv})"}}).encode() + b"\n")
                await response.write_eof()
                return response
            if since in (None, "", "0"):
                initial = [{"type": "ADDED", "object": copy.deepcopy(o)}
                           for (gvr, ns, _), o in sorted(self.store.items())
                           if gvr == route.gvr and route.namespace in (None, ns) and sem.selected(o, *selectors)]
                cursor = self.rv
            else:
                initial, cursor = [], int(since)
        for event in initial:
            if not await send(event):
                return response
        while True:
            changed = self._changed
            assert changed is not None
            with self._tlock:
                pending = [(rv, etype, obj) for rv, gvr, etype, obj in self.history
                           if rv > cursor and gvr == route.gvr
                           and route.namespace in (None, obj["metadata"].get("namespace"))
                           and sem.selected(obj, *selectors)]
                cursor = max([cursor] + [rv for rv, _, _, _ in self.history])
            for _, etype, obj in pending:
                if not await send({"type": etype, "object": obj}):
                    return response
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if bookmarks and loop.time() >= next_bookmark:
                if not await send(self._bookmark(route, cursor)):
                    return response
                next_bookmark = _next_bookmark(loop.time(), deadline)
                continue
            wake = min(remaining, next_bookmark - loop.time()) if bookmarks else remaining
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), max(wake, 0))
        await response.write_eof()
        return response

    def _bookmark(self, route: Route, cursor: int) -> dict:
        """What a real server sends with allowWatchBookmarks: only the kind and a resourceVersion
        to resume from (every minute, and 2 s before the watch's timeout)."""
        info = self._info(route)
        return {"type": "BOOKMARK", "object": {"kind": info.kind if info else None,
                                               "apiVersion": route.api_version,
                                               "metadata": {"resourceVersion": str(cursor), "annotations": {}}}}

    async def _serve_log(self, raw: Any, route: Route, params: dict) -> aiohttp.web.StreamResponse:
        lines = self.pod_logs.get((route.namespace or "", route.name or ""))
        if lines is None:
            return _not_found(route)
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(raw)
        for line in lines:
            await response.write(line.encode() + b"\n")
        await response.write_eof()
        return response


# --- patch semantics ------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


def apply_merge(live: dict, applied: dict) -> dict:
    """The server-side-apply subset we rely on: the applied maps merge into the live object,
    lists and scalars replace; metadata the server owns is kept."""
    server_meta = {k: v for k, v in live.get("metadata", {}).items()
                   if k in ("uid", "resourceVersion", "creationTimestamp", "generation", "namespace")}
    merged = merge_patch(live, {k: v for k, v in applied.items() if v is not None})
    merged["metadata"].update(server_meta)
    return merged


# --- helpers --------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _verb(method: str, route: Route, params: dict) -> str:
    if method == "GET":
        return "watch" if params.get("watch") in ("true", "1") else ("get" if route.name else "list")
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())


def _status(code: int, reason: str, message: str, details: dict | None = None, *,
            headers: dict | None = None, reason_field: bool = True) -> aiohttp.web.Response:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "details": details or {}, "code": code}
    if not reason_field:  # a real server's 500 from inside apply carries neither
        del body["reason"], body["details"]
    return aiohttp.web.json_response(body, status=code, headers=headers)


def _details(**fields: Any) -> dict:
    """A Status's details as the server writes them: empty fields (the core group) left out."""
    return {k: v for k, v in fields.items() if v}


def _not_found(route: Route) -> aiohttp.web.Response:
    what = f"{route.plural}.{route.group}" if route.group else route.plural
    return _status(404, "NotFound", f'{what} "{route.name}" not found',
                   _details(name=route.name, group=route.group, kind=route.plural))


def _forbidden(route: Route, verb: str, user: str) -> aiohttp.web.Response:
    """RBAC's 403, in the server's words (the object's name and the namespace when there are)."""
    what = f'{route.plural} "{route.name}" is' if route.name else f"{route.plural} is"
    where = f' in the namespace "{route.namespace}"' if route.namespace else ""
    return _status(403, "Forbidden", f'{what} forbidden: User "{user}" cannot {verb} resource '
                   f'"{route.plural}" in API group "{route.group}"{where}',
                   _details(name=route.name, group=route.group, kind=route.plural))


def _selectors(route: Route, params: dict) -> tuple[list, list]:
    """The request's label and field selectors as predicates (SelectorError: the server's 400)."""
    return (sem.label_matcher(params.get("labelSelector", "")),
            sem.field_matcher(params.get("fieldSelector", ""), route.plural, sem.is_custom(route.group)))


def _next_bookmark(now: float, deadline: float) -> float:
    """A real server bookmarks every minute and once 2 s before the watch's deadline."""
    before_end = deadline - 2.0
    return min(now + 60.0, before_end) if before_end > now else now + 60.0


# --- running it -----------------------------------------------------------------------------

@dataclass
class Running:
    emulator: ApiEmulator
    url: str
    _loop: asyncio.AbstractEventLoop = field(repr=False)

    def kubeconfig(self, path: Any, namespace: str = "default") -> str:
        """Write a kubeconfig for this server (context `emulator`) and return its path."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "test-token"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester",
                                                          "namespace": namespace}}],
        }))
        return str(path)


@contextlib.contextmanager
def running_emulator(*, crd: bool = True, namespaces: tuple[str, ...] = ("default",),
                     emulator: ApiEmulator | None = None) -> Iterator[Running]:
    """Serve an ApiEmulator (or the subclass instance given) on 127.0.0.1 from a thread with its
    own event loop."""
    emulator = emulator if emulator is not None else ApiEmulator()
    emulator.resources.load_bundled()
    if crd:
        emulator.install_rayjob_crd()
    for ns in namespaces:
        emulator.put("v1", "namespaces", {"metadata": {"name": ns}})
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop: asyncio.Future | None = None
    holder: dict[str, Any] = {}

    async def serve() -> None:
        nonlocal stop
        stop = loop.create_future()
        async with emulator, kmock.Server(emulator, host="127.0.0.1") as server:
            emulator.loop, emulator._changed = loop, asyncio.Event()
            holder["url"] = f"http://127.0.0.1:{server.port}"
            ready.set()
            await stop

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the API emulator did not start")
    try:
        yield Running(emulator, holder["url"], loop)
    finally:
        loop.call_soon_threadsafe(lambda: stop.done() or stop.set_result(None))
        thread.join(10)
