"""`--compile on` through the real entrypoint (Ray Train, one CPU worker): run_started says
compile is on, the first progress event of each start says what compiling cost, and a resumed
start finds every graph in the run's compile cache (`<run dir>/.compile-cache`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import shared_file
from submitter.contract import events as ev
from submitter.contract import naming
from training.args import parse_args
from training.compiling import CACHE_DIR
from training.driver import prepare_run

pytestmark = pytest.mark.slow


@pytest.fixture
def fresh_ray():
    import ray

    yield
    ray.shutdown()


def _run(storage: Path, *extra: str):
    from training.driver import run

    argv = ["--name", "comp", "--storage-path", str(storage), "--model", "tiny",
            "--data", str(shared_file("data", "wikitext-2", "valid.txt")), "--limit-rows", "300",
            "--tokenizer", "byte", "--block-size", "32", "--val-steps", "2", "--replicas", "1",
            "--batch-size-per-worker", "4", "--max-steps-per-epoch", "3", "--progress-every", "1",
            "--compile", "on", *extra]
    cfg, _ = prepare_run(parse_args(argv, environ={}), environ={})
    return run(cfg, on_event=lambda e: None, notice=lambda line: None)


def test_a_resumed_start_reuses_the_runs_compile_cache(storage, fresh_ray, monkeypatch):
    import ray

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    first = _run(storage, "--epochs", "1")
    assert first.ok, first.error
    ray.shutdown()
    more = _run(storage, "--epochs", "2")  # the same run, extended: a new start resumes it
    assert more.ok, more.error
    events = ev.parse_lines((storage / "comp" / naming.EVENTS_FILE).read_text())
    assert events[0]["type"] == "run_started" and events[0]["compile"] == "on"
    resumed = next(i for i, e in enumerate(events) if e["type"] == "run_resumed")
    starts = [next(e for e in part if e["type"] == "progress")
              for part in (events[:resumed], events[resumed:])]
    cache = str(storage / "comp" / CACHE_DIR)
    for start in starts:
        assert start["compile"] is True and start["compile_cache"] == cache
        assert start["compile_s"] > 0
    assert starts[0]["fxgraph_cache_miss"] > 0
    assert starts[1]["fxgraph_cache_miss"] == 0 and starts[1]["fxgraph_cache_hit"] > 0
    assert any(Path(cache).iterdir())
