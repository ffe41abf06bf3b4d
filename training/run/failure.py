"""What ended a run, in the one line its `run_failed` event carries (and `submit --local`
ends with: `training failed: ...`).

Ray Train's `fit()` raises `WorkerGroupError`, whose text starts "Training failed due to worker
errors:" and gives each rank's error on the lines after; the error a user needs is the worker's
own, which Ray Train keeps by rank in `worker_failures` (`ControllerError` keeps its cause in
`controller_failure`). A script may catch and re-raise or chain them: the walk follows
`__cause__` and `__context__` too. Duck-typed, so this module imports no Ray.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

#: The most a run_failed error keeps (the whole traceback is in the driver's log).
MAX_CHARS = 500


def worker_failures(error: Any) -> dict[int, BaseException]:
    """Ray Train's own errors of the failed workers in `error`, by rank ({} for another error)."""
    found = getattr(error, "worker_failures", None)
    if not isinstance(found, Mapping):
        return {}
    return {int(rank): e for rank, e in found.items() if isinstance(e, BaseException)}


def chain(error: Any) -> Iterator[BaseException]:
    """`error`, then what it was raised from or during, the workers' and the controller's own
    errors in it, and theirs: each once, the outermost first."""
    seen: set[int] = set()
    todo: list[Any] = [error]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "controller_failure", None),
                 *(failed for _, failed in sorted(worker_failures(e).items()))]


def line_of(error: BaseException) -> str:
    """`Type: the message's first non-blank line`, or the type alone when it has no message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    name = type(error).__name__
    return (f"{name}: {lines[0]}" if lines else name)[:MAX_CHARS]


def one_line(error: BaseException) -> str:
    """The run's error in one line: the first failed worker's own (the lowest rank, with how
    many failed) when Ray Train gave up on its worker group, the controller's own when that
    failed, else the error itself."""
    for e in chain(error):
        failures = worker_failures(e)
        if failures:
            rank = min(failures)
            more = f"; {len(failures)} workers failed" if len(failures) > 1 else ""
            return f"{line_of(failures[rank])[:MAX_CHARS - 40]} (rank {rank}{more})"
        controller = getattr(e, "controller_failure", None)
        if isinstance(controller, BaseException):
            return line_of(controller)
    return line_of(error)
