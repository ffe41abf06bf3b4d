"""A run's limits at run time (issue 38): --deadline stops the run with a checkpoint, a resume
finishes it, and what it took (usage.json) feeds the next estimate. One Ray run pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import shared_file
from submitter.contract import events as ev
from submitter.contract import naming
from submitter.contract.usage import USAGE_FILE, RunUsage
from training.run import preempt


def test_sigterm_and_a_limit_together_end_as_the_limit():
    try:
        preempt.request()
        assert preempt._flag_value() == 1.0 and preempt.limit_reason() is None
        preempt._learn_flag(preempt.LIMIT_FLAGS["max_cost"])
        assert preempt.limit_reason() == "max_cost"
        assert preempt._flag_value() == preempt.LIMIT_FLAGS["max_cost"]
    finally:
        preempt.clear_limit_stop()
    assert not preempt.requested() and preempt.limit_reason() is None


@pytest.fixture
def fresh_ray():
    import ray

    yield
    ray.shutdown()


def _events(run_dir: Path) -> list[dict]:
    return ev.parse_lines((run_dir / naming.EVENTS_FILE).read_text())


@pytest.mark.slow
def test_a_tiny_deadline_stops_with_a_checkpoint_resume_finishes_and_the_estimate_uses_the_run(
        storage, fresh_ray, runner):
    from submitter.cli import main
    from submitter.contract.errors import UsageError
    from training.args import parse_args
    from training.driver import prepare_run, run

    name = "limited"
    common = ["--name", name, "--storage-path", str(storage), "--model", "tiny",
              "--data", str(shared_file("data", "wikitext-2", "valid.txt")),
              "--tokenizer", "byte", "--block-size", "64", "--val-steps", "2", "--replicas", "1",
              "--epochs", "1", "--max-steps-per-epoch", "6", "--progress-every", "1"]

    def go(*extra: str):
        cfg, _ = prepare_run(parse_args([*common, *extra], environ={}), environ={})
        return run(cfg, on_event=lambda e: None, notice=lambda line: None)

    run_dir = storage / name
    # 1 s passes during start-up: rank 0 stops after the first step, with a checkpoint
    first = go("--deadline", "1s")
    assert not first.ok and first.state.status == "stopped"
    assert "deadline 1s reached" in first.error and "--deadline" in first.error
    events = _events(run_dir)
    saved = [e for e in events if e["type"] == "checkpoint_saved"]
    stopped = events[-1]
    assert stopped["type"] == "run_stopped" and stopped["reason"] == "deadline"
    assert [s["reason"] for s in saved] == ["deadline"] and saved[0]["val_loss"] is None
    assert stopped["step"] == saved[0]["step"] < 6
    assert not [e for e in events if e["type"] in ("run_failed", "worker_group_restarted")]
    usage = RunUsage.from_json((run_dir / USAGE_FILE).read_text())
    assert usage.stopped_by == "deadline" and not usage.finished and usage.wall_s > 1

    # the same deadline again: the run's budget is spent, refused before Ray starts
    with pytest.raises(UsageError, match="already used its deadline"):
        go("--deadline", "1s")
    assert len(_events(run_dir)) == len(events)

    # resumed without it: continues from the stop's checkpoint and finishes
    again = go()
    assert again.ok, again.error
    after = _events(run_dir)[len(events):]
    resumed = next(e for e in after if e["type"] == "run_resumed")
    assert resumed["step"] == stopped["step"]
    assert after[-1]["type"] == "run_finished" and after[-1]["step"] == 6
    took = RunUsage.from_json((run_dir / USAGE_FILE).read_text())
    assert took.finished and took.stopped_by is None and took.restarts == 1
    started = next(e for e in after if e["type"] == "run_started")
    assert took.tokens == 6 * started["global_batch_size"] * started["block_size"]
    assert took.tokens_per_s > 0
    assert took.wall_s > usage.wall_s and took.model == "tiny" and took.storage_kind == "local"

    # the estimate afterwards takes this run's measured pace
    result = runner.invoke(main, ["estimate", "--local", *common, "-o", "json"])
    assert result.exit_code == 0, result.output
    pace = json.loads(result.stdout)["sources"]["pace"]
    assert f"your run {name}" in pace and f"{took.tokens_per_s:,.0f} tokens/s" in pace
