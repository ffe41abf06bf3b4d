"""`submitter submit --local`: layering, refusals, rendering, and one real run via the CLI."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import tensorboard

from submitter.contract.errors import SpecError, StoragePolicyError, UsageError
from submitter import local
from submitter.local import (JsonView, PlainView, describe, local_spec, local_storage_path,
                             run_local, summary_lines)
from submitter.contract.spec import LOCAL_DEFAULTS
from submitter.contract import events as ev
from submitter.contract import naming


def test_local_defaults_then_job_file_then_flags():
    spec = local_spec({}, {})
    for key, value in LOCAL_DEFAULTS.items():
        assert getattr(spec, key) == value, key
    spec = local_spec({"epochs": 5, "model": "gpt2-small", "storage_path": "/x"}, {"epochs": 1},
                      "/data/runs")
    assert (spec.epochs, spec.model, spec.storage_path) == (1, "gpt2-small", "/data/runs")
    with pytest.raises(SpecError):
        local_spec({}, {"epochs": 0})
    kebab = {"max-steps-per-epoch": 7, "storage-path": "/data/k"}  # job files may use flag spelling
    assert local_spec(kebab, {}).max_steps_per_epoch == 7
    assert local_storage_path(kebab, {}) == "/data/k"
    with pytest.raises(SpecError, match="did you mean 'storage_path'"):
        local_storage_path({"storage_pth": "/data/k"}, {})


def test_local_storage_defaults_to_pwd_runs_and_keeps_the_policy(tmp_path):
    assert local_storage_path({}, {}, cwd="/home/me/proj") == "/home/me/proj/runs"
    with pytest.raises(StoragePolicyError, match=r"default storage path /tmp/x/runs .*--storage-path"):
        local_storage_path({}, {}, cwd="/tmp/x")  # a checkout under /tmp: say what to do instead
    assert local_storage_path({"storage_path": "/data/a"}, {}) == "/data/a"
    assert local_storage_path({"storage_path": "/data/a"}, {"storage_path": "/data/b"}) == "/data/b"
    for bad in ("relative/x", "~/runs", "/tmp/runs", "/root/ray_results/x"):
        with pytest.raises(StoragePolicyError):
            local_storage_path({}, {"storage_path": bad})


def test_yaml_output_is_refused_before_anything_starts():
    with pytest.raises(UsageError):
        run_local({}, {"storage_path": "/data/x"}, output="yaml")


@pytest.mark.parametrize("path", ["relative/x", "/tmp/x", "~/x"])
def test_cli_refuses_a_bad_storage_path_with_one_line(runner, path):
    from submitter.cli import main

    result = runner.invoke(main, ["submit", "--local", "--storage-path", path])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--storage-path" in lines[0]


def _event(type_, **fields):
    return ev.make_event(type_, seq=1, **fields)


def test_event_lines_for_humans():
    assert "loss 3.1416" in describe(_event("progress", epoch=1, step=5, loss=3.14159,
                                            tokens_per_sec=1234.5, lr=1e-3))
    line = describe(_event("worker_group_restarted", attempt=1, resumed_from="/r/ck1"))
    assert "attempt 1" in line and "/r/ck1" in line
    assert "scratch" in describe(_event("worker_group_restarted", attempt=2, resumed_from=None))
    no_val = describe(_event("epoch_finished", epoch=2, train_loss=1.0, val_loss=None,
                             tokens_per_sec=1.0))
    assert "no validation split" in no_val and "n/a" not in no_val
    assert describe({"type": "something_new", "time": "t"}) is None


def test_summary_names_the_metrics_and_the_checkpoints(tmp_path):
    (tmp_path / "checkpoint_epoch001_step0000010").mkdir()
    (tmp_path / "checkpoint_manager_snapshot.json").write_text("{}")
    state = ev.ProgressState(status="finished", metrics={
        "epoch": 1, "step": 10, "train_loss": 2.5, "val_loss": 2.25, "tokens_per_sec": 1000.0,
        "best_checkpoint": str(tmp_path / "checkpoint_epoch001_step0000010")})
    lines = summary_lines(SimpleNamespace(ok=True, state=state, run_dir=str(tmp_path), error=None))
    text = "\n".join(lines)
    assert "val_loss 2.2500" in text and "1 kept: checkpoint_epoch001_step0000010)" in text
    assert str(tmp_path / "events.jsonl") in text
    failed = summary_lines(SimpleNamespace(ok=False, state=state, run_dir="/r", error="boom"))
    assert "training failed: boom" in failed[0]


def test_summary_shows_the_exported_model_and_its_sample(tmp_path):
    state = ev.ProgressState(status="finished", metrics={
        "epoch": 2, "step": 240, "export_dir": str(tmp_path / "model"), "sample_prompt": "The ",
        "sample": "The cat sat"})
    text = "\n".join(summary_lines(SimpleNamespace(ok=True, state=state, run_dir=str(tmp_path),
                                                    error=None)))
    assert f"model (Hugging Face): {tmp_path / 'model'}" in text
    assert "sample: 'The cat sat'" in text


def test_json_view_prints_events_only(capsys):
    import io

    out = io.StringIO()
    view = JsonView(out)
    view.notice("tokenizer: byte")
    view.event(_event("run_finished", val_loss=1.5))
    assert json.loads(out.getvalue())["val_loss"] == 1.5
    assert "tokenizer" in capsys.readouterr().err
    plain = io.StringIO()
    PlainView(plain).event(_event("checkpoint_saved", epoch=1, path="/r/ck"))
    assert plain.getvalue() == "checkpoint saved: /r/ck\n"


# A stand-in for `python -m training`: it checks it got the job document, prints what the
# entrypoint prints (notices and event lines), and records an interrupted run on SIGINT.
FAKE_ENTRYPOINT = r"""
import json, os, signal, sys, time
sys.path.insert(0, os.environ["FAKE_ROOT"])
from submitter.contract import events as ev
from submitter.contract.spec import JobSpec
spec = JobSpec.from_document(os.environ["SUBMITTER_JOB"])
if os.environ.get("FAKE_MODE") == "refuse":  # a refusal before anything is written
    print("error: refused for a reason", file=sys.stderr, flush=True)
    sys.exit(2)
print("storage: " + spec.storage_path + " (local directory)", flush=True)
def emit(seq, type_, **fields):
    print(ev.to_stdout_line(ev.make_event(type_, seq=seq, **fields)), flush=True)
emit(1, "run_started", run_name=spec.run_name, num_workers=spec.num_train_workers,
     storage_path=spec.storage_path, epochs=spec.epochs, steps_per_epoch=3)
if os.environ.get("FAKE_MODE") == "hang":
    # Ctrl-C handling is in place before the first progress line, so a test that presses Ctrl-C
    # after seeing one never races the child's start-up (the real entrypoint installs Ray
    # Train's handler the same way, whatever SIGINT disposition it inherited).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for step in range(1, 4):
            emit(1 + step, "progress", epoch=1, step=step, loss=5.0 - step,
                 tokens_per_sec=100.0, lr=1e-3)
        while True:  # "training" until interrupted; the test's timeout guards against a hang
            time.sleep(1)
    except KeyboardInterrupt:
        emit(5, "run_failed", error="interrupted (Ctrl-C)")
        sys.exit(130)
for step in range(1, 4):
    emit(1 + step, "progress", epoch=1, step=step, loss=5.0 - step, tokens_per_sec=100.0, lr=1e-3)
if os.environ.get("FAKE_MODE") == "fail":
    emit(5, "run_failed", error="RuntimeError: boom")
    sys.exit(1)
emit(5, "run_finished", epoch=1, step=3, val_loss=1.5)
"""


@pytest.fixture
def fake_entrypoint(tmp_path, monkeypatch):
    from tests.conftest import ROOT

    script = tmp_path / "fake_training.py"
    script.write_text(FAKE_ENTRYPOINT)
    monkeypatch.setattr(local, "child_command", lambda: [sys.executable, str(script)])
    monkeypatch.setattr(local, "require_training_stack", lambda *what: None)
    monkeypatch.setenv("FAKE_ROOT", str(ROOT))
    return monkeypatch


def test_the_child_gets_the_pods_job_document_and_its_events_are_shown(runner, storage,
                                                                       fake_entrypoint):
    from submitter.cli import main

    result = runner.invoke(main, ["submit", "--local", "--storage-path", str(storage),
                                  "--name", "doc", "--epochs", "3"])
    assert result.exit_code == 0, result.output
    assert f"storage: {storage} (local directory)" in result.output  # the child's notice
    assert "run doc started: 2 worker(s), 3 epoch(s)" in result.output
    assert "epoch 1 step     3  loss 2.0000" in result.output
    assert "training finished" in result.output and "final: epoch 1, step 3" in result.output


def test_json_output_is_the_childs_events(runner, storage, fake_entrypoint):
    from submitter.cli import main

    result = runner.invoke(main, ["submit", "--local", "--storage-path", str(storage), "-o", "json"])
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [e["type"] for e in events] == ["run_started"] + ["progress"] * 3 + ["run_finished"]


def test_a_failed_run_exits_1_with_its_error(runner, storage, fake_entrypoint):
    from submitter.cli import main

    fake_entrypoint.setenv("FAKE_MODE", "fail")
    result = runner.invoke(main, ["submit", "--local", "--storage-path", str(storage)])
    assert result.exit_code == 1 and "training failed: RuntimeError: boom" in result.output


def test_ctrl_c_is_forwarded_and_the_run_is_recorded_as_interrupted(storage, fake_entrypoint):
    import io
    import signal
    import threading

    fake_entrypoint.setenv("FAKE_MODE", "hang")
    out = io.StringIO()
    view = PlainView(out)
    original = view.event

    def interrupt_after_progress(event):
        original(event)
        if event.get("step") == 3:  # the child is training with its handler installed: Ctrl-C
            threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT)).start()

    view.event = interrupt_after_progress
    spec = local_spec({}, {}, str(storage))
    # Ctrl-C in a terminal: Python's handler, also when pytest was started with SIGINT ignored
    # (a background job of a non-interactive shell), which would make the press a no-op.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        outcome = local.follow_child(spec, str(storage), view)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert outcome.exit_code == 130 and not outcome.ok
    # run_failed came from the child: the Ctrl-C was forwarded, and the run recorded it
    assert outcome.state.status == "failed" and outcome.error == "interrupted (Ctrl-C)"


def test_without_the_training_stack_local_exits_2_with_the_pip_command(runner, monkeypatch):
    from submitter.cli import main
    from submitter.contract import stack

    monkeypatch.setattr(stack.importlib.util, "find_spec",
                        lambda name: None if name in ("ray", "torch") else object())
    result = runner.invoke(main, ["submit", "--local", "--storage-path", "/data/x"])
    assert result.exit_code == 2
    assert "ray, torch are not installed" in result.output and 'pip install "submitter-gpt2[train]"' in result.output


#: The getting-started page's local example (the one the docs test marks runnable: local).
LOCAL_EXAMPLE = next(e for e in __import__("tests.test_docs", fromlist=["EXAMPLES"]).EXAMPLES
                     if e.kind == "local")


@pytest.mark.slow
def test_submit_local_runs_end_to_end_offline(storage, tmp_path, monkeypatch):
    """The README's main command, shortened (offline corpus, byte tokenizer, 2 CPU workers), as
    a user runs it, in the getting-started page's words (its output is what the page shows):
    the CLI process imports neither ray nor torch nor transformers."""
    import subprocess

    from tests.test_docs import matches

    (command, shown), = LOCAL_EXAMPLE.steps
    # the trackers by their own variables: MLflow (a file store), W&B offline; TensorBoard always
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": f"file:{tmp_path}/mlruns",
           "MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "COLUMNS": "100", "NO_COLOR": "1"}
    assert command.startswith("submitter ")  # this interpreter's, timing its own imports only
    argv = [sys.executable, "-X", "importtime", "-m", "submitter", *command.split()[1:]]
    # ./runs must be a directory the storage policy keeps (a checkout under /tmp is refused)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=storage, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    shown_lines = "\n".join(line for line in (out + proc.stderr).splitlines() if not line.startswith("import time:"))
    assert matches(shown, shown_lines), f"the page shows:\n{shown}\n--- the run printed:\n{shown_lines}"
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "click" in imported and not imported & {"ray", "torch", "transformers", "datasets"}
    assert "python-stdlib:" in out and ".py files" in out and "MB" in out  # says what it used
    assert "tokenizer: byte-level" in out
    assert "epoch 1 done:" in out and "epoch 2 done:" in out
    final = next(line for line in out.splitlines() if line.startswith("final:"))
    assert "step 30" in final and "val_loss" in final
    run_dir = storage / "runs" / "quick"
    assert f"checkpoints: {run_dir} (2 kept:" in out
    events = ev.parse_lines((run_dir / naming.EVENTS_FILE).read_text())
    assert events[0]["type"] == "run_started" and events[-1]["type"] == "run_finished"
    losses = [e["loss"] for e in events if e["type"] == "progress"]
    assert losses[0] > losses[-1]
    assert not [e for e in events if e["type"] == "tracker_failed"]
    # TensorBoard under the run directory, every progress step once
    progress_steps = [e["step"] for e in events if e["type"] == "progress"]
    assert tensorboard.steps(str(run_dir / "tensorboard")) == progress_steps
    assert tensorboard.steps(str(run_dir / "tensorboard"), "val/loss") == [15, 30]
    # MLflow: one run with the metrics and the exported model
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file:{tmp_path}/mlruns")
    run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == progress_steps
    assert client.get_run(run_id).info.status == "FINISHED"
    assert "model/config.json" in [a.path for a in client.list_artifacts(run_id, "model")]
    # W&B: the offline run in the run directory
    wandb_id = json.loads((run_dir / "wandb.json").read_text())["id"]
    assert list(run_dir.glob(f"wandb/offline-run-*/run-{wandb_id}.wandb"))


def test_a_refusal_says_refused_and_names_no_folder_it_did_not_write(runner, storage,
                                                                    fake_entrypoint):
    from submitter.cli import main

    fake_entrypoint.setenv("FAKE_MODE", "refuse")
    result = runner.invoke(main, ["submit", "--local", "--storage-path", str(storage),
                                  "--name", "never"])
    assert result.exit_code == 2, result.output
    assert not (storage / "never").exists()
    assert "training failed" not in result.output and str(storage / "never") not in result.output
    assert "refused" in result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("argv", [["submit", "--local", "--name", "dry"],
                                  ["data", "prepare", "--local", "--name", "dry"]])
@pytest.mark.parametrize("mode", ["client", "server"])
def test_dry_run_with_local_is_refused_in_one_line_and_writes_nothing(runner, storage, monkeypatch,
                                                                      argv, mode):
    from submitter.cli import main

    def ran(*args, **kwargs):
        raise AssertionError("a --dry-run started the local run")

    monkeypatch.setattr(local, "follow_child", ran)
    monkeypatch.setattr(local, "require_training_stack", lambda *what: None)
    monkeypatch.chdir(storage)
    result = runner.invoke(main, [*argv, f"--dry-run={mode}"])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "--dry-run" in result.stderr
    assert list(storage.iterdir()) == []
    helps = runner.invoke(main, [*argv[:-2], "--help"]).output
    assert "refused with --local" in " ".join(helps.split())
