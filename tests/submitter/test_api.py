"""The Python API (#11 item 6): the CLI's operations as functions, raising the project's errors,
never exiting; `import submitter` stays light."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import yaml

import submitter
from submitter.contract.errors import NotFound, SpecError, WatchTimeout
from tests.support.fake_operator import FakeOperator
from tests.support.kube_emulator import RAYJOBS


def test_import_submitter_is_light_and_exports_the_api():
    code = ("import sys, submitter; names = [submitter.JobSpec, submitter.render, submitter.submit, "
            "submitter.status, submitter.watch, submitter.stop, submitter.delete, submitter.resume]; "
            "print(sorted(m for m in ('kubernetes', 'ray', 'torch', 'jinja2') if m in sys.modules))")
    # watch (the module) imports no kubernetes either: only a call does
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    proc = subprocess.run([sys.executable, "-c", "import sys, submitter; print('kubernetes' in sys.modules)"],
                          capture_output=True, text=True)
    assert proc.stdout.strip() == "False"


def test_render_is_the_plan_whichever_was_imported_first():
    spec = submitter.JobSpec.build(name="gpt2-demo", replicas=8, gpu_per_pod=1)
    plan = submitter.render(spec)
    import submitter.render as module  # binds the module to the package attribute

    assert submitter.render is module and submitter.render(spec) == plan
    assert [o["kind"] for o in plan][-1] == "RayJob"
    assert list(yaml.safe_load_all(str(plan))) == list(plan)


def test_bad_input_raises_the_projects_errors_not_system_exit():
    with pytest.raises(SpecError):
        submitter.JobSpec.build(name="Bad_Name")
    with pytest.raises(submitter.UsageError):
        submitter.render(submitter.JobSpec.build(name="j", storage_path="/tmp/x"))


def test_submit_status_watch_delete_resume_against_the_emulator(api, kubeconfig):
    spec = submitter.JobSpec.build(name="gpt2-demo")
    done = submitter.submit(spec, kubeconfig=kubeconfig)
    assert done.name == "gpt2-demo" and "rayjob/gpt2-demo created" in done.report
    op = FakeOperator(api.emulator, "gpt2-demo")
    op.initialize()
    assert submitter.status("gpt2-demo", kubeconfig=kubeconfig).state == "STARTING"

    states = []
    watching = submitter.watch("gpt2-demo", kubeconfig=kubeconfig, timeout=30)
    states.append(next(watching))

    def drive() -> None:
        op.run()
        op.step(1, 10, loss=3.0)
        op.fail()

    threading.Thread(target=drive).start()
    states.extend(watching)
    assert states[0].state == "STARTING"
    assert states[-1].state == "FAILED" and states[-1].terminal  # a state, not an exception
    assert any(s.progress.step == 10 for s in states)

    resumed = submitter.resume("gpt2-demo", kubeconfig=kubeconfig)
    assert "attempt 2" in resumed, resumed
    assert "stopped (spec.suspend: true)" in submitter.stop("gpt2-demo", kubeconfig=kubeconfig)
    assert api.emulator.get(RAYJOBS, "default", "gpt2-demo")["spec"]["suspend"] is True
    assert "deleted rayjob/gpt2-demo" in submitter.delete("gpt2-demo", kubeconfig=kubeconfig)
    with pytest.raises(NotFound):
        submitter.status("gpt2-demo", kubeconfig=kubeconfig)


def test_watch_timeout_raises(api, kubeconfig):
    submitter.submit(submitter.JobSpec.build(name="slow"), kubeconfig=kubeconfig)
    with pytest.raises(WatchTimeout):
        list(submitter.watch("slow", kubeconfig=kubeconfig, timeout=0.5))


def test_closing_watch_early_stops_the_watching_thread(api, kubeconfig):
    import time

    submitter.submit(submitter.JobSpec.build(name="early"), kubeconfig=kubeconfig)
    op = FakeOperator(api.emulator, "early")
    watching = submitter.watch("early", kubeconfig=kubeconfig)
    assert next(watching).state == "PENDING"
    watching.close()
    op.initialize()  # the next change reaches the closed sink: the thread ends
    deadline = time.monotonic() + 10
    while any(t.name == "submitter-watch-early" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the watching thread outlived its generator"
        time.sleep(0.05)
