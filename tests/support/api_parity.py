"""Run the API interactions of `submitter.kube` against the emulator and a real API server and
diff what each one answers.

Why: the cluster tests run against `tests.support.kube_emulator`; where it and a real
kube-apiserver disagree, the tests prove something about a server that does not exist. This
harness drives both through `submitter.kube.Kube` itself (the one module that talks to the API),
records for every step an *observable outcome* with the volatile parts (uids, resourceVersions,
timestamps, ports) reduced to their shape, and prints the differences.

    python -m tests.support.api_parity --kubeconfig /tmp/cp1/admin.kubeconfig \
        [--user-kubeconfig /tmp/cp1/user.kubeconfig] [--namespace emu-diff] [--json out.json]

The namespace is created by the run and deleted at its end; RayJobs are created suspended and
`managedBy` MultiKueue so a real KubeRay operator leaves them alone (no pods, no status writes).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from submitter.contract.errors import SubmitterError
from submitter.kube import KINDS, Kube

Outcome = Any
UID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
HOST_RE = re.compile(r"https?://[\w.\-]+(:\d+)?")
NUM_RE = re.compile(r"\d+")
LABEL = "parity.submitter.dev/run"


# --- reducing outcomes to their shape -----------------------------------------------------

class Shaper:
    """Turns a server answer into what the comparison may look at: no values that differ
    between two correct servers (uids, resourceVersions, times, the namespace's name)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def text(self, message: str) -> str:
        message = HOST_RE.sub("<host>", message)
        message = re.sub(r'User "[^"]*"', 'User "<user>"', message)
        message = UID_RE.sub("<uid>", message)
        message = re.sub(rf"\b{re.escape(self.namespace)}\b", "<ns>", message)
        return NUM_RE.sub("<n>", message)

    def error(self, e: BaseException) -> dict:
        """The project error class, its message shape, and the HTTP status body behind it."""
        out: dict[str, Any] = {"error": type(e).__name__, "message": self.text(str(e))}
        cause = e.__cause__
        if cause is not None and getattr(cause, "status", None):
            out["http"] = cause.status
            try:
                body = json.loads(cause.body or "{}")
            except ValueError:
                body = {}
            out["reason"] = body.get("reason")
            out["details"] = sorted((body.get("details") or {}).keys())
        return out

    def obj(self, obj: dict | None) -> dict | None:
        """kind/apiVersion and which server-owned metadata fields are filled in."""
        if obj is None:
            return None
        meta = obj.get("metadata") or {}
        return {
            "kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"),
            "namespace": None if meta.get("namespace") is None else self.text(meta["namespace"]),
            "uid": bool(meta.get("uid")), "resourceVersion": bool(meta.get("resourceVersion")),
            "creationTimestamp": bool(meta.get("creationTimestamp")),
            "generation": meta.get("generation"),
            "managedFields": sorted((m.get("manager"), m.get("operation"), m.get("subresource", ""))
                                    for m in meta.get("managedFields") or []),
            "finalizers": meta.get("finalizers"), "deletionTimestamp": bool(meta.get("deletionTimestamp")),
            "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k != LABEL},
        }


def rv(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


# --- objects ---------------------------------------------------------------------------------

def configmap(ns: str, name: str, data: dict[str, str], **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": {LABEL: "1", **labels}}, "data": data}


def rayjob(ns: str, name: str, **spec: Any) -> dict:
    """A RayJob no operator acts on: suspended, and managed by MultiKueue (KubeRay skips it)."""
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": ns, "labels": {LABEL: "1"}},
            "spec": {"entrypoint": "python -c 'print(1)'", "suspend": True,
                     "managedBy": "kueue.x-k8s.io/multikueue", **spec}}


def raw_apply(kube: Kube, kind: str, ns: str, name: str, body: Any, *, sub: str | None = None,
              query: dict | None = None) -> tuple[int, dict]:
    """A server-side apply with any body (a YAML string too): Kube.apply sends JSON only."""
    k = KINDS[kind]
    response = kube.request("PATCH", k.path(ns, name, sub), body=body, stream=True,
                            query={"fieldManager": "submitter", "force": "true", **(query or {})},
                            content_type="application/apply-patch+yaml", what=("patch", k, ns, name))
    try:
        return response.status, json.loads(response.data)
    finally:
        response.release_conn()


# --- the run ---------------------------------------------------------------------------------

class Run:
    """One sequence of steps against one server; `results[step] = outcome`."""

    def __init__(self, kube: Kube, namespace: str, user: Kube | None) -> None:
        self.kube, self.ns, self.user = kube, namespace, user
        self.shape = Shaper(namespace)
        self.results: dict[str, Outcome] = {}

    def step(self, name: str, fn: Callable[[], Outcome]) -> Outcome:
        try:
            out = fn()
        except SubmitterError as e:
            out = self.shape.error(e)
        self.results[name] = out
        return out

    def all(self) -> dict[str, Outcome]:
        for group in (self.namespaces, self.discovery, self.configmaps, self.selectors,
                      self.not_found, self.rayjobs, self.status_subresource, self.watches,
                      self.forbidden, self.deletes):
            group()
        return self.results

    # --- groups of steps ---------------------------------------------------------------------
    def namespaces(self) -> None:
        k, ns = self.kube, self.ns
        self.step("namespace.create", lambda: self._namespace(
            k.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})))
        self.step("namespace.get", lambda: self._namespace(k.get("Namespace", None, ns)))
        self.step("namespace.find_missing", lambda: k.find("Namespace", None, ns + "-missing"))
        self.step("namespace.write_into_missing", lambda: self.shape.obj(
            k.create(configmap(ns + "-missing", "x", {}))))

    def _namespace(self, obj: dict) -> dict:
        return {**self.shape.obj(obj), "spec": obj.get("spec"), "status": obj.get("status"),
                "all_labels": sorted((obj["metadata"].get("labels") or {}).keys())}

    def discovery(self) -> None:
        k = self.kube

        def group(path: str, plurals: tuple[str, ...]) -> dict:
            doc = k.request("GET", path)
            resources = {r["name"]: (r.get("kind"), r.get("namespaced"), sorted(r.get("verbs") or []))
                         for r in doc.get("resources", []) if r["name"].split("/")[0] in plurals}
            return {"kind": doc.get("kind"), "groupVersion": doc.get("groupVersion"),
                    "resources": {n: list(v) for n, v in sorted(resources.items())}}

        self.step("discovery.core", lambda: group("/api/v1", ("namespaces", "configmaps", "pods")))
        self.step("discovery.ray", lambda: group("/apis/ray.io/v1", ("rayjobs", "rayclusters")))
        self.step("discovery.api_resources_missing", lambda: k.api_resources("nosuch.example.com/v1"))

    def configmaps(self) -> None:
        k, ns, s = self.kube, self.ns, self.shape
        created = self.step("cm.create", lambda: k.create(configmap(ns, "cm-a", {"a": "1"}, tier="a")))
        self.results["cm.create"] = s.obj(created)
        got = k.get("ConfigMap", ns, "cm-a")
        self.results["cm.get"] = {**s.obj(got), "rv_same_as_create": rv(got) == rv(created)}
        self.step("cm.create_existing", lambda: k.create(configmap(ns, "cm-a", {})))
        self.step("cm.create_invalid_name", lambda: k.create(configmap(ns, "Bad_Name", {})))
        self.step("cm.create_long_name", lambda: k.create(configmap(ns, "a" * 254, {})))
        self.step("cm.create_dry_run", lambda: {**s.obj(k.create(configmap(ns, "cm-dry", {}), dry_run=True)),
                                                "persisted": k.find("ConfigMap", ns, "cm-dry") is not None})
        patched = k.patch("ConfigMap", ns, "cm-a", {"data": {"a": "2"}})
        self.results["cm.merge_patch"] = {**s.obj(patched), "rv_changed": rv(patched) != rv(got)}
        again = k.patch("ConfigMap", ns, "cm-a", {"data": {"a": "2"}})
        self.results["cm.merge_patch_noop"] = {"rv_changed": rv(again) != rv(patched)}
        self.step("cm.merge_patch_uid_mismatch",
                  lambda: k.patch("ConfigMap", ns, "cm-a", {"data": {"a": "3"}}, uid=str(uuid.uuid4())))
        self.step("cm.merge_patch_missing", lambda: k.patch("ConfigMap", ns, "nope", {"data": {}}))
        applied, created_flag = k.apply(configmap(ns, "cm-a", {"a": "4"}, tier="a"))
        self.results["cm.apply_update"] = {**s.obj(applied), "created": created_flag,
                                           "rv_changed": rv(applied) != rv(again), "data": applied.get("data")}
        noop, _ = k.apply(configmap(ns, "cm-a", {"a": "4"}, tier="a"))
        self.results["cm.apply_noop"] = {"rv_changed": rv(noop) != rv(applied)}
        self.step("cm.apply_create", lambda: (lambda r: {**s.obj(r[0]), "created": r[1]})(
            k.apply(configmap(ns, "cm-b", {"b": "1"}, tier="b"))))
        text = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-c\n  namespace: {ns}\n" \
               f"  labels: {{{LABEL}: '1', tier: c}}\ndata:\n  c: '1'\n"
        self.step("cm.apply_create_yaml", lambda: self._applied(raw_apply(k, "ConfigMap", ns, "cm-c", text)))
        self.step("cm.apply_update_yaml", lambda: self._applied(
            raw_apply(k, "ConfigMap", ns, "cm-c", text.replace("c: '1'", "c: '2'"))))
        self.step("cm.apply_dry_run", lambda: {
            **(lambda r: {**s.obj(r[0]), "created": r[1]})(k.apply(configmap(ns, "cm-d", {}), dry_run=True)),
            "persisted": k.find("ConfigMap", ns, "cm-d") is not None})
        self.step("cm.apply_missing_namespace",
                  lambda: k.apply(configmap(ns + "-missing", "cm-x", {})))

    def _applied(self, answer: tuple[int, dict]) -> dict:
        status, obj = answer
        return {**self.shape.obj(obj), "http": status, "data": obj.get("data")}

    def selectors(self) -> None:
        k, ns = self.kube, self.ns

        def names(doc: dict) -> dict:
            return {"kind": doc.get("kind"), "apiVersion": doc.get("apiVersion"),
                    "list_rv": bool((doc.get("metadata") or {}).get("resourceVersion")),
                    "names": sorted(i["metadata"]["name"] for i in doc.get("items", [])),
                    "item_kinds": sorted({str(i.get("kind")) for i in doc.get("items", [])})}

        def field(selector: str) -> dict:
            return names(k.request("GET", KINDS["ConfigMap"].path(ns),
                                   query={"fieldSelector": selector, "labelSelector": LABEL}))

        self.step("list.labels", lambda: names(k.list("ConfigMap", ns, labels={LABEL: "1"})))
        self.step("list.label_in", lambda: names(k.list("ConfigMap", ns, selector="tier in (a,b)")))
        self.step("list.label_notin", lambda: names(k.list("ConfigMap", ns, selector=f"{LABEL},tier notin (a)")))
        self.step("list.label_not_exists", lambda: names(k.list("ConfigMap", ns, selector=f"{LABEL},!tier")))
        self.step("list.label_invalid", lambda: names(k.list("ConfigMap", ns, selector="tier in a")))
        self.step("list.field_name", lambda: field("metadata.name=cm-a"))
        self.step("list.field_name_not", lambda: field("metadata.name!=cm-a"))
        self.step("list.field_unsupported", lambda: field("data.a=4"))
        self.step("list.events_for", lambda: k.events_for(ns, "ConfigMap", "cm-a"))
        self.step("list.pods", lambda: k.list_pods(ns, "app=none"))
        self.step("list.all_namespaces_rayjobs", lambda: names(k.list("RayJob", None, labels={LABEL: "none"})))

    def not_found(self) -> None:
        k, ns = self.kube, self.ns
        self.step("404.object", lambda: k.get("ConfigMap", ns, "nope"))
        self.step("404.find", lambda: k.find("ConfigMap", ns, "nope"))
        self.step("404.rayjob_object", lambda: k.get("RayJob", ns, "nope"))
        # A resource the server does not serve, named as the RayJob kind: what a missing CRD is.
        self.step("404.resource", lambda: k.request(
            "GET", f"/apis/ray.io/v1/namespaces/{ns}/nosuchresources/x",
            what=("get", KINDS["RayJob"], ns, "x")))
        self.step("404.group", lambda: k.get("Workload", ns, "x"))
        self.step("404.delete_missing", lambda: k.delete("ConfigMap", ns, "nope"))

    def rayjobs(self) -> None:
        k, ns, s = self.kube, self.ns, self.shape
        created = k.create(rayjob(ns, "rj-a"))
        self.results["rayjob.create"] = s.obj(created)
        self.step("rayjob.create_unknown_field", lambda: k.create(rayjob(ns, "rj-b", bogus=1)))
        self.step("rayjob.apply_unknown_field", lambda: k.apply(rayjob(ns, "rj-b", bogus=1)))
        self.step("rayjob.create_invalid_name", lambda: k.create(rayjob(ns, "RJ_bad")))
        self.step("rayjob.create_bad_type", lambda: k.create(rayjob(ns, "rj-t", suspend="yes")))
        self.step("rayjob.create_unknown_field_ignored", lambda: "bogus" in k.request(
            "POST", KINDS["RayJob"].path(ns), body=rayjob(ns, "rj-p", bogus=1),
            query={"fieldValidation": "Ignore"})["spec"])
        self.step("rayjob.create_unknown_metadata_field", lambda: k.create(
            {**rayjob(ns, "rj-m"), "metadata": {"name": "rj-m", "namespace": ns, "bogus": 1}}))
        spec = k.patch("RayJob", ns, "rj-a", {"spec": {"entrypoint": "python -c 'print(2)'"}})
        self.results["rayjob.patch_spec"] = {"generation": spec["metadata"].get("generation"),
                                             "rv_changed": rv(spec) != rv(created)}
        labels = k.patch("RayJob", ns, "rj-a", {"metadata": {"labels": {"x": "y"}}})
        self.results["rayjob.patch_labels"] = {"generation": labels["metadata"].get("generation"),
                                               "rv_changed": rv(labels) != rv(spec)}
        applied, flag = k.apply(rayjob(ns, "rj-a", entrypoint="python -c 'print(3)'"))
        self.results["rayjob.apply_update"] = {**s.obj(applied), "created": flag,
                                               "labels_kept_from_other_manager": applied["metadata"]["labels"].get("x")}

    def status_subresource(self) -> None:
        k, ns = self.kube, self.ns
        path = KINDS["RayJob"].path(ns, "rj-a", "status")
        before = k.get("RayJob", ns, "rj-a")

        def merge() -> dict:
            after = k.request("PATCH", path, content_type="application/merge-patch+json", body={
                "status": {"message": "from status"}, "spec": {"entrypoint": "changed"},
                "metadata": {"labels": {"status": "patch"}}})
            return self._status_effect(before, after)

        self.step("status.merge_patch", merge)
        self.step("status.apply", lambda: self._status_effect(before, raw_apply(
            k, "RayJob", ns, "rj-a", {"apiVersion": "ray.io/v1", "kind": "RayJob",
                                      "metadata": {"name": "rj-a", "labels": {"status": "apply"}},
                                      "spec": {"entrypoint": "changed"}, "status": {"message": "applied"}},
            sub="status")[1]))
        self.step("status.get", lambda: k.request("GET", path).get("status", {}).get("message"))
        self.step("status.configmap", lambda: k.request(
            "PATCH", KINDS["ConfigMap"].path(ns, "cm-a", "status"), content_type="application/merge-patch+json",
            body={"data": {"a": "x"}}, what=("patch", KINDS["ConfigMap"], ns, "cm-a")))

    def _status_effect(self, before: dict, after: dict) -> dict:
        return {"status": after.get("status"),
                "spec_changed": after["spec"] != before["spec"],
                "labels": {k: v for k, v in after["metadata"].get("labels", {}).items() if k != LABEL},
                "generation_changed": after["metadata"].get("generation") != before["metadata"].get("generation"),
                "managers": self.shape.obj(after)["managedFields"]}

    def watches(self) -> None:
        k, ns = self.kube, self.ns
        start = k.list("ConfigMap", ns, labels={LABEL: "1"})["metadata"]["resourceVersion"]
        k.create(configmap(ns, "cm-w", {"w": "1"}, watch="yes"))
        k.patch("ConfigMap", ns, "cm-w", {"data": {"w": "2"}})
        k.delete("ConfigMap", ns, "cm-w")
        self.step("watch.from_rv", lambda: self._events(
            k.watch("ConfigMap", ns, None, resource_version=start, labels="watch=yes"), 3))
        self.step("watch.initial_state", lambda: self._events(
            k.watch("ConfigMap", ns, "cm-a", resource_version=None), 1))
        self.step("watch.too_old", lambda: self._events(
            k.watch("ConfigMap", ns, "cm-a", resource_version="1"), 1))
        self.step("watch.bookmarks", self._bookmarks)

    def _events(self, stream: Any, want: int, seconds: float = 10.0) -> dict:
        """Collect `want` events (or what `seconds` give), then close the stream."""
        timer = threading.Timer(seconds, stream.close)
        timer.start()
        events: list[dict] = []
        try:
            for event in stream:
                events.append(event)
                if len(events) >= want:
                    break
        finally:
            timer.cancel()
            stream.close()
        versions = [int(rv(e["object"]) or 0) for e in events]
        return {"types": [e["type"] for e in events], "kinds": sorted({str(e["object"].get("kind")) for e in events}),
                "increasing": versions == sorted(versions)}

    def _bookmarks(self) -> dict:
        """A short watch with bookmarks allowed: the server ends it itself after timeoutSeconds
        (a bookmark comes 2 s before the end on a real server)."""
        began = time.monotonic()
        response = self.kube.request("GET", KINDS["ConfigMap"].path(self.ns), stream=True, query={
            "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": "4",
            "labelSelector": "watch=none", "resourceVersion": "0"})
        lines = [json.loads(line) for line in response.read().decode().splitlines() if line.strip()]
        response.release_conn()
        marks = [e for e in lines if e["type"] == "BOOKMARK"]
        return {"types": sorted({e["type"] for e in lines}),
                "bookmark_object": sorted((marks[0]["object"].get("metadata") or {}).keys()) if marks else None,
                "bookmark_kind": marks[0]["object"].get("kind") if marks else None,
                "ended_by_server": time.monotonic() - began < 8}

    def forbidden(self) -> None:
        if self.user is not None:
            self.step("403.list", lambda: self.user.list("Secret", self.ns))
            self.step("403.get", lambda: self.user.get("Secret", self.ns, "x"))

    def deletes(self) -> None:
        k, ns = self.kube, self.ns
        cm = k.get("ConfigMap", ns, "cm-b")
        self.step("delete.uid_mismatch", lambda: k.delete("ConfigMap", ns, "cm-b", uid=str(uuid.uuid4())))
        self.step("delete.uid_match", lambda: k.delete("ConfigMap", ns, "cm-b", uid=cm["metadata"]["uid"]))
        self.step("delete.again", lambda: k.delete("ConfigMap", ns, "cm-b"))
        for policy in ("Foreground", "Orphan", "Background"):
            self.step(f"delete.{policy.lower()}_answer", lambda p=policy: self._delete(p))
        self.step("delete.rayjob_foreground", lambda: self._delete("Foreground", "RayJob", "rj-a"))
        self.step("delete.namespace", lambda: self._delete("Background", "Namespace", ns, wait=0))
        self.step("delete.namespace_phase", lambda: (k.find("Namespace", None, ns) or {}).get("status"))

    def _delete(self, policy: str, kind: str = "ConfigMap", name: str | None = None,
                wait: float = 10.0) -> dict:
        """The DELETE answer itself (Status or the object), and whether the object then goes."""
        k, ns = self.kube, self.ns
        if name is None:
            name = f"cm-del-{policy.lower()}"
            k.create(configmap(ns, name, {}))
        kd = KINDS[kind]
        namespace = ns if kd.namespaced else None
        answer = k.request("DELETE", kd.path(namespace, name), what=("delete", kd, namespace, name),
                           body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": policy})
        deadline = time.monotonic() + wait
        while wait and k.find(kind, namespace, name) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        return {"answer_kind": answer.get("kind"), "answer_status": answer.get("status"),
                "details": sorted((answer.get("details") or {}).keys()),
                "finalizers": (answer.get("metadata") or {}).get("finalizers"),
                "deletionTimestamp": bool((answer.get("metadata") or {}).get("deletionTimestamp")),
                "gone": None if not wait else k.find(kind, namespace, name) is None}


# --- running it against both ----------------------------------------------------------------

def against_emulator(namespace: str) -> dict[str, Outcome]:
    """The same steps against a fresh emulator; its 'restricted user' is the same server with
    the verbs that user lacks denied."""
    from tests.support.kube_emulator import running_emulator

    with running_emulator() as running, tempfile.TemporaryDirectory() as tmp:
        kube = Kube(kubeconfig=running.kubeconfig(Path(tmp) / "kubeconfig"))
        run = Run(kube, namespace, None)
        run.all()
        running.emulator.deny("list", "secrets")
        running.emulator.deny("get", "secrets")
        run.user = kube
        run.forbidden()
        return run.results


def against_server(kubeconfig: str, namespace: str, user_kubeconfig: str | None) -> dict[str, Outcome]:
    kube = Kube(kubeconfig=kubeconfig)
    user = Kube(kubeconfig=user_kubeconfig) if user_kubeconfig else None
    try:
        return Run(kube, namespace, user).all()
    finally:
        kube.delete("Namespace", None, namespace)  # idempotent: the run deletes it too


def diff(emulated: dict[str, Outcome], real: dict[str, Outcome]) -> list[tuple[str, Outcome, Outcome]]:
    return [(step, emulated.get(step), real.get(step)) for step in sorted(set(emulated) | set(real))
            if emulated.get(step) != real.get(step)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True, help="an admin kubeconfig of the real server")
    parser.add_argument("--user-kubeconfig", help="a restricted user's kubeconfig (for the 403 shapes)")
    parser.add_argument("--namespace", default="emu-diff", help="created and deleted by the run")
    parser.add_argument("--json", help="write both outcomes and the differences here")
    args = parser.parse_args(argv)
    emulated = against_emulator(args.namespace)
    real = against_server(args.kubeconfig, args.namespace, args.user_kubeconfig)
    differences = diff(emulated, real)
    for step, emu, srv in differences:
        print(f"## {step}\n  emulator: {json.dumps(emu, sort_keys=True)}\n  real:     {json.dumps(srv, sort_keys=True)}")
    print(f"{len(differences)} of {len(real)} steps differ")
    if args.json:
        Path(args.json).write_text(json.dumps({"emulator": emulated, "real": real,
                                               "differences": [d[0] for d in differences]}, indent=1, sort_keys=True))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
