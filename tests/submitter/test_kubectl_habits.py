"""Behaving like kubectl: the context's namespace, `list -A/-l/--state/-o wide`, strict `-o`,
completion of job names from the cluster (real client, API emulator)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from submitter.cli import main
from submitter.cli_options import default_namespace
from tests.support.fake_operator import FakeOperator
from tests.support.kube_emulator import RAYJOBS, running_emulator


def _kubeconfig(path, contexts, current):
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": n, "context": {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})}}
                     for n, ns in contexts.items()]}))
    return str(path)


# --- the namespace ------------------------------------------------------------------------------

def test_default_namespace_follows_the_context(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = _kubeconfig(tmp_path / "a", {"team-a": "team-a", "bare": None}, "team-a")
    assert default_namespace(None, cfg) == "team-a"
    assert default_namespace("bare", cfg) == "default"
    assert default_namespace("missing", cfg) == "default"
    assert default_namespace(None, str(tmp_path / "nope")) == "default"
    (tmp_path / "broken").write_text("{not: [yaml")
    assert default_namespace(None, str(tmp_path / "broken")) == "default"
    assert default_namespace() == "default"
    # $KUBECONFIG list: the first file that sets current-context wins; contexts merge
    other = _kubeconfig(tmp_path / "b", {"team-b": "team-b"}, "team-b")
    (tmp_path / "c").write_text(yaml.safe_dump({"contexts": [{"name": "x", "context": {"namespace": "x-ns"}}]}))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "c"), other, cfg]))
    assert default_namespace() == "team-b"
    assert default_namespace("x") == "x-ns"


def test_in_a_pod_without_a_kubeconfig_the_service_accounts_namespace(tmp_path, monkeypatch):
    import submitter.cli_options as options

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    sa = tmp_path / "namespace"
    sa.write_text("ml-jobs\n")
    monkeypatch.setattr(options, "SERVICE_ACCOUNT_NAMESPACE", str(sa))
    assert default_namespace() == "ml-jobs"
    sa.unlink()
    assert default_namespace() == "default"


def test_render_reads_the_contexts_namespace_only_when_asked_and_without_importing_kubernetes(tmp_path):
    """GitOps output depends on its input alone: render without -n is `default` whatever the
    kubeconfig says; --namespace-from-context reads it (as submit does), still without the
    kubernetes client (tests/submitter/test_namespace_rule.py has the rest of the rule)."""
    cfg = _kubeconfig(tmp_path / "cfg", {"team-a": "team-a"}, "team-a")
    code = ("import sys; from submitter.cli import main; main(['render', '--name', 'j'])")
    env = {**os.environ, "KUBECONFIG": cfg, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    asked = code.replace("'j'])", "'j', '--namespace-from-context'])")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", asked], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    namespaces = {d["metadata"].get("namespace") for d in yaml.safe_load_all(done.stdout) if d}
    assert namespaces == {"team-a"}
    assert " kubernetes" not in done.stderr and "| kubernetes" not in done.stderr  # -X importtime lists imports
    flagged = subprocess.run([sys.executable, "-c", asked.replace("'j',", "'j', '-n', 'other',")],
                             env=env, capture_output=True, text=True)
    assert {d["metadata"].get("namespace") for d in yaml.safe_load_all(flagged.stdout) if d} == {"other"}
    unasked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert {d["metadata"].get("namespace") for d in yaml.safe_load_all(unasked.stdout) if d} == {"default"}


@pytest.fixture
def team_a():
    """An emulator with namespaces default and team-a, and a kubeconfig whose context is team-a."""
    with running_emulator(namespaces=("default", "team-a", "team-b")) as running:
        yield running


def test_submit_and_status_use_the_contexts_namespace(team_a, tmp_path, runner, monkeypatch):
    monkeypatch.setenv("SUBMITTER_API_BACKOFF", "0.01")
    cfg = team_a.kubeconfig(tmp_path / "kubeconfig", namespace="team-a")
    result = runner.invoke(main, ["submit", "--name", "j", "--kubeconfig", cfg])
    assert result.exit_code == 0, result.output
    assert team_a.emulator.get(RAYJOBS, "team-a", "j") is not None
    assert team_a.emulator.get(RAYJOBS, "default", "j") is None
    assert runner.invoke(main, ["status", "j", "--kubeconfig", cfg]).exit_code == 0
    assert runner.invoke(main, ["status", "j", "--kubeconfig", cfg, "-n", "default"]).exit_code == 6


def test_the_api_submits_and_finds_a_job_where_the_cli_does(team_a, tmp_path, monkeypatch):
    """`submitter.submit(JobSpec.build(name=...))` without a namespace goes to the context's, as
    `submitter submit` does, so `submitter.status(name)` finds it (JobSpec.build said `default`)."""
    import submitter
    from submitter.contract.spec import JobSpec

    monkeypatch.setenv("SUBMITTER_API_BACKOFF", "0.01")
    cfg = team_a.kubeconfig(tmp_path / "kubeconfig", namespace="team-a")
    done = submitter.submit(JobSpec.build(name="k"), kubeconfig=cfg)
    assert done.namespace == "team-a" and team_a.emulator.get(RAYJOBS, "team-a", "k") is not None
    assert submitter.status("k", kubeconfig=cfg).namespace == "team-a"
    ml = submitter.submit(JobSpec.build(name="m", namespace="team-b"), kubeconfig=cfg)
    assert ml.namespace == "team-b" and team_a.emulator.get(RAYJOBS, "team-b", "m") is not None


# --- list ---------------------------------------------------------------------------------------

def _three_jobs(team_a, cfg, runner):
    for name, ns in (("a", "team-a"), ("b", "team-a"), ("c", "team-b")):
        result = runner.invoke(main, ["submit", "--name", name, "-n", ns, "--kubeconfig", cfg])
        assert result.exit_code == 0, result.output
    for name, ns in (("a", "team-a"), ("c", "team-b")):  # a label someone added (kubectl label)
        team_a.emulator.merge(RAYJOBS, ns, name, {"metadata": {"labels": {"team": "nlp"}}})
    op = FakeOperator(team_a.emulator, "a", "team-a")
    op.initialize()
    op.run()
    FakeOperator(team_a.emulator, "c", "team-b").initialize()


def test_list_namespace_column_selector_state_and_wide(team_a, tmp_path, runner, monkeypatch):
    monkeypatch.setenv("SUBMITTER_API_BACKOFF", "0.01")
    cfg = team_a.kubeconfig(tmp_path / "kubeconfig", namespace="team-a")
    _three_jobs(team_a, cfg, runner)
    here = runner.invoke(main, ["list", "--kubeconfig", cfg]).stdout.splitlines()
    assert here[0].split()[0] == "JOB" and [line.split()[0] for line in here[1:]] == ["a", "b"]
    everywhere = runner.invoke(main, ["list", "-A", "--kubeconfig", cfg]).stdout.splitlines()
    assert everywhere[0].split()[:2] == ["NAMESPACE", "JOB"]
    assert [tuple(line.split()[:3]) for line in everywhere[1:]] == [
        ("team-a", "a", "RUNNING"), ("team-a", "b", "PENDING"), ("team-b", "c", "STARTING")]
    labelled = json.loads(runner.invoke(main, ["list", "-A", "-l", "team=nlp", "-o", "json", "--kubeconfig", cfg]).stdout)
    assert [(j["namespace"], j["job"]) for j in labelled] == [("team-a", "a"), ("team-b", "c")]
    running = runner.invoke(main, ["list", "-A", "--state", "running", "-o", "yaml", "--kubeconfig", cfg]).stdout
    assert [j["job"] for j in yaml.safe_load(running)] == ["a"]
    wide = runner.invoke(main, ["list", "-A", "--state", "STARTING", "-o", "wide", "--kubeconfig", cfg]).stdout
    assert "RAY CLUSTER" in wide.splitlines()[0] and "c-raycluster-abcde" in wide
    none = runner.invoke(main, ["list", "-l", "team=cv", "--kubeconfig", cfg])
    assert none.exit_code == 0 and "no submitter jobs matching team=cv in namespace team-a" in none.stderr
    bad_state = runner.invoke(main, ["list", "--state", "WALKING", "--kubeconfig", cfg])
    assert bad_state.exit_code == 2


@pytest.mark.parametrize("command", [["list"], ["status", "j"], ["watch", "j"]])
@pytest.mark.parametrize("value", ["JSON", "yml", "out/"])
def test_output_accepts_only_its_documented_values(command, value, runner, tmp_path):
    result = runner.invoke(main, [*command, "-o", value, "--kubeconfig", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert f"-o {value}: not an output format here; use one of" in result.stderr
    assert not (tmp_path / "out").exists() and not os.path.exists(value)


# --- completion -----------------------------------------------------------------------------------

def _complete(cfg, words, env_extra=None):
    env = {**os.environ, "_SUBMITTER_COMPLETE": "bash_complete", "COMP_WORDS": " ".join(words),
           "COMP_CWORD": str(len(words) - 1), "KUBECONFIG": cfg, **(env_extra or {})}
    code = "from submitter.cli import main; main(prog_name='submitter')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return done


def test_completion_lists_job_names_from_the_cluster(team_a, tmp_path, runner, monkeypatch):
    monkeypatch.setenv("SUBMITTER_API_BACKOFF", "0.01")
    cfg = team_a.kubeconfig(tmp_path / "kubeconfig", namespace="team-a")
    _three_jobs(team_a, cfg, runner)
    done = _complete(cfg, ["submitter", "status", ""])
    assert done.returncode == 0, done.stderr
    assert [line.split(",")[1] for line in done.stdout.splitlines()] == ["a", "b"]
    assert _complete(cfg, ["submitter", "watch", "-n", "team-b", "c"]).stdout.splitlines() == ["plain,c"]
    assert _complete(cfg, ["submitter", "delete", "b"]).stdout.splitlines() == ["plain,b"]


def test_completion_is_silent_when_the_cluster_is_unreachable(tmp_path):
    cfg = _kubeconfig(tmp_path / "cfg", {"x": "x"}, "x")  # server 127.0.0.1:1: connection refused
    started = time.monotonic()
    done = _complete(cfg, ["submitter", "status", ""])
    assert done.returncode == 0 and done.stdout.strip() == "" and done.stderr == ""
    assert time.monotonic() - started < 20  # no retry loop at a shell prompt


def test_the_docs_completion_lines_produce_a_script_for_each_shell():
    from tests.conftest import ROOT

    page = ROOT / "docs" / "cluster" / "index.md"
    lines = [line for line in page.read_text().splitlines() if "_SUBMITTER_COMPLETE=" in line]
    shells = {}
    for line in lines:
        mode = line.split("_SUBMITTER_COMPLETE=")[1].split()[0].rstrip(")")
        done = subprocess.run([sys.executable, "-c", "from submitter.cli import main; main(prog_name='submitter')"],
                              env={**os.environ, "_SUBMITTER_COMPLETE": mode}, capture_output=True, text=True)
        shells[mode] = done.returncode == 0 and "_submitter_completion" in done.stdout
    assert shells == {"bash_source": True, "zsh_source": True, "fish_source": True}
