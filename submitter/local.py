"""`submitter submit --local`: the training entrypoint on an embedded local Ray.

Same code path as the RayJob (`training.driver.run`), with CPU workers = --replicas, storage in
an absolute local directory (default `$PWD/runs`), and the events rendered live on the terminal
(rich on a TTY, plain lines otherwise, JSON lines with `-o json`). Returns the exit code:
0 done, 1 training failed; bad input raises UsageError subclasses (exit 2).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping, Optional, TextIO

from submitter.errors import StoragePolicyError, UsageError
from submitter.event_text import describe, fmt as _fmt
from submitter.spec import LOCAL_DEFAULTS, JobSpec, normalize_keys
from submitter.storage import check_local_storage

#: Local runs report progress often: the run is short and someone is watching.
LOCAL_PROGRESS_EVERY = 5


def local_storage_path(file_values: Mapping[str, Any], flags: Mapping[str, Any],
                       cwd: Optional[str] = None) -> str:
    """--storage-path, else the job file's, else `$PWD/runs`; checked for a local run."""
    given = flags.get("storage_path") or normalize_keys(file_values).get("storage_path")
    if given:
        return check_local_storage(str(given))
    default = os.path.join(cwd or os.getcwd(), "runs")
    try:
        return check_local_storage(default)
    except StoragePolicyError:
        raise StoragePolicyError(
            f"the default storage path {default} (./runs) is in scratch space that does not "
            "survive a restart; run from a directory you keep or pass --storage-path "
            "/path/you/keep/runs") from None


def local_spec(file_values: Mapping[str, Any], flags: Mapping[str, Any]) -> JobSpec:
    """LOCAL_DEFAULTS < job file < flags; the storage path is handled apart (it is local)."""
    values = {**LOCAL_DEFAULTS, **{k: v for k, v in normalize_keys(file_values).items()
                                   if k != "storage_path"}}
    overrides = {k: v for k, v in flags.items() if k != "storage_path"}
    return JobSpec.build(values, **overrides)


def run_local(file_values: Mapping[str, Any], flags: Mapping[str, Any], output: str = "text",
              stream: Optional[TextIO] = None) -> int:
    from training.args import config_from_spec

    if output not in ("text", "json"):
        raise UsageError(f"-o {output} is for cluster submits; use -o text or -o json with --local")
    storage = local_storage_path(file_values, flags)
    spec = local_spec(file_values, flags)
    cfg = config_from_spec(spec, storage, progress_every=LOCAL_PROGRESS_EVERY)
    out = stream or sys.stdout
    view = JsonView(out) if output == "json" else (
        RichView(out) if _is_tty(out) else PlainView(out))

    import logging

    import ray

    from training import driver

    driver.quiet_logs()
    started_ray = not ray.is_initialized()
    # the terminal shows the events only: Ray's own output stays in its log files
    driver.ensure_ray(cfg, address="local", include_dashboard=False, log_to_driver=False,
                      logging_level=logging.ERROR)
    try:
        with view:
            outcome = driver.run(cfg, on_event=view.event, notice=view.notice)
        view.summary(outcome)
    finally:
        if started_ray:
            ray.shutdown()
    return 0 if outcome.ok else 1


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def summary_lines(outcome: Any) -> list[str]:
    """The end of the output: final metrics and where the checkpoints are."""
    s = outcome.state
    if not outcome.ok:
        return [f"training failed: {outcome.error}",
                f"events and any checkpoints: {outcome.run_dir}"]
    m = s.metrics
    kept = sorted(d for d in _listdir(outcome.run_dir)
                  if d.startswith("checkpoint_") and os.path.isdir(os.path.join(outcome.run_dir, d)))
    lines = [f"final: epoch {m.get('epoch')}, step {m.get('step')}, "
             f"train_loss {_fmt(m.get('train_loss'))}, val_loss {_fmt(m.get('val_loss'))}, "
             f"{_fmt(m.get('tokens_per_sec'), ',.0f')} tokens/s",
             f"checkpoints: {outcome.run_dir} ({len(kept)} kept: {', '.join(kept)})"]
    if m.get("best_checkpoint"):
        lines.append(f"best checkpoint (val_loss): {m['best_checkpoint']}")
    lines.append(f"events: {os.path.join(outcome.run_dir, 'events.jsonl')}")
    return lines


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class PlainView:
    """Plain lines: logs, pipes, CI."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __enter__(self) -> "PlainView":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def _line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def notice(self, text: str) -> None:
        self._line(text)

    def event(self, event: Mapping[str, Any]) -> None:
        text = describe(event)
        if text:
            self._line(text)

    def summary(self, outcome: Any) -> None:
        for line in summary_lines(outcome):
            self._line(line)


class JsonView(PlainView):
    """`-o json`: the events as JSON lines on stdout; human notes go to stderr."""

    def notice(self, text: str) -> None:
        sys.stderr.write(text + "\n")

    def event(self, event: Mapping[str, Any]) -> None:
        self._line(json.dumps(event, sort_keys=True))

    def summary(self, outcome: Any) -> None:
        for line in summary_lines(outcome):
            sys.stderr.write(line + "\n")


class RichView(PlainView):
    """A live progress bar with the latest loss; event lines scroll above it."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        super().__init__(out)
        self.console = Console(file=out)
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                                 TimeElapsedColumn(), console=self.console, transient=True)
        self.task = self.progress.add_task("starting Ray", total=None, status="")

    def __enter__(self) -> "RichView":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def _line(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def event(self, event: Mapping[str, Any]) -> None:
        t = event.get("type")
        if t == "run_started":
            total = (event.get("epochs") or 0) * (event.get("steps_per_epoch") or 0) or None
            self.progress.update(self.task, description="training", total=total)
        if t == "progress":
            self.progress.update(self.task, completed=event["step"],
                                 status=f"epoch {event['epoch']}  loss {_fmt(event['loss'])}  "
                                        f"{_fmt(event['tokens_per_sec'], ',.0f')} tok/s")
            return
        super().event(event)
