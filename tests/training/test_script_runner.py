"""The runner's parts without Ray: RunConfig defaults and refusals, the events a report becomes,
the code's identity in run.json."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import pytest

from submitter.contract import code
from submitter.contract.spec import JobSpec
from training.script import hooks
from training.run.identity import RunMismatch
from training.run_script import claim_code, inject_runtime_env, runtime_env


def _settings(tmp_path, script_file="train.py"):
    return hooks.Settings(storage_root=str(tmp_path / "runs"), name="mine",
                          run_dir=str(tmp_path / "runs" / "mine"),
                          script_file=str(tmp_path / script_file), entry=script_file,
                          storage_mount="/mnt/checkpoints", allow_ephemeral=False,
                          access_mode="ReadWriteMany", environ={})


def test_a_run_config_gets_the_runs_directory_and_name_and_the_events(tmp_path):
    from training.run.logs import worker_error_logs_class

    s = _settings(tmp_path)
    out = hooks.configure_run_config({"callbacks": ["theirs"]}, s)
    assert out["storage_path"] == s.storage_root and out["name"] == "mine"
    errors, theirs, events = out["callbacks"]
    assert theirs == "theirs" and isinstance(events, hooks.ScriptEvents)
    # each failed worker's traceback under <run>/logs/, by the GPT-2 job's callback: first,
    # so that no other callback failing can keep it from the storage
    assert isinstance(errors, worker_error_logs_class()) and errors.run_dir == s.run_dir
    # a RunConfig made with another's callbacks: nothing doubled
    assert hooks.configure_run_config({"callbacks": out["callbacks"]}, s)["callbacks"] == \
        out["callbacks"]
    # the script's own name and a shared path of its own are kept
    mine = str(Path.home() / "kept-runs")
    kept = hooks.configure_run_config({"name": "other", "storage_path": mine}, s)
    assert kept["name"] == "other" and kept["storage_path"] == mine


def test_an_ephemeral_storage_path_is_refused_naming_the_scripts_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys\n\n"
                      "configure(dict(storage_path='/tmp/scratch'), settings)\n")
    s = _settings(tmp_path)
    with pytest.raises(hooks.ScriptStorageRefused) as e:
        runpy.run_path(str(script), {"configure": hooks.configure_run_config, "settings": s})
    line = str(e.value)
    assert line.startswith("train.py:3: RunConfig(storage_path='/tmp/scratch') is refused")
    assert "leave storage_path out" in line and "\n" not in line


def test_a_report_becomes_progress_with_the_scripts_own_metrics():
    fields = hooks.progress_fields({"epoch": 2, "loss": 0.5, "acc": 0.9, "note": "x",
                                    "global_step": 40}, reports=7)
    assert fields == {"epoch": 2, "step": 40, "loss": 0.5, "lr": None, "tokens_per_sec": None,
                      "metrics": {"epoch": 2, "loss": 0.5, "acc": 0.9, "global_step": 40}}
    assert hooks.progress_fields({"mse": float("nan")}, reports=3)["step"] == 3


def _hub(tmp_path):
    return hooks.ScriptHub(str(tmp_path / "run"), {})


def test_reports_become_events_and_a_restart_that_ignores_the_checkpoint_is_said_once(tmp_path):
    hub = _hub(tmp_path)
    hub.started("mine", 2, str(tmp_path), "train.py")
    hub.report({"epoch": 0, "loss": 1.0}, str(tmp_path / "run/checkpoint_0"))
    hub.report({"epoch": 1, "loss": 0.5}, None)
    hub.failed_workers({1: "RuntimeError: boom"})
    hub.report({"epoch": 0, "loss": 1.0}, None)  # the new group started over
    hub.report({"epoch": 0, "loss": 1.0}, None)
    types = [e["type"] for e in hub.session]
    assert types == ["run_started", "progress", "checkpoint_saved", "progress",
                     "worker_group_restarted", "progress", "progress"]
    restarted = hub.session[4]
    assert restarted["attempt"] == 1 and restarted["resumed_from"].endswith("checkpoint_0")
    assert "rank 1: RuntimeError: boom" in restarted["error"]
    flagged = [e for e in hub.session if e.get("from_scratch")]
    assert len(flagged) == 1 and flagged[0] is hub.session[5]
    # a new driver on the same run: run_resumed; a script that resumes is not flagged
    again = _hub(tmp_path)
    again.started("mine", 2, str(tmp_path), "train.py")
    again.report({"epoch": 2, "loss": 0.2}, None)
    assert [e["type"] for e in again.session] == ["run_started", "run_resumed", "progress"]
    assert not again.session[-1].get("from_scratch")
    assert again.finished()["latest_checkpoint"].endswith("checkpoint_0")
    written = {json.loads(x)["seq"] for x in
               (tmp_path / "run" / "events.jsonl").read_text().splitlines()}
    assert {e["seq"] for e in hub.session + again.session} <= written  # seq continues


def _ref(files):
    return {"sha256": code.manifest_hash(files), "entry": "train.py", "pip": ["numpy"]}


def test_the_code_is_the_runs_identity(tmp_path):
    run_dir = str(tmp_path / "run")
    spec = JobSpec.build(name="mine", script="train.py")
    first = {"train.py": "a" * 64, "lib.py": "b" * 64}
    assert "new" in claim_code(run_dir, spec, _ref(first), first)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["code"]["sha256"] == code.manifest_hash(first)
    assert record["code"]["pip"] == ["numpy"] and record["program"] == "script"
    assert "same code" in claim_code(run_dir, spec, _ref(first), first)
    changed = {"train.py": "c" * 64, "new.py": "d" * 64}
    with pytest.raises(RunMismatch, match=r"lib\.py, new\.py, train\.py differ.*--allow-code-change"):
        claim_code(run_dir, spec, _ref(changed), changed)
    allowed = JobSpec.build(name="mine", script="train.py", allow_code_change=True)
    assert "changed code" in claim_code(run_dir, allowed, _ref(changed), changed)


def test_a_gpt2_run_directory_is_not_taken_by_a_script(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({"v": 1, "identity": {"model": "tiny"}}))
    files = {"train.py": "a" * 64}
    with pytest.raises(RunMismatch, match="GPT-2 entrypoint"):
        claim_code(str(tmp_path / "run"), JobSpec.build(name="m", script="t.py"), _ref(files), files)


def test_the_workers_runtime_env_joins_the_jobs():
    environ = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"env_vars": {"A": "1"}},
                                                          "metadata": {"k": "v"}})}
    inject_runtime_env(runtime_env("/code", ["numpy==2.1"]), environ)
    config = json.loads(environ["RAY_JOB_CONFIG_JSON_ENV_VAR"])
    assert config["metadata"] == {"k": "v"}
    assert config["runtime_env"] == {"env_vars": {"A": "1"}, "working_dir": "/code",
                                     "worker_process_setup_hook": "training.script.worker_setup",
                                     "pip": ["numpy==2.1"]}


def test_installed_requirements_are_named_with_their_versions(tmp_path, monkeypatch):
    """A retry on the same node reuses the driver's packages (pip --target by the list's
    hash); what is there is what run.json records."""
    import hashlib
    import sys

    from training import run_script

    monkeypatch.setattr(run_script.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    pip = ["tinylib>=1"]
    key = hashlib.sha256("\n".join(pip).encode()).hexdigest()[:16]
    meta = tmp_path / "submitter-pip" / key / "tinylib-1.2.3.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: tinylib\nVersion: 1.2.3\n")
    assert run_script.install_driver_packages(pip, print) == ["tinylib==1.2.3"]
    assert sys.path[0] == str(meta.parent)
    assert run_script.install_driver_packages([], print) == []


def test_a_second_driver_of_the_same_run_is_refused_and_a_refusal_frees_the_lock(
        storage, tmp_path, capsys):
    """The script runner takes the GPT-2 driver's run lock (run_identity.lock_run_dir) before it
    writes anything; a driver holding it makes a second one exit 2, nothing written."""
    from submitter.code_plan import local_code_env
    from submitter.contract.naming import ENV_JOB
    from submitter.local import local_spec
    from training.run.identity import LOCK_FILE, RunLock
    from training.run_script import main

    (tmp_path / "train.py").write_text("print('ran')\n")
    spec = local_spec({}, {"name": "locked", "script": str(tmp_path / "train.py")}, str(storage))
    environ = {ENV_JOB: spec.document(), **local_code_env(spec)}
    run_dir = storage / "locked"
    held = RunLock(str(run_dir))  # another live driver of this run, on this host
    held.acquire()
    try:
        assert main([], environ=dict(environ)) == 2
    finally:
        held.release()
    assert "is in use by another driver" in capsys.readouterr().err
    assert not (run_dir / "run.json").exists()

    ref = json.loads(environ[code.ENV_CODE])
    bad = {**environ, code.ENV_CODE: json.dumps({**ref, "sha256": "0" * 64})}
    assert main([], environ=bad) == 2  # refused after the lock was taken
    assert "does not match its hash" in capsys.readouterr().err
    assert not (run_dir / LOCK_FILE).exists()


def test_a_preemption_is_known_by_the_workers_exception_not_by_its_text():
    """Ray Train hands fit()'s caller each worker's own exception (WorkerGroupError's
    worker_failures, checked with a real Ray run: the Preempted object itself)."""
    from ray.train import WorkerGroupError

    from training.run_script import ended_by_preemption
    from training.script import Preempted

    assert ended_by_preemption(WorkerGroupError("x", {0: RuntimeError("a"),
                                                      1: Preempted("checkpointed")}))
    try:
        try:
            raise Preempted("checkpointed")
        except Preempted as inner:
            raise SystemExit(3) from inner
    except SystemExit as chained:
        assert ended_by_preemption(chained)
    assert not ended_by_preemption(RuntimeError("NotPreempted: a user's own error"))
    assert not ended_by_preemption(WorkerGroupError("Preempted", {0: ValueError("Preempted")}))
    assert not ended_by_preemption(None)


def test_a_failing_scripts_output_and_its_workers_error_are_kept_under_the_run(
        storage, tmp_path, monkeypatch, capsys, runner):
    """The runner in this process, on a plain script that raises what Ray Train's fit() raises
    when a worker's train_func failed (issue 33, item 8): the driver's output is kept as the
    GPT-2 job's is (one session under <run>/logs/, `submitter logs` reads it), and the run's
    last line names the worker's own error, not "Training failed due to worker errors:"."""
    from submitter.cli import main as cli
    from submitter.code_plan import local_code_env
    from submitter.contract import run_logs as names
    from submitter.contract.naming import ENV_JOB
    from submitter.local import local_spec
    from training import run_script

    script = tmp_path / "fails.py"
    script.write_text("from ray.train import WorkerGroupError\n"
                      "print('the script ran')\n"
                      "raise WorkerGroupError('[Rank 1] bad batch', {1: ValueError('bad batch')})\n")
    spec = local_spec({}, {"name": "fails", "script": str(script)}, str(storage))
    # what the runner changes for the script (its hooks patch Ray's classes: not in this process)
    monkeypatch.setattr(run_script.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(hooks, "install", lambda settings: None)
    monkeypatch.setattr(run_script._SIGTERM, "install", lambda: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    terminal = sys.stdout

    assert run_script.main([], environ={ENV_JOB: spec.document(), **local_code_env(spec)}) == 1
    assert sys.stdout is terminal  # given back
    said = capsys.readouterr()
    last = json.loads((storage / "fails" / "events.jsonl").read_text().splitlines()[-1])
    assert last["type"] == "run_failed" and last["error"] == "ValueError: bad batch (rank 1)"
    logs = storage / "fails" / names.LOGS_DIR
    (session,) = names.driver_sessions(os.listdir(logs))
    kept = (logs / session[0]).read_text()
    assert "the script ran" in said.out and "the script ran" in kept
    assert "script: fails.py" in kept and "Traceback (most recent call last)" in kept
    assert '"ValueError: bad batch (rank 1)"' in kept  # the run_failed event line
    shown = runner.invoke(cli, ["logs", "fails", "--storage-path", str(storage)])
    assert shown.exit_code == 0, shown.output
    assert "1 driver session(s), 0 worker error log(s)" in shown.stderr
    assert "the script ran" in shown.stdout
