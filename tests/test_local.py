"""`submitter submit --local`: layering, refusals, rendering, and one real run via the CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from submitter.errors import SpecError, StoragePolicyError, UsageError
from submitter.local import (JsonView, PlainView, describe, local_spec, local_storage_path,
                             run_local, summary_lines)
from submitter.spec import LOCAL_DEFAULTS
from training import events as ev


def durable_dir(tmp_path_factory):
    """A fresh absolute directory the local storage policy accepts (it refuses /tmp)."""
    base = Path(os.environ.get("SUBMITTER_TEST_RUNS",
                               Path.home() / ".cache" / "submitter-test-runs"))
    path = base / tmp_path_factory.mktemp("r").name
    path.mkdir(parents=True, exist_ok=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def storage(tmp_path_factory):
    yield from durable_dir(tmp_path_factory)


def test_local_defaults_then_job_file_then_flags():
    spec = local_spec({}, {})
    for key, value in LOCAL_DEFAULTS.items():
        assert getattr(spec, key) == value, key
    spec = local_spec({"epochs": 5, "model": "gpt2-small", "storage_path": "/x"}, {"epochs": 1})
    assert (spec.epochs, spec.model) == (1, "gpt2-small")
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
    assert describe(_event("epoch_finished", epoch=2, train_loss=1.0, val_loss=None,
                           tokens_per_sec=1.0)).count("n/a") == 1
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


@pytest.mark.slow
def test_submit_local_runs_end_to_end_offline(runner, storage, monkeypatch):
    """The README's main command, shortened: offline corpus, byte tokenizer, 2 CPU workers."""
    from submitter.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = runner.invoke(main, ["submit", "--local", "--storage-path", str(storage),
                                  "--name", "cli-run", "--epochs", "2",
                                  "--max-steps-per-epoch", "15"])
    out = result.output
    assert result.exit_code == 0, out + repr(result.exception)
    assert "python-stdlib:" in out and ".py files" in out and "MB" in out  # says what it used
    assert "tokenizer: byte-level" in out
    assert "epoch 1 done:" in out and "epoch 2 done:" in out
    final = next(line for line in out.splitlines() if line.startswith("final:"))
    assert "step 30" in final and "val_loss" in final
    run_dir = storage / "cli-run"
    assert f"checkpoints: {run_dir} (2 kept:" in out
    events = ev.parse_lines((run_dir / ev.EVENTS_FILE).read_text())
    assert events[0]["type"] == "run_started" and events[-1]["type"] == "run_finished"
    losses = [e["loss"] for e in events if e["type"] == "progress"]
    assert losses[0] > losses[-1]
