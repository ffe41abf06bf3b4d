"""No silent downgrade: token auth is never dropped by an older KubeRay. `submit` reads the
installed RayJob CRD first (the real v1.7.0 one, and a copy without authOptions as v1.5.0 was),
and every write asks for fieldValidation=Strict."""

from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import yaml

from submitter.cli import main
from submitter.cluster import crd_has_auth_options
from tests.conftest import shared_file

WRITES = ("POST", "PATCH", "PUT", "DELETE")
CRDS = "apiextensions.k8s.io/v1"


@lru_cache(maxsize=1)
def _crd_1_7() -> dict:
    return yaml.load(shared_file("kuberay-crds", "ray.io_rayjobs.yaml").read_text(),
                     Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def kuberay_crd(version: str) -> dict:
    """The RayJob CRD of KubeRay v1.7.0, or as v1.5.0 had it (no rayClusterSpec.authOptions)."""
    crd = copy.deepcopy(_crd_1_7())
    if version == "1.5.0":
        for v in crd["spec"]["versions"]:
            props = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            props.get("rayClusterSpec", {}).get("properties", {}).pop("authOptions", None)
    return crd


def install(api, version: str) -> None:
    api.emulator.put(CRDS, "customresourcedefinitions", kuberay_crd(version))


def submit(runner, kubeconfig, *args):
    return runner.invoke(main, ["submit", "--name", "gpt2-demo", "--kubeconfig", kubeconfig, *args])


def writes(api):
    return [(m, p) for m, p, q in api.emulator.log if m in WRITES]


def test_the_crds_of_kuberay_1_7_and_1_5_0_differ_in_auth_options():
    assert crd_has_auth_options(kuberay_crd("1.7.0"))
    assert not crd_has_auth_options(kuberay_crd("1.5.0"))
    assert not crd_has_auth_options({"spec": {"versions": []}})


def test_token_auth_on_kuberay_1_5_0_is_refused_before_any_write(api, kubeconfig, runner):
    install(api, "1.5.0")
    result = submit(runner, kubeconfig)
    assert result.exit_code == 2, result.output
    line = result.output
    assert line.startswith("error: ") and line.count("\n") == 1 and "Traceback" not in line
    assert "authOptions" in line and "KubeRay >= 1.5.1" in line and "--ray-auth disabled" in line
    assert "nothing was written" in line
    assert writes(api) == []  # not even a dry run
    reads = [p for m, p, q in api.emulator.log if m == "GET"]
    assert "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayjobs.ray.io" in reads


def test_kuberay_1_7_passes_and_disabled_auth_passes_on_1_5_0(api, kubeconfig, runner):
    install(api, "1.7.0")
    assert submit(runner, kubeconfig).exit_code == 0
    install(api, "1.5.0")
    result = submit(runner, kubeconfig, "--name", "plain", "--ray-auth", "disabled")
    assert result.exit_code == 0, result.output


def test_without_the_right_to_read_crds_strict_validation_is_the_backstop(api, kubeconfig, runner):
    """A namespace user may not read CRDs (cluster-scoped): submit goes on, and the server's
    strict field validation refuses the unknown field in the dry run, with the fix."""
    install(api, "1.5.0")
    api.emulator.deny("get", "customresourcedefinitions")

    api.emulator.validate("rayjobs", v1_5_0_api_server(api))
    result = submit(runner, kubeconfig)
    assert result.exit_code == 10
    assert "unknown field" in result.output and "upgrade KubeRay" in result.output and "1.5.1" in result.output
    assert "nothing was written" in result.output
    assert [q.get("fieldValidation") for m, p, q in api.emulator.log if m in WRITES] == \
        ["Strict"] * len([1 for m, p, q in api.emulator.log if m in WRITES])
    assert [p for m, p, q in api.emulator.log if m in WRITES and q.get("dryRun") != "All"] == []


def v1_5_0_api_server(api):
    """What an API server with KubeRay v1.5.0's CRD does with `authOptions`: prunes it without a
    word, or under fieldValidation=Strict refuses it (the request being served is the log's last)."""
    def check(obj):
        if "authOptions" not in obj["spec"]["rayClusterSpec"]:
            return []
        if api.emulator.log[-1][2].get("fieldValidation") == "Strict":
            return ['strict decoding error: unknown field "spec.rayClusterSpec.authOptions"']
        del obj["spec"]["rayClusterSpec"]["authOptions"]  # the silent downgrade
        return []
    return check


def test_the_downgrade_that_strict_validation_prevents(api, kube):
    """Without Strict the token-auth RayJob is stored without authOptions: the dashboard would be
    open. With it (what every create and apply sends) the server refuses instead."""
    from submitter import kube as kube_module
    from submitter.contract.errors import ClusterError
    from submitter.contract.spec import JobSpec
    from submitter.ownership import owned_objects
    from submitter.render import render

    api.emulator.validate("rayjobs", v1_5_0_api_server(api))
    spec = JobSpec.build(name="gpt2-demo")
    rayjob = next(o for o in owned_objects(render(spec), spec) if o["kind"] == "RayJob")
    with pytest.raises(ClusterError, match="unknown field.*upgrade KubeRay"):
        kube.create(rayjob)
    original = kube_module.FIELD_VALIDATION
    try:
        kube_module.FIELD_VALIDATION = None  # as before: the parameter not sent
        kube.create(rayjob)
    finally:
        kube_module.FIELD_VALIDATION = original
    stored = api.emulator.get("ray.io/v1/rayjobs", "default", "gpt2-demo")
    assert "authOptions" not in stored["spec"]["rayClusterSpec"]


@pytest.mark.parametrize("verb", ["create", "apply"])
def test_creates_and_applies_send_field_validation_strict(api, kube, verb):
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"},
           "data": {"a": "b"}}
    mark = len(api.emulator.log)
    if verb == "create":
        kube.create(obj)
    else:
        kube.apply(obj)
    [(method, _, query)] = api.emulator.requests_since(mark)
    assert method == ("POST" if verb == "create" else "PATCH")
    assert query["fieldValidation"] == "Strict"
