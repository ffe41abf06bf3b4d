"""The emulator answers as a real kube-apiserver (v1.34) does, where the two were found to differ.

Each test pins one behaviour measured against a real API server with
`python -m tests.support.api_parity` (the differences are listed in its report); they run
against the emulator only, so a change that brings a difference back fails here, fast.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from submitter.contract.errors import ApiUnavailable, ClusterError, Conflict, CrdMissing, NotFound
from submitter.kube import KINDS
from tests.support.api_parity import configmap, raw_apply, rayjob


@pytest.fixture
def ns(kube: Any) -> str:
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "parity"}})
    return "parity"


def api_error(e: BaseException) -> tuple[int, dict]:
    cause = e.__cause__
    return cause.status, json.loads(cause.body or "{}")


def test_a_namespace_is_created_as_the_namespace_strategy_fills_it(kube, ns):
    got = kube.get("Namespace", None, ns)
    assert got["metadata"]["labels"] == {"kubernetes.io/metadata.name": ns}
    assert got["spec"] == {"finalizers": ["kubernetes"]} and got["status"] == {"phase": "Active"}
    assert "generation" not in got["metadata"]


def test_generation_only_on_kinds_that_have_one(kube, ns):
    assert "generation" not in kube.create(configmap(ns, "c", {}))["metadata"]
    assert kube.create(rayjob(ns, "r"))["metadata"]["generation"] == 1


def test_writes_record_their_field_manager(kube, ns):
    created = kube.create(configmap(ns, "c", {"a": "1"}))
    applied, _ = kube.apply(configmap(ns, "c", {"a": "2"}))
    managers = [(m["manager"], m["operation"]) for m in applied["metadata"]["managedFields"]]
    assert [(m["manager"], m["operation"]) for m in created["metadata"]["managedFields"]] == [("submitter", "Update")]
    assert sorted(managers) == [("submitter", "Apply"), ("submitter", "Update")]


@pytest.mark.parametrize("name", ["Bad_Name", "a" * 254])
def test_an_invalid_name_is_422(kube, ns, name):
    with pytest.raises(ClusterError, match=r'ConfigMap ".*" is invalid: metadata.name: Invalid value') as e:
        kube.create(configmap(ns, name, {}))
    assert api_error(e.value)[0] == 422


def test_apply_takes_a_yaml_body(kube, ns):
    text = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\n  namespace: {ns}\ndata:\n  k: v\n"
    status, obj = raw_apply(kube, "ConfigMap", ns, "y", text)
    assert status == 201 and obj["data"] == {"k": "v"}
    status, obj = raw_apply(kube, "ConfigMap", ns, "y", text.replace("k: v", "k: w"))
    assert status == 200 and obj["data"] == {"k": "w"}


def test_a_patch_naming_another_uid_is_422_immutable_which_kube_reads_as_a_conflict(kube, ns):
    """The server's answer is 422 "field is immutable", not 409: `Kube.patch(uid=...)` turns it
    back into the Conflict (exit 8) its callers (stop, resume) expect of a recreated object."""
    kube.create(configmap(ns, "c", {}))
    with pytest.raises(Conflict, match="deleted and recreated meanwhile") as e:
        kube.patch("ConfigMap", ns, "c", {"data": {"a": "1"}}, uid=str(uuid.uuid4()))
    status, body = api_error(e.value)
    assert status == 422 and "metadata.uid: Invalid value" in body["message"] and "immutable" in body["message"]


def test_a_delete_precondition_mismatch_says_both_uids(kube, ns):
    uid = kube.create(configmap(ns, "c", {}))["metadata"]["uid"]
    other = str(uuid.uuid4())
    with pytest.raises(Conflict, match=rf"the UID in the precondition \({other}\) does not match the UID "
                                       rf"in record \({uid}\)"):
        kube.delete("ConfigMap", ns, "c", uid=other)


@pytest.mark.parametrize(("policy", "finalizer"), [("Foreground", "foregroundDeletion"), ("Orphan", "orphan")])
def test_foreground_and_orphan_deletes_answer_the_marked_object(api, kube, ns, policy, finalizer):
    kube.create(configmap(ns, "c", {}))
    k = KINDS["ConfigMap"]
    answer = kube.request("DELETE", k.path(ns, "c"), body={"propagationPolicy": policy})
    assert answer["kind"] == "ConfigMap" and answer["metadata"]["deletionTimestamp"]
    assert answer["metadata"]["finalizers"] == [finalizer]
    assert kube.find("ConfigMap", ns, "c") is None  # no dependents: the GC finishes at once


def test_a_background_delete_answers_status_with_kind(kube, ns):
    kube.create(configmap(ns, "c", {}))
    answer = kube.request("DELETE", KINDS["ConfigMap"].path(ns, "c"), body={"propagationPolicy": "Background"})
    assert answer["kind"] == "Status" and sorted(answer["details"]) == ["kind", "name", "uid"]


def test_deleting_a_namespace_answers_it_terminating_and_empties_it(api, kube, ns):
    kube.create(configmap(ns, "c", {}))
    answer = kube.request("DELETE", KINDS["Namespace"].path(None, ns))
    assert answer["kind"] == "Namespace" and answer["status"]["phase"] == "Terminating"
    assert api.emulator.get("v1/configmaps", ns, "c") is None


def test_list_items_of_builtin_kinds_carry_no_kind_custom_ones_do(kube, ns):
    kube.create(configmap(ns, "c", {}))
    kube.create(rayjob(ns, "r"))
    assert [i.get("kind") for i in kube.list("ConfigMap", ns)["items"]] == [None]
    assert [i.get("kind") for i in kube.list("RayJob", ns)["items"]] == ["RayJob"]


def test_set_based_label_selectors(kube, ns):
    for name, tier in (("a", "a"), ("b", "b"), ("c", None)):
        kube.create(configmap(ns, name, {}, **({"tier": tier} if tier else {})))

    def names(selector: str) -> list[str]:
        return sorted(i["metadata"]["name"] for i in kube.list("ConfigMap", ns, selector=selector)["items"])

    assert names("tier in (a,b)") == ["a", "b"]
    assert names("tier notin (a)") == ["b", "c"]
    assert names("!tier") == ["c"] and names("tier") == ["a", "b"]
    with pytest.raises(ClusterError, match=r"unable to parse requirement: found 'a' expected: '\('"):
        names("tier in a")


def test_field_selectors_inequality_and_unsupported_fields(kube, ns):
    for name in ("a", "b"):
        kube.create(configmap(ns, name, {"x": "1"}))
    path = KINDS["ConfigMap"].path(ns)
    items = kube.request("GET", path, query={"fieldSelector": "metadata.name!=a"})["items"]
    assert [i["metadata"]["name"] for i in items] == ["b"]
    with pytest.raises(ClusterError, match='"data.x" is not a known field selector') as e:
        kube.request("GET", path, query={"fieldSelector": "data.x=1"})
    assert api_error(e.value)[0] == 400
    with pytest.raises(ClusterError, match="field label not supported: status.phase"):
        kube.request("GET", KINDS["RayJob"].path(ns), query={"fieldSelector": "status.phase=x"})


def test_a_resource_not_served_is_a_plain_404_page(kube, ns):
    with pytest.raises(CrdMissing):
        kube.request("GET", f"/apis/ray.io/v1/namespaces/{ns}/nosuchresources/x",
                     what=("get", KINDS["RayJob"], ns, "x"))
    with pytest.raises(NotFound) as e:
        kube.get("ConfigMap", ns, "missing")
    assert sorted(api_error(e.value)[1]["details"]) == ["kind", "name"]  # no empty group


def test_strict_unknown_fields_of_a_custom_resource(api, kube, ns):
    with pytest.raises(ClusterError, match='strict decoding error: unknown field "spec.bogus"') as e:
        kube.create(rayjob(ns, "r", bogus=1))
    assert api_error(e.value)[0] == 400
    bad_meta = rayjob(ns, "m")
    bad_meta["metadata"]["bogus"] = 1
    with pytest.raises(ClusterError, match='unknown field "metadata.bogus"'):
        kube.create(bad_meta)
    # a real server answers a server-side apply with an undeclared field with 500: no outage,
    # so Kube neither retries it nor calls it one, and says which CRD is too old
    mark = len(api.emulator.log)
    with pytest.raises(ClusterError, match="field not declared in schema.*upgrade KubeRay") as e:
        kube.apply(rayjob(ns, "r", bogus=1))
    assert api_error(e.value)[0] == 500 and not isinstance(e.value, ApiUnavailable)
    assert len([r for r in api.emulator.requests_since(mark) if r[0] == "PATCH"]) == 1  # no retries


def test_unknown_fields_are_pruned_and_defaults_filled_without_strict(kube, ns):
    stored = kube.request("POST", KINDS["RayJob"].path(ns), body=rayjob(ns, "r", bogus=1),
                          query={"fieldValidation": "Ignore"})
    assert "bogus" not in stored["spec"]
    assert stored["spec"]["submissionMode"] == "K8sJobMode" and stored["spec"]["backoffLimit"] == 0


def test_the_status_subresource_changes_status_only(kube, ns):
    before = kube.create(rayjob(ns, "r"))
    path = KINDS["RayJob"].path(ns, "r", "status")
    body = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "r", "labels": {"x": "y"}},
            "spec": {"entrypoint": "changed"}, "status": {"message": "m"}}
    after = raw_apply(kube, "RayJob", ns, "r", body, sub="status")[1]
    assert after["spec"] == before["spec"] and "x" not in after["metadata"].get("labels", {})
    assert after["status"] == {"message": "m", "failed": 0, "succeeded": 0}  # with the CRD's defaults
    assert after["metadata"]["generation"] == 1
    with pytest.raises(NotFound):  # a ConfigMap has no status subresource
        kube.request("PATCH", KINDS["ConfigMap"].path(ns, "c", "status"), body={},
                     content_type="application/merge-patch+json")


def test_discovery_lists_subresource_verbs(kube):
    doc = kube.request("GET", "/apis/ray.io/v1")
    verbs = {r["name"]: sorted(r["verbs"]) for r in doc["resources"]}
    assert verbs["rayjobs/status"] == ["get", "patch", "update"]
    assert "deletecollection" in verbs["rayjobs"]


def test_a_watch_with_bookmarks_gets_one_before_its_timeout(kube, ns):
    response = kube.request("GET", KINDS["ConfigMap"].path(ns), stream=True, query={
        "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": "3"})
    events = [json.loads(line) for line in response.read().decode().splitlines() if line.strip()]
    response.release_conn()
    marks = [e for e in events if e["type"] == "BOOKMARK"]
    assert len(marks) == 1 and marks[0]["object"]["kind"] == "ConfigMap"
    assert marks[0]["object"]["metadata"]["resourceVersion"]


def test_forbidden_names_the_object_and_namespace(api, kube, ns):
    api.emulator.deny("get", "secrets")
    with pytest.raises(Exception, match=r'secrets "x" is forbidden: .* in the namespace "parity"'):
        kube.get("Secret", ns, "x")
