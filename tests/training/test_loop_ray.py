"""The step loop on real Ray: gradient accumulation to a global batch, no counting pass (the
steps per epoch are estimated, then corrected), a separate validation file, --limit-rows,
data-wait reporting, and a run extended with one more epoch whose LR continues smoothly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import shared_file
from submitter.contract import events as ev
from submitter.contract import naming
from training.args import parse_args
from training.driver import prepare_run

pytestmark = pytest.mark.slow


@pytest.fixture
def fresh_ray():
    import ray

    yield
    ray.shutdown()


def _run(storage: Path, *extra: str):
    from training.driver import run

    argv = ["--name", "acc", "--storage-path", str(storage), "--model", "tiny",
            "--data", str(shared_file("data", "wikitext-2", "valid.txt")),
            "--val-data", str(shared_file("data", "wikitext-2", "test.txt")),
            "--limit-rows", "500", "--tokenizer", "byte", "--block-size", "64",
            "--val-steps", "4", "--replicas", "1", "--batch-size-per-worker", "4",
            "--global-batch-size", "16", "--progress-every", "5", "--seed", "3", *extra]
    cfg, _ = prepare_run(parse_args(argv, environ={}), environ={})
    return run(cfg, on_event=lambda e: None, notice=lambda line: None)


def test_accumulation_estimate_and_an_extension_that_continues_the_schedule(storage, fresh_ray):
    import ray
    import torch

    # 0.0001 min (6 ms): the time since the last save grows until a window checks it, so a timed
    # checkpoint comes in every epoch of several windows, whatever the machine's speed
    first = _run(storage, "--epochs", "2", "--checkpoint-interval", "0.0001")
    assert first.ok, first.error
    events = ev.parse_lines((storage / "acc" / naming.EVENTS_FILE).read_text())
    saved = [e for e in events if e["type"] == "checkpoint_saved"]
    assert {e["reason"] for e in saved} == {"interval", "epoch_end"}  # timed ones, uploaded async
    assert all(e["stall_s"] >= 0 for e in saved)
    started = events[0]
    assert started["type"] == "run_started"
    assert started["precision"] == "fp32" and started["accumulation_steps"] == 4
    assert started["global_batch_size"] == 16 and started["steps_per_epoch_estimated"] is True
    assert "validation" in started["data"] and "first 500 rows" in started["data"]
    progress = [e for e in events if e["type"] == "progress"]
    assert progress and all(0.0 <= e["data_wait_fraction"] <= 1.0 for e in progress)
    epochs = [e for e in events if e["type"] == "epoch_finished"]
    assert len(epochs) == 2 and epochs[0]["steps"] == epochs[1]["steps"] > 0
    real = epochs[0]["steps"]
    blob = torch.load(Path(events[-1]["latest_checkpoint"]) / "state.pt", weights_only=False)
    assert blob["steps_per_epoch"] == real and blob["accumulation"] == 4
    plan = blob["scheduler"]
    assert plan["kind"] == "lr_plan" and plan["total"] == 2 * real  # corrected to the real figure
    lr_before = [e["lr"] for e in events if e["type"] == "progress"]
    ray.shutdown()

    more = _run(storage, "--epochs", "3")
    assert more.ok, more.error
    events = ev.parse_lines((storage / "acc" / naming.EVENTS_FILE).read_text())
    resumed = [e for e in events if e["type"] == "run_resumed"]
    assert resumed and resumed[-1]["step"] == 2 * real
    after = [e for e in events[events.index(resumed[-1]):] if e["type"] == "progress"]
    # no jump: the extension starts below the LR the run had already reached, and decays
    assert after[0]["lr"] <= lr_before[-1] * 1.0001
    assert all(b["lr"] <= a["lr"] * 1.0001 for a, b in zip(after, after[1:]))
    assert events[-1]["type"] == "run_finished" and events[-1]["step"] == 3 * real


def test_compile_on_reports_its_cost_and_a_resumed_start_reuses_the_runs_cache(storage, fresh_ray,
                                                                                monkeypatch):
    """`--compile on` on a CPU worker: run_started says compile is on, the first progress event
    of each start what compiling cost, and a resumed start finds every graph in
    `<run dir>/.compile-cache` (no inductor misses)."""
    import ray

    from training.gpt2.compiling import CACHE_DIR

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    common = ["--compile", "on", "--max-steps-per-epoch", "2", "--progress-every", "1"]
    first = _run(storage, *common, "--epochs", "1")
    assert first.ok, first.error
    ray.shutdown()
    more = _run(storage, *common, "--epochs", "2")  # the same run, extended: a new start
    assert more.ok, more.error
    events = ev.parse_lines((storage / "acc" / naming.EVENTS_FILE).read_text())
    assert events[0]["type"] == "run_started" and events[0]["compile"] == "on"
    resumed = next(i for i, e in enumerate(events) if e["type"] == "run_resumed")
    starts = [next(e for e in part if e["type"] == "progress")
              for part in (events[:resumed], events[resumed:])]
    cache = storage / "acc" / CACHE_DIR
    for start in starts:
        assert start["compile"] is True and start["compile_cache"] == str(cache)
        assert start["compile_s"] > 0
    assert starts[0]["fxgraph_cache_miss"] > 0
    assert starts[1]["fxgraph_cache_miss"] == 0 and starts[1]["fxgraph_cache_hit"] > 0
    assert any(cache.iterdir())
