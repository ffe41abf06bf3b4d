"""`submit`, `watch` and `list` run through `submitter.api`, as the other commands do, and a
submit renders its plan once."""

from __future__ import annotations

import io

from submitter import api, cli_cluster
from submitter import cluster as cluster_module
from submitter import render as render_module
from submitter.cli import main
from submitter.contract.spec import JobSpec


def test_submit_renders_the_plan_once(monkeypatch):
    calls = []
    real = render_module.render

    def counting(spec, *program):
        calls.append(spec.name)
        return real(spec, *program)

    monkeypatch.setattr(render_module, "render", counting)
    monkeypatch.setattr(cluster_module, "render", counting)
    out = io.StringIO()
    submitted = api.submit(JobSpec.build(name="once"), dry_run="client", out=out)
    assert calls == ["once"]
    assert submitted.exit_code == 0 and "kind: RayJob" in out.getvalue()


def test_the_cli_commands_call_the_api(monkeypatch, runner):
    seen = {}

    def fake_submit(spec, **kw):
        seen["submit"] = (spec.name, kw["dry_run"], kw["watch"])
        return api.Submitted(spec.name, spec.namespace, None, "", 0)

    def fake_follow(name, namespace=None, **kw):
        seen["watch"] = (name, namespace, kw["timeout"])
        return 5

    def fake_jobs(namespace=None, **kw):
        seen["list"] = (namespace, kw["all_namespaces"], kw["states"])
        return []

    monkeypatch.setattr(api, "submit", fake_submit)
    monkeypatch.setattr(api, "follow", fake_follow)
    monkeypatch.setattr(api, "jobs", fake_jobs)
    monkeypatch.setattr(cli_cluster, "_kube", lambda *a: object())
    assert runner.invoke(main, ["submit", "--name", "a", "-n", "t", "--watch"]).exit_code == 0
    assert runner.invoke(main, ["watch", "a", "-n", "t", "--timeout", "2m"]).exit_code == 5
    assert runner.invoke(main, ["list", "-n", "t", "--state", "RUNNING"]).exit_code == 0
    assert seen == {"submit": ("a", "none", True), "watch": ("a", "t", 120.0),
                    "list": ("t", False, ("RUNNING",))}


def test_resume_watch_follows_through_the_api(monkeypatch, runner):
    """Issue 31's leftover: `resume --watch` watched with submitter.cluster.watch_job directly
    (.importlinter's commands-go-through-the-api contract now forbids it)."""
    seen = []
    monkeypatch.setattr(api, "resume", lambda name, namespace, **kw: seen.append(("resume", name, namespace)))
    monkeypatch.setattr(api, "follow", lambda name, namespace=None, **kw: seen.append(("watch", name, namespace)) or 3)
    monkeypatch.setattr(cli_cluster, "_kube", lambda *a: object())
    assert runner.invoke(main, ["resume", "a", "-n", "t", "--watch"]).exit_code == 3
    assert seen == [("resume", "a", "t"), ("watch", "a", "t")]
