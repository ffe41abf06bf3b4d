"""Issue 33, item 7: each exit code through the CLI against the API emulator. An API that refuses
a request (no such job 6, forbidden 7, conflict 8, no CRD 9, otherwise 10) is never the job's
failure (1), so a script can tell them apart; one table (contract.errors.EXIT_CODES) is what the
`--help` epilog and the reliability page print."""

from __future__ import annotations

import pytest

from submitter.cli import main
from submitter.contract import errors
from tests.support.fake_operator import FakeOperator

NAME = "gpt2-demo"


def cli(runner, kubeconfig, *args):
    return runner.invoke(main, [*args, "--kubeconfig", kubeconfig])


def submitted(runner, kubeconfig, api):
    result = cli(runner, kubeconfig, "submit", "--name", NAME)
    assert result.exit_code == 0, result.output
    return FakeOperator(api.emulator, NAME)


def failed(runner, kubeconfig, api):
    submitted(runner, kubeconfig, api).fail()


def forbidden(runner, kubeconfig, api):
    api.emulator.deny("get", "rayjobs")


def running(runner, kubeconfig, api):
    job = submitted(runner, kubeconfig, api)
    job.initialize()
    job.run()


def not_ours(runner, kubeconfig, api):
    api.emulator.put("ray.io/v1", "rayjobs", {"metadata": {"name": NAME, "namespace": "default"},
                                              "spec": {"entrypoint": "theirs"}})


def conflict_409(runner, kubeconfig, api):
    api.emulator.fail("POST", r"/rayjobs$", status=409)


def no_crd(runner, kubeconfig, api):
    api.emulator.uninstall_rayjob_crd()


def invalid(runner, kubeconfig, api):
    api.emulator.validate("rayjobs", lambda obj: ["spec.entrypoint: Invalid value"])


def html(runner, kubeconfig, api):
    submitted(runner, kubeconfig, api)
    api.emulator.fail("GET", r"", times=1000, html=True)


CASES = {  # id: (setup, command, expected exit code, a word of the one error line)
    "job failed": (failed, ["watch", NAME], errors.JOB_FAILED, "ended FAILED"),
    "bad input": (None, ["status", "Not_A_Name"], errors.BAD_INPUT, "--name"),
    "observe: html": (html, ["status", NAME], errors.UNOBSERVABLE, "not Kubernetes JSON"),
    "not found: status": (None, ["status", "nope"], errors.NOT_FOUND, "no RayJob nope"),
    "not found: watch": (None, ["watch", "nope"], errors.NOT_FOUND, "not found"),
    "not found: delete": (None, ["delete", "nope"], errors.NOT_FOUND, "nothing to delete"),
    "not found: resume": (None, ["resume", "nope"], errors.NOT_FOUND, "no RayJob nope"),
    "forbidden: 403": (forbidden, ["status", NAME], errors.FORBIDDEN, "forbidden"),
    "conflict: resume running": (running, ["resume", NAME], errors.CONFLICT, "not finished"),
    "conflict: not ours": (not_ours, ["stop", NAME], errors.CONFLICT, "not this submitter job's"),
    "conflict: 409": (conflict_409, ["submit", "--name", NAME], errors.CONFLICT, "conflict"),
    "no crd": (no_crd, ["submit", "--name", NAME], errors.NO_CRD, "CRD"),
    "api refused: 422": (invalid, ["submit", "--name", NAME], errors.API_REFUSED, "rejected"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_outcome_has_its_exit_code(api, kubeconfig, runner, case):
    setup, command, code, word = CASES[case]
    if setup is not None:
        setup(runner, kubeconfig, api)
    result = cli(runner, kubeconfig, *command)
    assert result.exit_code == code, (case, result.output)
    assert "Traceback" not in result.output
    error = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and word in error[0], result.output


def test_the_api_refusals_are_distinct_from_the_job_failing_and_each_other():
    codes = [code for code, _ in errors.EXIT_CODES]
    assert len(codes) == len(set(codes))
    refusals = {errors.NotFound, errors.Forbidden, errors.Conflict, errors.CrdMissing, errors.ClusterError}
    assert len({c.exit_code for c in refusals}) == len(refusals)
    assert not {c.exit_code for c in refusals} & {errors.OK, errors.JOB_FAILED, errors.BAD_INPUT}


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_exits_with_a_code_of_the_table():
    import submitter.kube  # noqa: F401 - its own ClusterError subclasses count too

    listed = {code for code, _ in errors.EXIT_CODES}
    for cls in _subclasses(errors.SubmitterError):
        assert cls.exit_code in listed, cls


def test_help_and_docs_print_the_one_table(runner):
    from scripts.docs_hooks import on_page_markdown

    text = " ".join(runner.invoke(main, ["--help"]).output.split())
    page = on_page_markdown("<!-- exit-codes -->")
    for code, meaning in errors.EXIT_CODES:
        assert f"{code} {' '.join(meaning.replace('`', '').split())}" in text, code
        assert f"| **{code}** | {meaning} |" in page


@pytest.mark.parametrize("argv", [
    ["export", "nosuch", "--storage-path", "{runs}", "-o", "{out}"],
    ["tensorboard", "nosuch", "--storage-path", "{runs}", "--print"],
    ["tensorboard", "nosuch", "--print"],  # the default ./runs
    ["report", "nosuch", "--storage-path", "{runs}"],
    ["logs", "nosuch", "--storage-path", "{runs}"],
], ids=["export", "tensorboard", "tensorboard-default", "report", "logs"])
def test_a_run_looked_up_by_name_that_does_not_exist_exits_6(runner, tmp_path, monkeypatch, argv):
    """The table's code for a run that does not exist, whichever command looks it up."""
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    args = [a.format(runs=tmp_path / "runs", out=tmp_path / "x-hf") for a in argv]
    result = runner.invoke(main, args)
    assert result.exit_code == errors.NOT_FOUND, result.output
    assert "nosuch" in result.output.strip().splitlines()[-1]  # the error line names it
    assert not (tmp_path / "x-hf").exists()


@pytest.mark.parametrize("argv", [["submit"], ["data", "prepare"]])
def test_an_option_without_its_value_points_at_the_commands_help(runner, argv):
    result = runner.invoke(main, [*argv, "--dry-run"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert f"see: {' '.join(['main', *argv])} --help" in result.output


def test_a_failed_jobs_last_line_is_the_runs_own_error():
    """Seen on the real operator: KubeRay's message ends with the driver's last logs, in the
    order Ray ships them (a late "Connected to Ray cluster" line), so the line a user reads
    last must be the run's error from its run_failed event, whatever the logs' order."""
    from dataclasses import replace

    from submitter.cluster import outcome
    from submitter.contract.errors import JobFailed
    from submitter.contract.events import ProgressState
    from submitter.state import JobState

    error = "RuntimeError: batch does not fit (rank 0; 2 workers failed)"
    state = JobState("j", "ns", "FAILED", reason="AppFailed", progress=replace(ProgressState(), error=error),
                     message="Job entrypoint command failed, last logs:\nTraceback ...\n"
                             "INFO worker.py -- Connected to Ray cluster.")
    with pytest.raises(JobFailed) as e:
        outcome(state)
    assert str(e.value).splitlines()[-1] == f"j: {error}"
    assert "Connected to Ray cluster" in str(e.value)  # the logs stay, above it
    with pytest.raises(JobFailed) as e:
        outcome(replace(state, progress=ProgressState()))  # no run_failed event: KubeRay's words last
    assert str(e.value).splitlines()[-1].endswith("Connected to Ray cluster.")


def test_a_failed_job_reads_its_progress_once_more_for_the_runs_error(api, kube):
    """The RayJob's end and the run's run_failed event arrive through two watches in no set
    order: the failure's last line reads the ConfigMap again rather than go without it."""
    from submitter.cluster import with_latest_progress
    from submitter.contract import events as ev
    from submitter.contract import naming
    from submitter.state import JobState

    lines = ev.to_json(ev.make_event("run_failed", seq=1, error="ValueError: bad shard")) + "\n"
    api.emulator.put("v1", "configmaps", {"metadata": {"name": "j-progress", "namespace": "default"},
                                          "data": {naming.CONFIGMAP_EVENTS_KEY: lines}})
    state = with_latest_progress(kube, JobState("j", "default", "FAILED"))
    assert state.progress.error == "ValueError: bad shard"
    assert with_latest_progress(kube, JobState("gone", "default", "FAILED")).progress.error is None
