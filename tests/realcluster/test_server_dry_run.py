"""What `render`, the Helm chart and `data prepare --dry-run=client` print is accepted by the real
API server (server-side dry run, strict field validation, the user's RBAC, the KubeRay CRD's
structural schema), and the RayJob comes back with the CRD's defaults filled in."""

from __future__ import annotations

import pytest
import yaml

from tests.support.real_cluster import NAMESPACE, ROOT, job_file

SCRIPT = ROOT / "tests" / "scripts" / "torch_regression.py"


def accepted(control_plane, objects: list[dict]) -> dict[str, dict]:
    """Each object POSTed with dryRun=All as the restricted user; what the server answered.

    A RoleBinding to a Role that is only being created is the one exception, as
    `cluster.install` knows: the server resolves the Role to check the user may grant it, and a
    dry run persisted none, so the user gets 404 naming the Role; an admin (who may bind
    anything) gets it accepted."""
    from submitter.contract.errors import NotFound
    from submitter.kube import Kube

    user = Kube(kubeconfig=str(control_plane.user_kubeconfig))
    admin = Kube(kubeconfig=str(control_plane.admin_kubeconfig))
    out = {}
    for obj in objects:
        obj.setdefault("metadata", {}).setdefault("namespace", NAMESPACE)
        key = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "RoleBinding":
            with pytest.raises(NotFound, match=f"roles?.*{obj['roleRef']['name']}|{obj['roleRef']['name']}"):
                user.create(obj, dry_run=True)
            out[key] = admin.create(obj, dry_run=True)
        else:
            out[key] = user.create(obj, dry_run=True)
    return out


def rendered(control_plane, *args: str) -> list[dict]:
    """What the command prints, for the user's namespace (render is pure: no kubeconfig read)."""
    result = control_plane.submitter(*args, "-n", NAMESPACE)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_render_of_the_gpt2_job_is_accepted(control_plane, tmp_path):
    objects = rendered(control_plane, "render", "-f", str(job_file(tmp_path, name="rc-dry")))
    answered = accepted(control_plane, objects)
    assert set(answered) == {f"{o['kind']}/{o['metadata']['name']}" for o in objects}
    rayjob = answered["RayJob/rc-dry"]
    sent = next(o for o in objects if o["kind"] == "RayJob")
    # the CRD's structural schema kept every field we sent (nothing pruned), and its defaults
    # are all the server added: what a later comparison of spec must allow for
    assert not missing(sent["spec"], rayjob["spec"]), missing(sent["spec"], rayjob["spec"])
    assert sorted(missing(rayjob["spec"], sent["spec"])) == sorted(
        ["rayClusterSpec.workerGroupSpecs[0].numOfHosts"] + [
            f"rayClusterSpec.headGroupSpec.template.spec.containers[0].ports[{i}].protocol"
            for i in range(len(sent["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
                               ["containers"][0].get("ports") or []))])
    assert control_plane.rayjob("rc-dry") is None  # a dry run writes nothing


def missing(sent: object, got: object, path: str = "") -> list[str]:
    """The leaves of `sent` that `got` lacks or holds otherwise (dotted paths)."""
    if isinstance(sent, dict) and isinstance(got, dict):
        return [m for k, v in sent.items() for m in (missing(v, got[k], f"{path}.{k}".lstrip("."))
                                                      if k in got else [f"{path}.{k}".lstrip(".")])]
    if isinstance(sent, list) and isinstance(got, list) and len(sent) == len(got):
        return [m for i, (a, b) in enumerate(zip(sent, got)) for m in missing(a, b, f"{path}[{i}]")]
    return [] if sent == got else [path]


def test_a_script_job_and_a_prepare_job_are_accepted(control_plane, tmp_path):
    script = rendered(control_plane, "render", "--name", "rc-script", "--script", str(SCRIPT),
                      "--replicas", "2", "--cpu-per-pod", "2", "--ray-auth", "disabled",
                      "--script-args=--epochs", "--script-args=2")
    assert {o["kind"] for o in script} >= {"RayJob", "ConfigMap"}
    accepted(control_plane, script)
    prepare = rendered(control_plane, "data", "prepare", "--name", "rc-corpus", "--replicas", "1",
                       "--ray-auth", "disabled", "--dry-run=client", "-o", "yaml")
    assert any(o["kind"] == "RayJob" for o in prepare)
    accepted(control_plane, prepare)


def test_the_helm_charts_output_is_accepted(control_plane, tmp_path):
    from tests.support.helm import render_chart

    values = control_plane.submitter("render", "-f", str(job_file(tmp_path, name="rc-helm")), "--helm-values")
    assert values.returncode == 0, values.stderr
    objects = list(render_chart(yaml.safe_load(values.stdout), release="rc-helm", namespace=NAMESPACE).values())
    assert any(o["kind"] == "RayJob" for o in objects)
    accepted(control_plane, objects)


def test_the_user_role_is_what_the_docs_give(control_plane):
    """The Role the control plane binds the user to is docs/cluster/user-role.yaml, unchanged."""
    from kubernetes import client

    doc = yaml.safe_load((ROOT / "docs" / "cluster" / "user-role.yaml").read_text())
    role = client.RbacAuthorizationV1Api(control_plane.admin).read_namespaced_role("submitter-user", NAMESPACE)
    assert [(r.api_groups, r.resources, r.verbs) for r in role.rules] == \
        [(r["apiGroups"], r["resources"], r["verbs"]) for r in doc["rules"]]
