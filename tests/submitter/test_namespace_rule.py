"""Issue 33, items 4 and 5: one namespace rule, and GitOps output that depends on its input alone.

`render` (every output, `--helm-values` too) and `init` read no kubeconfig unless asked
(`--namespace-from-context`, `--context`, `--kubeconfig`): the same command gives the same bytes on
any machine. `submit` and the commands that find a job take the kubeconfig context's namespace,
as kubectl does (tests/submitter/test_kubectl_habits.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from submitter import api
from submitter.cli import main
from submitter.cli_options import NAMESPACE_HELP
from submitter.contract import naming
from submitter.contract.spec import JobSpec

JOB = ["--name", "gpt2-demo", "--replicas", "4", "--gpu-per-pod", "1"]


def _kubeconfig(path: Path, namespace: str, context: str = "ctx") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": context, "context": {"cluster": "c", "user": "u", "namespace": namespace}},
                     {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "team-c"}}]}))
    return str(path)


@pytest.fixture
def machines(tmp_path):
    """Three machines: $KUBECONFIG at a team-a context; ~/.kube/config at a team-b context; none."""
    bare = {"KUBECONFIG": None, "HOME": str(tmp_path / "bare"), "KUBERNETES_SERVICE_HOST": None}
    _kubeconfig(tmp_path / "home-b" / ".kube" / "config", "team-b")
    return {"env-a": {**bare, "KUBECONFIG": _kubeconfig(tmp_path / "a.yaml", "team-a")},
            "home-b": {**bare, "HOME": str(tmp_path / "home-b")},
            "bare": bare}


def _outputs(runner, env, where: Path, *extra: str) -> dict[str, bytes]:
    out = {}
    for name, args in {"yaml": [], "json": ["-o", "json"], "jobfile": ["-o", "jobfile"],
                       "helm-values": ["--helm-values"]}.items():
        result = runner.invoke(main, ["render", *JOB, *extra, *args], env=env)
        assert result.exit_code == 0, result.output
        out[name] = result.stdout_bytes
    result = runner.invoke(main, ["render", *JOB, *extra, "--output-dir", str(where)], env=env)
    assert result.exit_code == 0, result.output
    out.update({f"dir/{p.name}": p.read_bytes() for p in sorted(where.iterdir())})
    init = runner.invoke(main, ["init", *JOB, *extra, "-"], env=env)
    assert init.exit_code == 0, init.output
    out["init"] = init.stdout_bytes
    return out


def test_the_same_render_gives_the_same_bytes_under_any_kubeconfig(runner, machines, tmp_path):
    seen = {machine: _outputs(runner, env, tmp_path / "out" / machine) for machine, env in machines.items()}
    assert len(seen["bare"]) > 8  # 4 outputs, init and the directory's files
    assert seen["env-a"] == seen["bare"] and seen["home-b"] == seen["bare"]
    objects = list(yaml.safe_load_all(seen["bare"]["yaml"]))
    assert {o["metadata"]["namespace"] for o in objects} == {"default"}
    # the job's uid is derived from what is rendered (namespace/name), not from the machine
    assert {o["metadata"]["annotations"][naming.JOB_UID_ANNOTATION] for o in objects} == \
        {naming.job_uid("default", "gpt2-demo")}
    assert yaml.safe_load(seen["bare"]["helm-values"])["namespace"] == "default"


def test_n_gives_the_same_bytes_everywhere_too(runner, machines, tmp_path):
    seen = [_outputs(runner, env, tmp_path / "out-n" / machine, "-n", "ml")
            for machine, env in machines.items()]
    assert seen[0] == seen[1] == seen[2]
    assert {o["metadata"]["namespace"] for o in yaml.safe_load_all(seen[0]["yaml"])} == {"ml"}


def _namespaces(runner, env, *args: str) -> set[str]:
    result = runner.invoke(main, ["render", "--name", "j", *args], env=env)
    assert result.exit_code == 0, result.output
    return {o["metadata"]["namespace"] for o in yaml.safe_load_all(result.stdout)}


def test_render_reads_the_kubeconfig_only_when_asked(runner, machines, tmp_path):
    env_a, home_b = machines["env-a"], machines["home-b"]
    assert _namespaces(runner, env_a, "--namespace-from-context") == {"team-a"}
    assert _namespaces(runner, home_b, "--namespace-from-context") == {"team-b"}
    assert _namespaces(runner, machines["bare"], "--namespace-from-context") == {"default"}
    other = _kubeconfig(tmp_path / "other.yaml", "team-d")
    assert _namespaces(runner, env_a, "--kubeconfig", other) == {"team-d"}  # implies it
    assert _namespaces(runner, env_a, "--context", "other") == {"team-c"}
    assert _namespaces(runner, env_a, "--namespace-from-context", "-n", "ml") == {"ml"}  # -n wins
    init = runner.invoke(main, ["init", "--name", "j", "--namespace-from-context", "-"], env=home_b)
    assert yaml.safe_load(init.stdout)["namespace"] == "team-b"


def test_a_job_files_namespace_wins_like_n(runner, machines, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: j\nnamespace: ml\n")
    assert _namespaces(runner, machines["env-a"], "-f", str(job), "--namespace-from-context") == {"ml"}


def test_the_api_follows_the_same_rule(machines, monkeypatch):
    for key, value in machines["env-a"].items():
        monkeypatch.delenv(key, raising=False) if value is None else monkeypatch.setenv(key, value)
    spec = JobSpec.build(name="j")
    assert spec.namespace == "default"  # a spec is input: render(spec) reads no kubeconfig
    assert {o["metadata"]["namespace"] for o in api.render(spec)} == {"default"}
    assert api.placed(spec).namespace == "team-a"  # submit(spec) goes where `submitter submit` would
    assert api.placed(spec, context="other").namespace == "team-c"
    assert api.placed(JobSpec.build(name="j", namespace="default")).namespace == "default"


@pytest.mark.parametrize("command", ["render", "init", "submit", "watch", "status", "list", "report"])
def test_every_n_says_the_one_rule(runner, command):
    text = " ".join(runner.invoke(main, [command, "--help"]).output.split())
    assert " ".join(NAMESPACE_HELP.split()) in text
