"""`submitter submit --local --script`: a user's own Ray Train script, end to end, with the
GPT-2 job's guarantees: events, checkpoints in the run's directory, a worker failure that
resumes, a second start that resumes, an ephemeral storage_path refused at the script's line,
changed code refused, and a script that is not a Ray Train script still runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
SCRIPTS = ROOT / "tests" / "scripts"


def _submit(storage, name, script, *args, extra=()):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "submitter", "submit", "--local", "--name", name,
                           "--storage-path", str(storage), "--script", str(script), *extra,
                           "--", *args], capture_output=True, text=True, env=env, timeout=600)


def _events(run_dir):
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_a_torch_trainer_script_gets_storage_events_and_resume(storage, tmp_path):
    run_dir = storage / "reg"
    crash = tmp_path / "crashed-once"
    first = _submit(storage, "reg", SCRIPTS / "torch_regression.py", "--epochs", "4",
                    "--crash-once", str(crash))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert crash.exists()  # rank 1 really died once
    events = _events(run_dir)
    types = [e["type"] for e in events]
    assert types[0] == "run_started" and types[-1] == "run_finished"
    assert "worker_group_restarted" in types
    after = types.index("worker_group_restarted")
    resumed = next(e for e in events[after:] if e["type"] == "progress")
    # from the last checkpoint Ray Train registered before the crash (epoch 0 or 1), not epoch 0
    assert resumed["epoch"] in (1, 2) and not resumed.get("from_scratch")
    progress = [e for e in events if e["type"] == "progress"]
    assert {"loss", "mse", "epoch"} <= set(progress[0]["metrics"]) and progress[0]["loss"] > 0
    saved = [e for e in events if e["type"] == "checkpoint_saved"]
    assert saved and all(os.path.isdir(e["path"]) and e["path"].startswith(str(run_dir))
                         for e in saved[-2:])
    record = json.loads((run_dir / "run.json").read_text())
    assert record["program"] == "script" and record["code"]["entry"] == "torch_regression.py"
    assert "epoch 3" in first.stdout and "mse" in first.stdout  # the script's metrics, live

    second = _submit(storage, "reg", SCRIPTS / "torch_regression.py", "--epochs", "5")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    new = _events(run_dir)[len(events):]
    assert [e["type"] for e in new][:2] == ["run_started", "run_resumed"]
    assert next(e for e in new if e["type"] == "progress")["epoch"] == 4

    # a storage_path of the script's own under /tmp: refused before any training, at its line
    refused = _submit(storage, "reg", SCRIPTS / "torch_regression.py", "--storage-path",
                      "/tmp/scratch-runs")
    line = next(i for i, text in enumerate((SCRIPTS / "torch_regression.py").read_text()
                                           .splitlines(), 1) if "RunConfig(storage_path" in text)
    assert refused.returncode == 2
    assert f"error: torch_regression.py:{line}: RunConfig(storage_path='/tmp/scratch-runs')" \
        in refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(_events(run_dir)) == len(events) + len(new)  # nothing trained, nothing written


def test_a_plain_script_runs_and_changed_code_is_refused(storage, tmp_path):
    code_dir = tmp_path / "project"
    code_dir.mkdir()
    shutil.copy(SCRIPTS / "plain.py", code_dir / "plain.py")
    (code_dir / "helper.py").write_text("X = 1\n")
    ran = _submit(storage, "plain", code_dir / "plain.py", "a", "b")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "plain script ran with ['a', 'b']" in ran.stdout
    assert "created no Ray Train trainer" in ran.stdout
    (code_dir / "helper.py").write_text("X = 2\n")
    changed = _submit(storage, "plain", code_dir / "plain.py")
    assert changed.returncode == 2 and "helper.py differ" in changed.stderr
    allowed = _submit(storage, "plain", code_dir / "plain.py", extra=["--allow-code-change"])
    assert allowed.returncode == 0 and "changed code (helper.py" in allowed.stdout
