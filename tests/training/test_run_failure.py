"""A failed run's one line (`run_failed`'s error, `training failed: ...`): the first failed
worker's own error, not Ray Train's "Training failed due to worker errors:" (issue 33, item 8).
On Ray Train's own exceptions, constructed as its controller builds them."""

from __future__ import annotations

import ray.train as train

from training.run.failure import chain, line_of, one_line


def _group_error(failures):
    return train.WorkerGroupError("\n".join(f"[Rank {r}] {e!r}" for r, e in failures.items()),
                                  failures)


def test_a_worker_groups_failure_is_named_by_the_first_workers_own_error():
    error = _group_error({1: ValueError("bad batch")})
    assert str(error).splitlines()[0] == "Training failed due to worker errors:"  # Ray's line
    assert one_line(error) == "ValueError: bad batch (rank 1)"
    several = _group_error({3: KeyError("x"), 1: RuntimeError("\nfirst line\nsecond line")})
    assert one_line(several) == "RuntimeError: first line (rank 1; 2 workers failed)"


def test_a_script_that_re_raises_or_exits_still_names_the_workers_error():
    def ended_by(wrap):
        try:
            try:
                raise _group_error({0: ValueError("bad batch")})
            except train.WorkerGroupError as e:
                wrap(e)
        except BaseException as outer:  # noqa: BLE001
            return outer

    def chained(e):
        raise RuntimeError("training did not finish") from e

    def exits(e):
        raise SystemExit(1)  # raised while handling it: __context__

    assert one_line(ended_by(chained)) == "ValueError: bad batch (rank 0)"
    assert one_line(ended_by(exits)) == "ValueError: bad batch (rank 0)"


def test_the_controllers_failure_and_plain_errors_are_their_own_first_line():
    assert one_line(train.ControllerError(OSError("bucket gone"))) == "OSError: bucket gone"
    assert one_line(RuntimeError("no optimizer step ran\nmore")) == "RuntimeError: no optimizer step ran"
    assert one_line(KeyError()) == "KeyError" and line_of(ValueError("  ")) == "ValueError"
    assert len(one_line(ValueError("x" * 2000))) == 500
    assert len(one_line(_group_error({0: ValueError("x" * 2000)}))) <= 500


def test_the_chain_visits_each_error_once_outermost_first():
    inner = ValueError("a")
    group = _group_error({1: inner, 0: inner})
    try:
        raise RuntimeError("outer") from group
    except RuntimeError as e:
        outer = e
    assert list(chain(outer)) == [outer, group, inner]
    assert list(chain(None)) == []
