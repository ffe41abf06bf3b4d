"""The one module that talks to the Kubernetes API, and the only one that imports `kubernetes`.

Why a thin generic layer over `ApiClient` instead of the typed `CoreV1Api`/`CustomObjectsApi`
methods: we handle six kinds the same way (server-side apply, get, delete, watch), and the typed
patch methods return `None` when an apply creates the object (201 is not in their response
map). The official client still does the work that matters: kubeconfig/in-cluster loading,
auth, TLS, URL building, and retries.

Retries and deadlines: transient failures (429, 5xx, connection resets) are retried by
`Kube.request` itself with exponential backoff and `Retry-After` honoured, inside one deadline
per command (`--request-timeout`, 30 s): every attempt's timeouts are cut to what is left, so a
hung API server costs at most that long (urllib3's own `Retry` would multiply a 60 s read
timeout by six). GET/DELETE and our PATCHes are idempotent; a POST sent twice answers 409,
which every caller of `create` resolves by reading the object back and checking it is ours.
Every `ApiException` becomes one of the project's errors (`raise ... from e`); a 200 with a
body that is not JSON (an auth proxy's HTML page) becomes `BadResponse`, one line.

`kubernetes` is imported inside functions only: `submitter --help` must not pay for it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import quote

from submitter.contract.errors import (
    ApiDeadline, ApiUnavailable, BadResponse, ClusterError, Conflict, CrdMissing, Forbidden, NotFound,
    UNOBSERVABLE, Unauthorized, UsageError,
)

FIELD_MANAGER = "submitter"
RETRY_STATUSES = (429, 500, 502, 503, 504)
#: The default deadline of a command's API work (`--request-timeout`): a hung or unreachable
#: API costs at most this long. kubectl's flag of the same name bounds one request; ours bounds
#: the request with all its retries.
REQUEST_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0
#: Watches end server-side after this long (the client then reconnects from its resourceVersion).
WATCH_SECONDS = 300
#: The first KubeRay whose RayJob CRD has `rayClusterSpec.authOptions` (Ray token auth).
KUBERAY_AUTH_VERSION = "1.5.1"
KUBERAY_INSTALL = ("install the KubeRay operator first: helm repo add kuberay "
                   "https://ray-project.github.io/kuberay-helm/ && helm install kuberay-operator "
                   "kuberay/kuberay-operator --version 1.7.0")


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """How RBAC names it: `rayjobs.ray.io`, `configmaps`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [root]
        if self.namespaced and namespace is not None:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name is not None:
            parts.append(quote(name, safe=""))
        if sub is not None:
            parts.append(sub)
        return "/".join(parts)


KINDS: dict[str, Kind] = {
    "RayJob": Kind("ray.io", "v1", "rayjobs"),
    "ConfigMap": Kind("", "v1", "configmaps"),
    "PersistentVolumeClaim": Kind("", "v1", "persistentvolumeclaims"),
    "ServiceAccount": Kind("", "v1", "serviceaccounts"),
    "Role": Kind("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": Kind("rbac.authorization.k8s.io", "v1", "rolebindings"),
    "NetworkPolicy": Kind("networking.k8s.io", "v1", "networkpolicies"),
    "Pod": Kind("", "v1", "pods"),
    "Secret": Kind("", "v1", "secrets"),
    "Namespace": Kind("", "v1", "namespaces", namespaced=False),
    "RayCluster": Kind("ray.io", "v1", "rayclusters"),
    "Event": Kind("", "v1", "events"),
    "CustomResourceDefinition": Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                                     namespaced=False),
    # Kueue's unit of admission; `stop`/`resume` of a queued job flip its `spec.active`
    "Workload": Kind("kueue.x-k8s.io", "v1beta1", "workloads"),
}
#: Writes ask the API server to refuse fields it does not know (HTTP 400) instead of dropping
#: them without a word: an older CRD (KubeRay < 1.5.1 has no `authOptions`) would otherwise
#: turn token auth off silently. Supported since Kubernetes 1.25 (GA 1.27).
FIELD_VALIDATION = "Strict"


class Expired(ClusterError):
    """HTTP 410 Gone: the resourceVersion a watch started from is too old; relist."""


class StreamDropped(ClusterError):
    """A watch or log stream ended without a clean close (connection reset, proxy timeout):
    the job could not be observed (exit 4), which says nothing of its outcome."""

    exit_code = UNOBSERVABLE


class _Retry(Exception):
    """Internal: an attempt failed in a way another attempt may fix (429, 5xx, connection)."""

    def __init__(self, error: ClusterError, after: float | None) -> None:
        super().__init__(str(error))
        self.error, self.after = error, after


class Kube:
    """A lazily built API client plus the handful of operations the project needs."""

    def __init__(self, *, context: str | None = None, kubeconfig: str | None = None,
                 api_client: Any = None, request_timeout: float | None = None) -> None:
        self._context, self._kubeconfig, self._api = context, kubeconfig, api_client
        #: Seconds this command's API work may take while the API does not answer (see `request`).
        self.request_timeout = request_timeout if request_timeout is not None else \
            float(os.environ.get("SUBMITTER_REQUEST_TIMEOUT", REQUEST_TIMEOUT))
        self._deadline: float | None = None

    # --- the client --------------------------------------------------------------------------
    @property
    def api(self) -> Any:
        if self._api is None:
            self._api = self._build()
        return self._api

    def _build(self) -> Any:
        from kubernetes import client, config

        configuration = client.Configuration()
        # kubectl's order: --kubeconfig, $KUBECONFIG (merged), ~/.kube/config; in a pod without
        # any of them, the service account's in-cluster config.
        in_pod = "KUBERNETES_SERVICE_HOST" in os.environ and not (
            self._kubeconfig or self._context or os.environ.get("KUBECONFIG")
            or os.path.exists(os.path.expanduser("~/.kube/config")))
        missing = self._missing_kubeconfig(in_pod)
        if missing:
            raise UsageError(missing)
        try:
            if in_pod:
                config.load_incluster_config(client_configuration=configuration)
            else:
                # $KUBECONFIG is read now, not when `kubernetes` was imported; ':'-lists merge.
                config.load_kube_config(config_file=self._kubeconfig or os.environ.get("KUBECONFIG") or None,
                                        context=self._context,
                                        client_configuration=configuration, persist_config=False)
        except Exception as e:  # ConfigException, YAML errors, missing keys: all mean a bad config
            path = self._kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            where = "the in-cluster config" if in_pod else (
                f"--kubeconfig {path}" if self._kubeconfig else f"kubeconfig {path}")
            ctx = f" (context {self._context!r})" if self._context else ""
            raise UsageError(f"cannot load {where}{ctx}: {str(e).splitlines()[0]}; pass "
                             "--kubeconfig/--context, or run inside a pod") from e
        configuration.retries = False  # `request` retries itself, within the deadline
        return client.ApiClient(configuration)

    def _missing_kubeconfig(self, in_pod: bool) -> str | None:
        """A kubeconfig that does not exist said as such (the client calls it "Invalid
        kube-config file", which sends a new user hunting for a syntax error)."""
        if in_pod:
            return None
        given = self._kubeconfig or os.environ.get("KUBECONFIG")
        paths = [p for p in (given.split(os.pathsep) if given else ["~/.kube/config"]) if p]
        if any(os.path.exists(os.path.expanduser(p)) for p in paths):
            return None
        what = (f"--kubeconfig {given}" if self._kubeconfig else f"KUBECONFIG={given}" if given
                else "~/.kube/config")
        return (f"{what} does not exist: no cluster to talk to. Point at one with --kubeconfig FILE "
                "or KUBECONFIG=FILE (your cloud's CLI writes it: aws eks update-kubeconfig, gcloud "
                "container clusters get-credentials, az aks get-credentials), or run locally with "
                "--local")

    @property
    def host(self) -> str:
        return self.api.configuration.host

    # --- one request ---------------------------------------------------------------------------
    def renew(self) -> None:
        """Start a fresh deadline: the API answered (any response but 429/5xx), or a watch
        event arrived. The deadline is how long the API may stay silent, not a command's age:
        a long watch or a slow wait is fine, a hung or failing API costs at most that long."""
        self._deadline = None

    def remaining(self) -> float:
        """Seconds left before giving up on an API that does not answer."""
        if self._deadline is None:
            self._deadline = time.monotonic() + self.request_timeout
        return self._deadline - time.monotonic()

    def request(self, method: str, path: str, *, query: dict[str, Any] | None = None,
                body: Any = None, content_type: str | None = None, stream: bool = False,
                stream_timeout: float | None = None,
                what: tuple[str, Kind | None, str | None, str | None] | None = None) -> Any:
        """Send one request, retried on 429/5xx and connection errors with backoff (Retry-After
        honoured); return the decoded JSON (or the raw response when `stream`).

        Every attempt's timeouts are cut to what is left of the command's deadline
        (`request_timeout`), so a hung API server costs at most that long, never retries x
        timeouts. A stream's body may then be quiet for `stream_timeout` (None: forever).
        POST is retried too: a create that did land answers 409 the second time, and every
        caller of `create` treats 409 by reading the object back and checking it is ours.
        `what` = (verb, kind, namespace, name) makes error messages precise."""
        what = what or (method.lower(), None, None, None)
        retries = int(os.environ.get("SUBMITTER_API_RETRIES", "5"))
        backoff = float(os.environ.get("SUBMITTER_API_BACKOFF", "0.5"))
        attempt = 0
        while True:
            left = self.remaining()
            if left <= 0:
                raise self._deadline_error(what)
            try:
                return self._send(method, path, query, body, content_type, stream, stream_timeout,
                                  (min(CONNECT_TIMEOUT, left), left), what)
            except _Retry as retry:
                attempt += 1
                wait = retry.after if retry.after is not None else min(backoff * 2 ** (attempt - 1), 10.0)
                if attempt > retries or wait >= self.remaining():  # out of attempts or of time
                    raise retry.error from retry.error.__cause__
                time.sleep(wait)

    def _deadline_error(self, what: tuple[str, Kind | None, str | None, str | None]) -> ApiDeadline:
        verb, kind, namespace, name = what
        ref = "/".join(x for x in (kind.plural if kind else None, name) if x) or "the API"
        target = f" ({verb} {ref})"
        return ApiDeadline(f"no answer from the Kubernetes API at {self.host} within "
                           f"{self.request_timeout:g}s{target}; the server or a proxy in front of it "
                           "hangs. Try again later, or allow more time with --request-timeout")

    def _send(self, method: str, path: str, query: dict[str, Any] | None, body: Any,
              content_type: str | None, stream: bool, stream_timeout: float | None,
              timeout: tuple[float, float], what: tuple[str, Kind | None, str | None, str | None]) -> Any:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        try:
            _, url, headers, body, _ = self.api.param_serialize(
                method, path, query_params=params, header_params=headers, body=body,
                auth_settings=["BearerToken"])
            response = self.api.call_api(method, url, header_params=headers, body=body,
                                         _request_timeout=timeout)
            if not 200 <= response.status <= 299:
                api_error = ApiException(http_resp=_read(response))
                error = translate(api_error, what, self.host)
                error.__cause__ = api_error
                if response.status in RETRY_STATUSES and not _schema_refusal(str(error)):
                    raise _Retry(error, _retry_after(response.response))
                self.renew()  # a definite answer: the API is alive
                raise error
            self.renew()
            if stream:
                raw = response.response
                _stream_timeout(raw, stream_timeout)
                if what[0] == "watch" and "json" not in (raw.headers.get("Content-Type") or "json"):
                    raise self._not_json(raw.status, raw.headers.get("Content-Type"), raw.read(200), what)
                return raw
            data = response.read()
            if not data:
                return None
            try:
                return json.loads(data)
            except (ValueError, RecursionError):
                raise self._not_json(response.status, response.getheader("Content-Type"), data, what) from None
        except urllib3.exceptions.ReadTimeoutError as e:
            raise self._deadline_error(what) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise _Retry(ApiUnavailable(f"cannot reach the Kubernetes API at {self.host}: "
                                        f"{_reason(e)}; check the cluster and your kubeconfig"), None) from e

    def _not_json(self, status: int, content_type: str | None, data: bytes,
                  what: tuple[str, Kind | None, str | None, str | None]) -> BadResponse:
        text = data[:200].decode("utf-8", "replace")
        start = " ".join(text.split())[:60]
        kind = "HTML" if "<html" in text.lower() or "html" in (content_type or "") else "a body"
        return BadResponse(f"the API server at {self.host} answered {status} with {kind} that is not "
                           f"Kubernetes JSON ({content_type or 'no content type'}: {start!r}) to "
                           f"{what[0]} {what[1].plural if what[1] else 'the API'}; an authenticating "
                           "proxy or a wrong server URL in the kubeconfig? Log in again or check "
                           "`kubectl cluster-info`")

    # --- operations ------------------------------------------------------------------------------
    def get(self, kind: str, namespace: str | None, name: str) -> dict:
        k = KINDS[kind]
        return self.request("GET", k.path(namespace, name), what=("get", k, namespace, name))

    def find(self, kind: str, namespace: str | None, name: str) -> dict | None:
        """get, or None when the object does not exist."""
        try:
            return self.get(kind, namespace, name)
        except NotFound:
            return None

    def list(self, kind: str, namespace: str | None, *, labels: dict[str, str] | None = None,
             selector: str | None = None) -> dict:
        """List; `labels` (exact matches) and `selector` (kubectl's -l syntax) are ANDed."""
        k = KINDS[kind]
        selector = ",".join([f"{key}={value}" for key, value in (labels or {}).items()]
                            + ([selector] if selector else [])) or None
        return self.request("GET", k.path(namespace), query={"labelSelector": selector},
                            what=("list", k, namespace, None))

    def create(self, obj: dict, *, dry_run: bool = False) -> dict:
        """POST: create, never overwrite. 409 (Conflict) when the name is taken."""
        k = KINDS[obj["kind"]]
        meta = obj["metadata"]
        return self.request("POST", k.path(meta.get("namespace")),
                            query={"fieldManager": FIELD_MANAGER, "fieldValidation": FIELD_VALIDATION,
                                   "dryRun": "All" if dry_run else None},
                            body=obj, what=("create", k, meta.get("namespace"), meta.get("name")))

    def apply(self, obj: dict, *, dry_run: bool = False) -> tuple[dict, bool]:
        """Server-side apply (field manager `submitter`, force) of an object we own (callers
        check ownership first). Returns (object, created)."""
        k = KINDS[obj["kind"]]
        meta = obj["metadata"]
        # An apply that creates answers 201; the response tells us which happened.
        response = self.request(
            "PATCH", k.path(meta.get("namespace"), meta["name"]),
            query={"fieldManager": FIELD_MANAGER, "force": "true", "fieldValidation": FIELD_VALIDATION,
                   "dryRun": "All" if dry_run else None},
            body=obj, content_type="application/apply-patch+yaml", stream=True,
            stream_timeout=max(1.0, self.remaining()), what=("patch", k, meta.get("namespace"), meta["name"]))
        try:
            data = response.data
            try:
                return json.loads(data), response.status == 201
            except (ValueError, RecursionError):
                raise self._not_json(response.status, response.headers.get("Content-Type"), data,
                                     ("patch", k, meta.get("namespace"), meta["name"])) from None
        finally:
            response.release_conn()

    def patch(self, kind: str, namespace: str | None, name: str, patch: dict, *,
              uid: str | None = None, dry_run: bool = False) -> dict:
        """JSON merge patch (e.g. `spec.suspend`, a Workload's `spec.active`: Strict, so a field the
        server does not know is refused, not dropped); with `uid`, only that incarnation changes."""
        k = KINDS[kind]
        if uid:
            patch = {**patch, "metadata": {**(patch.get("metadata") or {}), "uid": uid}}
        return self.request("PATCH", k.path(namespace, name), body=patch,
                            query={"fieldManager": FIELD_MANAGER, "fieldValidation": FIELD_VALIDATION,
                                   "dryRun": "All" if dry_run else None},
                            content_type="application/merge-patch+json",
                            what=("patch", k, namespace, name))

    def delete(self, kind: str, namespace: str | None, name: str, *, uid: str | None = None,
               propagation: str = "Background") -> bool:
        """Delete; False when it was already gone (deleting twice is not an error)."""
        k = KINDS[kind]
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions",
                                "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", k.path(namespace, name), body=body,
                         what=("delete", k, namespace, name))
        except NotFound:
            return False
        return True

    def api_resources(self, group_version: str) -> list[str] | None:
        """The resource names a group/version serves, or None when it is not served at all."""
        try:
            doc = self.request("GET", f"/apis/{group_version}", what=("get", None, None, group_version))
        except NotFound:
            return None
        return [r.get("name") for r in doc.get("resources", [])]

    # --- read-only views for diagnosis (status, watch) --------------------------------------------
    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        """The pods matching a label selector (`key=value,...`), one request."""
        k = KINDS["Pod"]
        doc = self.request("GET", k.path(namespace), query={"labelSelector": selector},
                           what=("list", k, namespace, None))
        return (doc or {}).get("items") or []

    def events_for(self, namespace: str, kind: str, name: str) -> list[dict]:
        """The core/v1 Events about one object, oldest first (one request, a field selector)."""
        k = KINDS["Event"]
        doc = self.request("GET", k.path(namespace), query={
            "fieldSelector": f"involvedObject.kind={kind},involvedObject.name={name}"},
            what=("list", k, namespace, None))
        items = (doc or {}).get("items") or []
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime")
                      or (e.get("metadata") or {}).get("creationTimestamp") or "")

    def get_raycluster(self, namespace: str, name: str) -> dict | None:
        """The RayCluster a RayJob runs on, or None when it does not exist (yet, or any more)."""
        return self.find("RayCluster", namespace, name)

    def watch(self, kind: str, namespace: str | None, name: str | None, *,
              resource_version: str | None, labels: str | None = None) -> "WatchStream":
        """Open a watch on one object (or, with `labels` and no name, on every object matching
        that label selector) from `resource_version` (None: start with the current state)."""
        k = KINDS[kind]
        response = self.request(
            "GET", k.path(namespace),
            query={"watch": "true", "fieldSelector": f"metadata.name={name}" if name else None,
                   "labelSelector": labels,
                   "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                   "timeoutSeconds": str(WATCH_SECONDS)},
            stream=True, stream_timeout=WATCH_SECONDS + 30, what=("watch", k, namespace, name))
        return WatchStream(response, self.host, (kind, namespace, name or labels or ""))

    def log_lines(self, namespace: str, pod: str, *, follow: bool) -> Iterator[str]:
        k = KINDS["Pod"]
        response = self.request("GET", k.path(namespace, pod, "log"),
                                query={"follow": "true" if follow else None}, stream=True,
                                stream_timeout=None if follow else 120,
                                what=("get", Kind("", "v1", "pods/log"), namespace, pod))
        from kubernetes.watch.watch import iter_resp_lines

        try:
            yield from iter_resp_lines(response)
        finally:
            response.release_conn()


class WatchStream:
    """The events of one watch request; `close()` from another thread ends the iteration."""

    def __init__(self, response: Any, host: str, what: tuple[str, str | None, str]) -> None:
        self._response, self._host, self._what = response, host, what

    def __iter__(self) -> Iterator[dict]:
        import urllib3
        from kubernetes.watch.watch import iter_resp_lines

        try:
            for line in iter_resp_lines(self._response):
                if not line:
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise Expired(status.get("message", "resource version too old"))
                    # Any other ERROR ends this stream, not the watch: reopen from the last
                    # resourceVersion, as after a dropped connection.
                    raise StreamDropped(f"watch of {self._what[0]} {self._what[2]} got an ERROR event: "
                                        f"{_short_text(status.get('message') or status)}")
                yield event
        except (urllib3.exceptions.HTTPError, OSError, ValueError, RecursionError) as e:
            raise StreamDropped(f"watch stream from {self._host} dropped: {_reason(e)}") from e
        finally:
            self._response.release_conn()

    def close(self) -> None:
        try:
            self._response.shutdown()
        except Exception:  # already closed
            pass


# --- error translation ------------------------------------------------------------------------

def translate(e: Any, what: tuple[str, Kind | None, str | None, str | None], host: str) -> ClusterError:
    """One ApiException -> one project error with a message a user can act on."""
    verb, kind, namespace, name = what
    status = e.status or 0
    body = _body(e)
    server = body.get("message") or e.reason or ""
    resource = kind.resource if kind else "the API"
    target = f"{kind.plural if kind else 'object'}/{name}" if name else resource
    where = f" in namespace {namespace}" if namespace else ""
    if status == 401:
        return Unauthorized(f"the API server at {host} rejected the credentials (401); refresh your "
                            "kubeconfig login")
    if status == 403:
        return Forbidden(f"forbidden: you may not {verb} {resource}{where} ({server}); ask an "
                         f"admin for a Role granting verb '{verb}' on '{resource}'")
    if status == 404:
        details = body.get("details") or {}
        if kind is not None and kind.plural == "rayjobs" and not details.get("name"):
            return CrdMissing(f"the RayJob CRD (rayjobs.ray.io) is not installed on {host}; {KUBERAY_INSTALL}")
        return NotFound(f"{target} not found{where}")
    if status == 409 or (status == 422 and verb == "patch" and _uid_changed(server)):
        # a merge patch carrying the uid we read is our precondition; a real API server answers
        # a different uid with 422 "field is immutable" (only DELETE has true preconditions)
        if status == 422:
            return Conflict(f"{target}{where} was deleted and recreated meanwhile (another uid); "
                            "nothing was changed: look again and rerun the command")
        return Conflict(f"conflict on {target}{where}: {server}")
    if status == 410:
        return Expired(server or "resource version too old")
    if status in (400, 422) or _schema_refusal(server):
        hint = ""
        # fieldValidation=Strict: the installed CRD is older (a create or merge patch says
        # "unknown field"; a server-side apply answers 500 "field not declared in schema")
        if "unknown field" in server or _schema_refusal(server):
            hint = ("; the installed CRD does not know that field: upgrade KubeRay and its CRDs "
                    f"(>= {KUBERAY_AUTH_VERSION} for authOptions)" if kind and kind.group == "ray.io"
                    else "; the API server does not know that field (an older version?)")
        return ClusterError(f"the API server rejected {target}{where}: {server}{hint}")
    if status == 429 or status >= 500 or status == 0:
        return ApiUnavailable(f"the Kubernetes API at {host} kept failing ({status} {e.reason or ''}"
                              f"{': ' + server if server else ''}) after retries; try again later")
    return ClusterError(f"{verb} {target}{where} failed: {status} {server}")


def _uid_changed(message: str) -> bool:
    return "metadata.uid" in message and "field is immutable" in message


def _schema_refusal(message: str) -> bool:
    """A server-side apply of a field the schema lacks: 500 from the API server, yet no outage
    (retrying cannot help)."""
    return "field not declared in schema" in message


def _body(e: Any) -> dict:
    try:
        data = json.loads(e.body) if e.body else {}
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _retry_after(response: Any) -> float | None:
    """Retry-After in seconds (the API server sends seconds; dates are treated as absent)."""
    try:
        value = float(response.headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None
    return max(0.0, min(value, 60.0))


def _stream_timeout(response: Any, seconds: float | None) -> None:
    """The headers came within the deadline; the body of a watch or `logs -f` may be quiet for
    longer, so widen the socket's read timeout for it."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(seconds)


def _short_text(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _read(response: Any) -> Any:
    response.read()
    return response


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None) or e
    text = str(reason).strip() or type(reason).__name__
    return text.splitlines()[0][:200]
