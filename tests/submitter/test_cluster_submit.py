"""`submitter submit` against a real HTTP API (kmock emulator) with the real `kubernetes` client."""

from __future__ import annotations

import json

import pytest

import yaml

from submitter.cli import main
from submitter.contract import naming
from submitter.contract.spec import JobSpec
from tests.support.kube_emulator import RAYJOBS

WRITES = ("POST", "PATCH", "PUT", "DELETE")


def submit(runner, kubeconfig, *args):
    return runner.invoke(main, ["submit", "--name", "gpt2-demo", "--kubeconfig", kubeconfig, *args])


def writes(api, mark=0):
    return [(m, p, q) for m, p, q in api.emulator.requests_since(mark) if m in WRITES]


def stored(api, gvr, name, namespace="default"):
    return api.emulator.get(gvr, namespace, name)


def test_submit_applies_every_object_and_prints_next_steps(api, kubeconfig, runner):
    result = submit(runner, kubeconfig)
    assert result.exit_code == 0, result.output
    for gvr, name in [(RAYJOBS, "gpt2-demo"), ("v1/persistentvolumeclaims", "gpt2-demo-checkpoints"),
                      ("v1/serviceaccounts", "gpt2-demo-progress"), ("v1/configmaps", "gpt2-demo-progress"),
                      ("rbac.authorization.k8s.io/v1/roles", "gpt2-demo-progress"),
                      ("rbac.authorization.k8s.io/v1/rolebindings", "gpt2-demo-progress"),
                      ("networking.k8s.io/v1/networkpolicies", "gpt2-demo")]:
        obj = stored(api, gvr, name)
        assert obj is not None, name
        assert obj["metadata"]["uid"] and obj["metadata"]["resourceVersion"]
        # the job's identity on every object (whether render or submit put it there)
        assert naming.annotations("default", "gpt2-demo").items() <= obj["metadata"]["annotations"].items()
        assert naming.labels("gpt2-demo").items() <= obj["metadata"]["labels"].items()
    document = JobSpec.build(name="gpt2-demo").document()
    for gvr, name in [("v1/persistentvolumeclaims", "gpt2-demo-checkpoints"), ("v1/configmaps", "gpt2-demo-progress")]:
        assert stored(api, gvr, name)["metadata"]["annotations"][naming.JOB_DOCUMENT_ANNOTATION] == document
    assert "rayjob/gpt2-demo created" in result.output
    assert "submitter watch gpt2-demo -n default" in result.output
    assert "submitter logs gpt2-demo -n default -f" in result.output
    # created (POST, never a forced apply over someone else's), each after a dry run of all seven;
    # fieldValidation=Strict: an unknown field (an older CRD) is refused, never dropped silently
    sent = [(m, q) for m, p, q in writes(api)]
    strict = {"fieldManager": "submitter", "fieldValidation": "Strict"}
    assert sent == [("POST", {**strict, "dryRun": "All"})] * 7 + [("POST", strict)] * 7


def test_second_identical_submit_changes_nothing(api, kubeconfig, runner):
    assert submit(runner, kubeconfig).exit_code == 0
    before = api.emulator.rv
    history = len(api.emulator.history)
    result = submit(runner, kubeconfig)
    assert result.exit_code == 0, result.output
    assert api.emulator.rv == before and len(api.emulator.history) == history  # no object changed
    assert result.output.count(" unchanged") == 7


def test_changed_spec_of_a_running_job_is_refused_with_the_way_out(api, kubeconfig, runner):
    from tests.support.fake_operator import FakeOperator

    assert submit(runner, kubeconfig).exit_code == 0
    op = FakeOperator(api.emulator, "gpt2-demo")
    op.initialize()
    op.run()
    mark = len(api.emulator.log)
    result = submit(runner, kubeconfig, "--replicas", "8")
    assert result.exit_code == 8
    assert "already exists (RUNNING) with a different spec" in result.output
    assert "replicas: 2 -> 8" in result.output
    for way_out in ("another --name", "submitter delete gpt2-demo", "nothing was changed"):
        assert way_out in result.output
    assert writes(api, mark) == []
    assert stored(api, RAYJOBS, "gpt2-demo")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2


def test_resubmit_of_a_finished_job_points_to_resume(api, kubeconfig, runner):
    from tests.support.fake_operator import FakeOperator

    assert submit(runner, kubeconfig).exit_code == 0
    FakeOperator(api.emulator, "gpt2-demo").fail()
    result = submit(runner, kubeconfig)
    assert result.exit_code == 0
    assert "already finished (FAILED)" in result.output and "submitter resume gpt2-demo" in result.output
    changed = submit(runner, kubeconfig, "--epochs", "5")
    assert changed.exit_code == 8 and "submitter resume gpt2-demo" in changed.output


def test_dry_run_client_prints_objects_and_sends_nothing(api, kubeconfig, runner):
    for output, parse in (("yaml", lambda t: list(yaml.safe_load_all(t))),
                          ("json", lambda t: json.loads(t)["items"])):
        result = submit(runner, kubeconfig, "--dry-run=client", "-o", output)
        assert result.exit_code == 0, result.output
        kinds = [o["kind"] for o in parse(result.stdout)]
        assert kinds == ["PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
                         "NetworkPolicy", "RayJob"]
    assert api.emulator.log == []


def test_a_default_image_is_named_in_one_line_with_the_way_to_use_your_own(api, kubeconfig, runner):
    """The default image exists only once the release workflow pushed it (issue 33): submit
    says which one a job runs and how to run your own, on stderr, so `-o yaml` stays YAML."""
    from submitter.contract.spec import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE

    result = submit(runner, kubeconfig)
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("image: ")]
    assert line.startswith(f"image: {DEFAULT_IMAGE} (the project's default") and "--image" in line
    assert "image: " not in result.stdout
    gpu = submit(runner, kubeconfig, "--name", "gpt2-gpu", "--gpu-per-pod", "1", "--dry-run=client",
                 "-o", "yaml")
    assert gpu.exit_code == 0, gpu.output
    assert gpu.stderr.startswith(f"image: {DEFAULT_GPU_IMAGE} (") and gpu.stderr.count("\n") == 1
    assert list(yaml.safe_load_all(gpu.stdout))[-1]["kind"] == "RayJob"
    own = submit(runner, kubeconfig, "--name", "gpt2-own", "--image", "registry.example.com/ml/gpt2:1")
    assert own.exit_code == 0, own.output
    assert "image: " not in own.output and "--image" not in own.output


def test_dry_run_server_sends_dry_run_all_and_persists_nothing(api, kubeconfig, runner):
    result = submit(runner, kubeconfig, "--dry-run=server", "-o", "json")
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["items"]
    assert [o["kind"] for o in items][-1] == "RayJob" and items[-1]["metadata"]["uid"]
    sent = [q for m, p, q in writes(api)]
    assert len(sent) == 7 and all(q.get("dryRun") == "All" for q in sent)
    assert stored(api, RAYJOBS, "gpt2-demo") is None
    assert stored(api, "v1/persistentvolumeclaims", "gpt2-demo-checkpoints") is None
    text = submit(runner, kubeconfig, "--dry-run=server")
    assert text.exit_code == 0
    assert "rayjob/gpt2-demo created (server dry run)" in text.stdout
    assert "nothing changed" in text.stderr and "submitter watch" not in text.stdout
    assert stored(api, RAYJOBS, "gpt2-demo") is None


def test_kubeconfig_from_the_environment(api, kubeconfig, runner, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    result = runner.invoke(main, ["submit", "--name", "gpt2-demo"])
    assert result.exit_code == 0, result.output
    assert stored(api, RAYJOBS, "gpt2-demo") is not None


def test_bad_input_is_one_line_exit_2_and_touches_nothing(api, kubeconfig, runner):
    result = submit(runner, kubeconfig, "--storage-path", "/tmp/ckpt")
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert "Traceback" not in result.output
    assert api.emulator.log == []


def test_crd_missing_says_how_to_install_kuberay(api, kubeconfig, runner):
    api.emulator.uninstall_rayjob_crd()
    result = submit(runner, kubeconfig)
    assert result.exit_code == 9
    assert "RayJob CRD (rayjobs.ray.io) is not installed" in result.output
    assert "helm install kuberay-operator" in result.output
    assert writes(api) == []


def test_crd_missing_on_a_direct_rayjob_request_is_crd_missing(kube, api):
    from submitter.contract.errors import CrdMissing

    api.emulator.uninstall_rayjob_crd()
    try:
        kube.get("RayJob", "default", "x")
    except CrdMissing as e:
        assert "KubeRay" in str(e) and isinstance(e.__cause__, Exception)
    else:
        raise AssertionError("no CrdMissing")


def test_missing_namespace_is_refused_before_any_write(api, kubeconfig, runner):
    result = submit(runner, kubeconfig, "-n", "nowhere")
    assert result.exit_code == 2
    assert "namespace nowhere does not exist" in result.output
    assert writes(api) == []


def test_existing_pvc_must_exist_and_be_read_write_many(api, kubeconfig, runner):
    missing = submit(runner, kubeconfig, "--existing-pvc", "shared")
    assert missing.exit_code == 2 and "--existing-pvc shared does not exist" in missing.output
    for mode in ("ReadWriteOnce", "ReadOnlyMany"):
        api.emulator.put("v1", "persistentvolumeclaims", {
            "metadata": {"name": "shared", "namespace": "default"},
            "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}}})
        refused = submit(runner, kubeconfig, "--existing-pvc", "shared")
        assert refused.exit_code == 2, refused.output
        assert f"is {mode}, not ReadWriteMany" in refused.output
    assert writes(api) == []
    api.emulator.put("v1", "persistentvolumeclaims", {
        "metadata": {"name": "shared", "namespace": "default"}, "spec": {"accessModes": ["ReadWriteMany"]}})
    ok = submit(runner, kubeconfig, "--existing-pvc", "shared")
    assert ok.exit_code == 0, ok.output
    assert stored(api, "v1/persistentvolumeclaims", "gpt2-demo-checkpoints") is None  # not created
    volumes = stored(api, RAYJOBS, "gpt2-demo")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "shared"}} in volumes


def test_500_and_429_on_submit_are_retried(api, kubeconfig, runner):
    api.emulator.fail("POST", r"/rayjobs$", status=500, times=2, dry_run=False)
    api.emulator.fail("POST", r"/configmaps$", status=429, retry_after="0", times=1, dry_run=False)
    result = submit(runner, kubeconfig)
    assert result.exit_code == 0, result.output
    created = [p for m, p, q in writes(api) if "dryRun" not in q]
    assert created.count("/apis/ray.io/v1/namespaces/default/rayjobs") == 3
    assert created.count("/api/v1/namespaces/default/configmaps") == 2
    assert stored(api, RAYJOBS, "gpt2-demo") is not None
    assert "rayjob/gpt2-demo created" in result.output


def test_connection_reset_is_retried(api, kubeconfig, runner):
    api.emulator.fail("POST", r"/rolebindings$", reset=True, times=1, dry_run=False)
    result = submit(runner, kubeconfig)
    assert result.exit_code == 0, result.output
    assert stored(api, "rbac.authorization.k8s.io/v1/rolebindings", "gpt2-demo-progress") is not None


def test_persistent_5xx_gives_up_with_one_line_and_a_partial_report(api, kubeconfig, runner, monkeypatch):
    monkeypatch.setenv("SUBMITTER_API_RETRIES", "2")
    api.emulator.fail("POST", r"/rayjobs$", status=503, times=100, dry_run=False)
    result = submit(runner, kubeconfig)
    assert result.exit_code == 4  # the API could not be asked: not "the job failed"
    line = result.output.strip()
    assert "\n" not in line and "kept failing (503" in line
    assert "applied: persistentvolumeclaim/gpt2-demo-checkpoints created" in line
    assert "not applied: rayjob/gpt2-demo" in line


def test_403_names_the_verb_and_resource_and_nothing_is_written(api, kubeconfig, runner):
    api.emulator.deny("create", "rolebindings")
    result = submit(runner, kubeconfig)
    assert result.exit_code == 7
    assert "you may not create rolebindings.rbac.authorization.k8s.io in namespace default" in result.output
    assert "server dry run; nothing was written" in result.output
    assert [q for m, p, q in writes(api) if "dryRun" not in q] == []


def test_409_conflict_is_reported(api, kubeconfig, runner):
    api.emulator.fail("POST", r"/serviceaccounts$", status=409, times=1)
    result = submit(runner, kubeconfig)
    assert result.exit_code == 8
    assert "conflict on serviceaccounts/gpt2-demo-progress in namespace default" in result.output
    assert stored(api, RAYJOBS, "gpt2-demo") is None


def test_unreachable_api_is_one_line(tmp_path, runner, monkeypatch):
    import socket

    monkeypatch.setenv("SUBMITTER_API_RETRIES", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from tests.support.kube_emulator import Running

    config = Running(None, f"http://127.0.0.1:{port}", None).kubeconfig(tmp_path / "kc")  # type: ignore[arg-type]
    result = submit(runner, config)
    assert result.exit_code == 4
    assert result.output.startswith(f"error: cannot reach the Kubernetes API at http://127.0.0.1:{port}")


def test_bad_kubeconfig_is_a_usage_error(tmp_path, runner):
    bad = tmp_path / "kc"
    bad.write_text("this: is: not a kubeconfig")
    result = submit(runner, str(bad))
    assert result.exit_code == 2 and "cannot load --kubeconfig" in result.output


def test_help_stays_light():
    """Which modules may import kubernetes at all is import-linter's (tests/test_layers.py)."""
    import subprocess
    import sys

    code = ("import sys; from submitter.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('kubernetes', 'ray', 'torch', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_retries_are_ours_within_the_deadline_not_urllib3s(kube):
    """urllib3's Retry would multiply each attempt's read timeout; Kube.request retries itself."""
    assert kube.api.rest_client.pool_manager.connection_pool_kw["retries"].total is False
    assert kube.request_timeout == 30.0


@pytest.mark.parametrize("how", ["flag", "env", "home"])
def test_a_kubeconfig_that_does_not_exist_says_so(tmp_path, runner, monkeypatch, how):
    """Not "Invalid kube-config file" (the client's words for a file that is not there)."""
    missing = tmp_path / "nope" / "config"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    if how == "env":
        monkeypatch.setenv("KUBECONFIG", str(missing))
    if how == "home":
        monkeypatch.setenv("HOME", str(tmp_path))
    args = ["submit", "--name", "gpt2-demo"] + (["--kubeconfig", str(missing)] if how == "flag" else [])
    result = runner.invoke(main, args)
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.count("\n") == 0 and "does not exist" in line and "Invalid" not in line, line
    assert {"flag": f"--kubeconfig {missing}", "env": f"KUBECONFIG={missing}",
            "home": "~/.kube/config"}[how] in line
