"""`submitter submit --local`: the pod's own command, `python -m training`, on this machine.

The CLI never imports ray, torch or transformers: it validates the job, writes nothing, and runs
`python -m training` as a child process with exactly the job document a pod would get
(`$SUBMITTER_JOB`), on an embedded Ray (CPU workers = --replicas), with storage in an absolute
local directory (default `$PWD/runs`). It follows the child's event lines and shows them live
(rich on a TTY, plain lines otherwise, JSON lines with `-o json`); Ctrl-C is forwarded to the
child, which records the run as interrupted. Returns the exit code: 0 done, 1 training failed,
130 interrupted; bad input raises UsageError subclasses (exit 2) before anything starts.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, TextIO

from submitter.contract import events as ev
from submitter.contract.errors import StoragePolicyError, UsageError
from submitter.contract.naming import ENV_ESTIMATE, ENV_JOB, EVENTS_FILE
from submitter.contract.spec import LOCAL_DEFAULTS, JobSpec, local_default_flags, normalize_keys
from submitter.contract.stack import require_training_stack
from submitter.contract.storage import check_local_storage
from submitter.event_text import NO_VALIDATION_CHECKPOINTS, describe, fmt as _fmt, val_loss_text

#: Seconds the child gets to record an interrupted run and stop Ray after Ctrl-C.
INTERRUPT_GRACE_S = 30.0


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


def local_spec(file_values: Mapping[str, Any], flags: Mapping[str, Any],
               storage_path: Optional[str] = None) -> JobSpec:
    """LOCAL_DEFAULTS < job file < flags; the storage path is the checked local one."""
    from_file = normalize_keys(file_values)
    values = {**LOCAL_DEFAULTS, **from_file}
    script = flags.get("script") or values.get("script")
    if script and "name" not in flags and "name" not in from_file:
        values["name"] = script_run_name(str(script))
    values["storage_path"] = storage_path
    overrides = {k: v for k, v in flags.items() if k != "storage_path"}
    return JobSpec.build(values, **overrides)


#: A setting that makes local defaults moot: `--data` trains on its files, so the default
#: --dataset is not what the run reads and must not be named as taken.
SUPERSEDES: dict[str, tuple[str, ...]] = {"data": ("dataset", "dataset_config")}


def local_defaults_line(file_values: Mapping[str, Any], flags: Mapping[str, Any],
                        spec: JobSpec) -> Optional[str]:
    """The run's first line: which settings came from LOCAL_DEFAULTS (neither a flag nor the job
    file gave them), so a run on real data never trains the tiny model unawares. None when none
    did, and for a --script run (its program reads none of them; its name comes from the
    script)."""
    if spec.script is not None:
        return None
    given = {*normalize_keys(file_values), *flags}
    unused = {k for g in given for k in SUPERSEDES.get(g, ())}  # set, but not what trains
    taken = [k for k in LOCAL_DEFAULTS if k not in given and k not in unused]
    if not taken:
        return None
    return (f"local defaults (not given): {local_default_flags(taken)}; a flag or -f sets any "
            "of them (submitter submit --help)")


def script_run_name(script: str) -> str:
    """A --script run's default name: the script's, as a job name (`My_Train.py` -> my-train),
    so it never lands in the GPT-2 demo's run directory."""
    import re

    stem = os.path.splitext(os.path.basename(script))[0].lower()
    name = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")[:40].rstrip("-")
    return name if name[:1].isalpha() else f"script-{name}".rstrip("-")


@dataclass
class LocalOutcome:
    ok: bool
    state: ev.ProgressState
    run_dir: str
    error: Optional[str]
    exit_code: int


def run_local(file_values: Mapping[str, Any], flags: Mapping[str, Any], output: str = "text",
              stream: Optional[TextIO] = None) -> int:
    if output not in ("text", "json"):
        raise UsageError(f"-o {output} is for cluster submits; use -o text or -o json with --local")
    storage = local_storage_path(file_values, flags)
    file_values, flags = local_files(file_values), local_files(flags)
    spec = local_spec(file_values, flags, storage)
    from submitter.estimating import checked_estimate, compact

    est = checked_estimate(spec, local=True, err=sys.stderr)  # --max-cost/--deadline: exit 2 here
    require_training_stack("submit --local", spec.dataset, spec.data)
    out = stream or sys.stdout
    view = JsonView(out) if output == "json" else (
        RichView(out) if _is_tty(out) else PlainView(out))
    from submitter.code_plan import storage_note

    for line in (local_defaults_line(file_values, flags, spec), storage_note(spec)):
        if line:
            view.notice(line)
    with view:
        outcome = follow_child(spec, storage, view,
                               env_extra={ENV_ESTIMATE: compact(est)} if est is not None else None)
    view.summary(outcome)
    return outcome.exit_code


def run_prepare_local(flags: Mapping[str, Any], output: str = "text",
                      stream: Optional[TextIO] = None, force: bool = False) -> int:
    """`submitter data prepare --local`: `python -m training.prepare` as a child process, as
    `submit --local` runs `python -m training`; the corpus goes to `<storage>/corpora/<name>`
    (default storage: `$PWD/runs`, as a local run's)."""
    if output not in ("text", "json"):
        raise UsageError(f"-o {output} is for the cluster's objects; use -o text or -o json "
                         "with --local")
    storage = local_storage_path({}, flags)
    flags = local_files(flags)
    spec = local_spec({}, flags, storage)
    require_training_stack("data prepare --local", spec.dataset, spec.data)
    out = stream or sys.stdout
    view = JsonView(out) if output == "json" else PlainView(out)
    with view:
        outcome = follow_child(spec, storage, view, [sys.executable, "-m", "training.prepare",
                                                     *(["--force"] if force else [])])
    given = f" --storage-path {storage}" if flags.get("storage_path") else ""
    given += train_tokenizer_flags(flags)
    lines = ([f"train on it: submitter submit --local --data {spec.name}{given}"]
             if outcome.ok else [f"prepare {'refused' if outcome.exit_code in (2, 8) else 'failed'}: "
                                 f"{outcome.error}"])
    for line in lines:
        (sys.stderr if output == "json" else out).write(line + "\n")
    return outcome.exit_code


#: The settings that name a file the program reads (a local run reads them on this machine).
LOCAL_FILE_SETTINGS = ("data", "val_data", "bpe_file")


def local_files(values: Mapping[str, Any]) -> dict[str, Any]:
    """A local run reads its files here: a relative or `~` path (not a corpus NAME, not a URI)
    becomes absolute, and one that is not there is refused now (one line, exit 2), before
    anything starts or is written."""
    from submitter.contract.data_path import is_corpus_name, looks_like_mixture
    from submitter.contract.storage import scheme_of

    out = dict(values)
    for key in LOCAL_FILE_SETTINGS:
        value = out.get(key)
        if not isinstance(value, str) or not value or scheme_of(value):
            continue
        if key != "bpe_file" and (is_corpus_name(value) or looks_like_mixture(value)):
            continue  # a prepared corpus under the storage path: the program looks it up
        path = os.path.abspath(os.path.expanduser(value))
        if not os.path.exists(path):
            raise UsageError(f"--{key.replace('_', '-')} {value}: no such file or directory "
                             f"here ({path}); give a path on this machine or a bucket URI")
        out[key] = path
    return out


def train_tokenizer_flags(flags: Mapping[str, Any]) -> str:
    """The tokenizer flags a prepare was given, for the `submit` that trains on its corpus
    (which refuses another tokenizer): ` --tokenizer T --bpe-file F`, or ''."""
    out = ""
    for key in ("tokenizer", "bpe_file"):
        if flags.get(key) is not None:
            value = str(flags[key])
            out += f" --{key.replace('_', '-')} {shlex.quote(value)}"
    return out


def child_command() -> list[str]:
    """The pod's command (the RayJob's constant entrypoint), with this interpreter."""
    return [sys.executable, "-m", "training"]


def script_command() -> list[str]:
    """A --script job's pod command (submitter.code_plan.SCRIPT_ENTRYPOINT), with this interpreter."""
    return [sys.executable, "-m", "training.run_script"]


def follow_child(spec: JobSpec, storage: str, view: "PlainView",
                 command: Optional[list[str]] = None,
                 env_extra: Optional[Mapping[str, str]] = None) -> LocalOutcome:
    """Run `python -m training` (or `command`: another program behind the same contract) with
    the job document; show its events as they come. `env_extra`: e.g. the estimate
    (ENV_ESTIMATE) the run records in its run.json."""
    from submitter.code_plan import local_code_env

    env = {**os.environ, ENV_JOB: spec.document(), "PYTHONUNBUFFERED": "1",
           **local_code_env(spec), **(env_extra or {})}
    env.pop("RAY_ADDRESS", None)  # always an embedded Ray, never someone's cluster
    command = command or (child_command() if spec.script is None else script_command())
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True,
                            encoding="utf-8", errors="replace", bufsize=1,
                            start_new_session=True)  # Ctrl-C reaches it once: forwarded below
    reader = _Reader(proc, view)
    interrupted = False
    try:
        try:
            reader.pump()
        except KeyboardInterrupt:
            interrupted = True
            _interrupt(proc, reader)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            _kill(proc)
    # the child says where the run lives (run_started.run_dir); a local run: <storage>/<name>
    state, run_dir = reader.state, reader.run_dir or os.path.join(storage, spec.run_name)
    if interrupted or code in (130, -signal.SIGINT):
        error = state.error or ("interrupted (Ctrl-C); run it again with the same name and "
                                "storage path to continue from the last checkpoint")
        return LocalOutcome(False, state, run_dir, error, 130)
    ok = code == 0 and state.status == "finished"
    for line in reader.pace_lines():
        view.notice(f"measured vs estimated: {line}")
    program = " ".join(["python", *command[1:]])
    error = None if ok else (state.error or (
        f"the reason is the error line above ({program} exited {code} before training)"
        if code in (2, 8) else f"{program} exited with code {code}"))
    # 2: bad input; 8: a conflict (another prepare holds the corpus's lease); else failed
    return LocalOutcome(ok, state, run_dir, error, 0 if ok else (code if code in (2, 8) else 1))


class _Reader:
    """The child's stdout: event lines fold into the state and go to the view; the rest are
    notices (what the entrypoint says about storage, data, the model)."""

    def __init__(self, proc: subprocess.Popen, view: "PlainView") -> None:
        from submitter.pace import PaceWarning

        self.proc, self.view, self.state = proc, view, ev.ProgressState()
        self.run_dir: Optional[str] = None
        self.events: list[dict[str, Any]] = []
        self.estimate: Optional[dict[str, Any]] = None  # run.json's (submitter.pace, #38)
        self.pace = PaceWarning()

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = ev.parse_line(line) if line.startswith(ev.STDOUT_PREFIX) else None
            if event is not None:
                self.state = ev.apply(self.state, event)
                self.events.append(event)
                if event["type"] == "run_started" and isinstance(event.get("run_dir"), str):
                    self.run_dir = event["run_dir"]
                    self.estimate = run_estimate(self.run_dir)
                self.view.event(event)
                if event["type"] == "progress":
                    self._check_pace()
            elif line.strip():
                self.view.notice(line.rstrip("\n"))

    def _check_pace(self) -> None:
        from submitter.pace import measured_from_events

        if not self.estimate or self.pace.warned:  # nothing to compare with, or said once
            return
        warning = self.pace.check(self.estimate, measured_from_events(self.events, self.state))
        if warning:
            self.view.notice(warning)

    def pace_lines(self) -> list[str]:
        """Measured against the estimate at the end of the run ([] without one)."""
        from submitter.pace import comparison, measured_from_events

        if not self.estimate or not self.events:
            return []
        return comparison(self.estimate, measured_from_events(self.events, self.state))


def run_estimate(run_dir: str) -> Optional[dict[str, Any]]:
    """The estimate recorded in the run's run.json (naming.RUN_ESTIMATE_KEY), None without one."""
    from submitter.contract.naming import RUN_ESTIMATE_KEY

    try:
        with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
            value = json.load(f).get(RUN_ESTIMATE_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, dict) else None


def _interrupt(proc: subprocess.Popen, reader: _Reader) -> None:
    """Forward Ctrl-C and keep reading: the child records `run_failed` and stops its Ray.
    If it has not ended after INTERRUPT_GRACE_S, or Ctrl-C comes again, it is killed."""
    import threading

    proc.send_signal(signal.SIGINT)
    timer = threading.Timer(INTERRUPT_GRACE_S, _kill, args=(proc,))
    timer.daemon = True
    timer.start()
    try:
        reader.pump()
    except KeyboardInterrupt:
        _kill(proc)
    finally:
        timer.cancel()


def _kill(proc: subprocess.Popen) -> None:
    """The child and everything it started (its own process group: Ray's processes too)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def summary_lines(outcome: Any) -> list[str]:
    """The end of the output: final metrics and where the checkpoints are."""
    s = outcome.state
    if not outcome.ok and getattr(s, "status", None) == "stopped":  # a limit: not a failure
        return [f"stopped: {outcome.error}", f"checkpoints: {outcome.run_dir}"]
    if not outcome.ok:
        return failure_lines(outcome.error, outcome.run_dir,
                             refused=getattr(outcome, "exit_code", 1) == 2)
    m = s.metrics
    kept = sorted(d for d in _listdir(outcome.run_dir)
                  if d.startswith("checkpoint_") and os.path.isdir(os.path.join(outcome.run_dir, d)))
    lines = [f"final: epoch {m.get('epoch')}, step {m.get('step')}, "
             f"train_loss {_fmt(m.get('train_loss'))}, {val_loss_text(m.get('val_loss'))}, "
             f"{_fmt(m.get('tokens_per_sec'), ',.0f')} tokens/s",
             f"checkpoints: {outcome.run_dir} ({len(kept)} kept: {', '.join(kept)})"]
    if m.get("val_loss") is None:  # Ray Train ranked them by report order (scored())
        lines.append(NO_VALIDATION_CHECKPOINTS)
    elif m.get("best_checkpoint"):
        lines.append(f"best checkpoint (val_loss): {m['best_checkpoint']}")
    lines.append(f"events: {os.path.join(outcome.run_dir, EVENTS_FILE)}")
    if m.get("export_dir"):
        lines.append(f"model (Hugging Face): {m['export_dir']}")
    if m.get("sample") is not None:
        lines.append(f"sample: {m['sample']!r}")
    return lines


def require_run(name: str, storage_path: str, namespace: Optional[str] = None) -> None:
    """A run looked up by name on a mounted storage path must exist: NotFound (exit 6, the
    table's code for a run that does not exist) names where it was looked for. An object-store
    path is left to the command (export refuses it with its own fix)."""
    from submitter.contract.errors import NotFound

    if "://" in storage_path and not storage_path.startswith("file://"):
        return
    base = os.path.abspath(storage_path.removeprefix("file://"))
    run_dir = os.path.join(base, *([namespace] if namespace else []), name)
    if not os.path.isdir(run_dir):
        raise NotFound(f"no run {name} at {run_dir}; check the name, --storage-path and "
                       "--namespace (a cluster run is under <storage>/<namespace>/<name>)")


def failure_lines(error: Optional[str], run_dir: str, refused: bool) -> list[str]:
    """A run that did not finish: a refusal (exit 2: bad input, nothing trained) says it was
    refused, not that training failed; the run's folder is named only when it exists, so the
    last line never points at something that was not written."""
    lines = [f"run refused: {error}" if refused else f"training failed: {error}"]
    if os.path.isdir(run_dir):
        lines.append(f"events and any checkpoints: {run_dir}")
    return lines


def run_export(name: str, storage_path: str, output: str, namespace: Optional[str] = None,
               checkpoint: Optional[str] = None) -> int:
    """`submitter export`: `python -m training export ...` as a child process (this process
    never imports torch); its output and exit code are the command's."""
    JobSpec.build(name=name)  # the same name rules as submit (exit 2 with the fix)
    if checkpoint is None:
        require_run(name, storage_path, namespace)  # exit 6 before asking for torch
    require_training_stack("submitter export")
    argv = [*child_command(), "export", name, "--storage-path", storage_path, "-o", output]
    argv += ["--namespace", namespace] if namespace else []
    argv += ["--checkpoint", checkpoint] if checkpoint else []
    return subprocess.run(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode


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
