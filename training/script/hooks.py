"""The guarantees of the GPT-2 job, given to a user's Ray Train script from outside it.

`python -m training.run_script` installs these before it runs the script as `__main__`:

- every `ray.train.RunConfig` the script creates gets the run's directory as its default
  `storage_path` and `name` (`<storage>/<namespace>/<name>`: a RayJob retry or a re-submit
  resumes), a `storage_path` of its own that fails the storage policy is refused in one line
  naming the script's file and line, and `ScriptEvents` and the GPT-2 job's worker error logs
  (training.run.logs: each failed worker's traceback under `<run>/logs/`) join its callbacks;
- every trainer's `fit()` starts the run's event hub (an actor pinned to the driver's node,
  where the pod's service-account token is) and says `run_started` / `run_resumed`.

`ScriptEvents` (a Ray Train UserCallback, run by the controller) turns rank 0's
`ray.train.report(metrics, checkpoint=...)` into `progress` and `checkpoint_saved`, and worker
failures into `worker_group_restarted`, through the hub (`ScriptHub`, a RunEmitter).
"""

from __future__ import annotations

import math
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from submitter.contract.errors import StoragePolicyError, UsageError
from training.events.emitter import Emitter, run_sinks
from training.events.poller import EventPoller
from training.script import HUB_NAME

#: Metric names taken as the GPT-2 events' fields when a script reports them.
STEP_KEYS = ("step", "global_step", "iteration", "training_iteration")


class ScriptStorageRefused(UsageError):
    """The script set a storage_path the policy refuses (exit 2, before any training)."""


@dataclass
class Settings:
    """What the hooks need to know about the run (set by the runner)."""

    storage_root: str  # Ray Train storage_path: <storage>/<namespace> in a pod, <storage> here
    name: str
    run_dir: str
    script_file: str  # the unpacked script's path: its frames name the line of a refusal
    entry: str  # the script's name in the bundle, for messages
    storage_mount: str
    allow_ephemeral: bool
    access_mode: str
    environ: Mapping[str, str]
    job: Mapping[str, Any] = field(default_factory=dict)  # the job document: its secret names
    fits: list[Any] = field(default_factory=list)
    #: called once the hub runs (after ray.init, which installs Ray's own SIGTERM handler)
    on_started: Optional[Callable[[], None]] = None


_settings: Optional[Settings] = None


def script_line(script_file: str, entry: str) -> str:
    """`train.py:42`: the innermost frame of the script in the current stack."""
    for frame in reversed(traceback.extract_stack()):
        if os.path.abspath(frame.filename) == script_file:
            return f"{entry}:{frame.lineno}"
    return entry


def check_script_storage(path: Any, s: Settings,
                         check: Optional[Callable[..., Any]] = None) -> None:
    """Refuse a storage_path the script set that fails the policy (as the job's own would)."""
    if check is None:
        from training.run.mounts import check_storage_here as check
    text = str(path)
    try:
        check(text, s.storage_mount, s.allow_ephemeral, dict(s.environ), s.access_mode)
    except StoragePolicyError as e:
        raise ScriptStorageRefused(
            f"{script_line(s.script_file, s.entry)}: RunConfig(storage_path={text!r}) is refused: "
            f"{e}; leave storage_path out (the run's directory {s.run_dir} is the default) or "
            "use a path on the job's shared storage") from None


def configure_run_config(kwargs: dict[str, Any], s: Settings) -> dict[str, Any]:
    """RunConfig's keyword arguments with the run's defaults and the events callback (pure
    apart from the storage check)."""
    out = dict(kwargs)
    if out.get("storage_path") is None:
        out["storage_path"] = s.storage_root
    else:
        check_script_storage(out["storage_path"], s)
    if out.get("name") is None:
        out["name"] = s.name
    from training.run.logs import worker_error_logs, worker_error_logs_class

    callbacks = list(out.get("callbacks") or [])
    if not any(isinstance(c, worker_error_logs_class()) for c in callbacks):
        # first, as the GPT-2 job's trainer: what only the controller sees is kept before any
        # other callback can fail; the workers keep their own errors (fit() wraps train_fn)
        callbacks.insert(0, worker_error_logs(s.run_dir, s.job))
    if not any(isinstance(c, ScriptEvents) for c in callbacks):
        callbacks.append(ScriptEvents())
    out["callbacks"] = callbacks
    return out


def install(s: Settings) -> None:
    """Patch ray.train.RunConfig and the trainers' fit() for this process."""
    global _settings
    _settings = s
    import ray.train
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    run_config = ray.train.RunConfig
    original_init = run_config.__init__
    if getattr(original_init, "_submitter", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        names = [f.name for f in run_config.__dataclass_fields__.values() if f.init]
        kwargs.update(zip(names, args))  # positional arguments, as dataclass order gives them
        original_init(self, **configure_run_config(kwargs, s))

    __init__._submitter = True  # type: ignore[attr-defined]
    run_config.__init__ = __init__
    original_fit = DataParallelTrainer.fit

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        from training.run.logs import keeping_own_error

        s.fits.append(self)
        if not getattr(self.train_loop_per_worker, "_keeps_own_error", False):
            self.train_loop_per_worker = keeping_own_error(self.train_loop_per_worker,
                                                           s.run_dir, s.job)
        start_hub(self, s)
        if s.on_started is not None:
            s.on_started()
        return original_fit(self, *args, **kwargs)

    DataParallelTrainer.fit = fit


def _num_workers(trainer: Any) -> int:
    n = getattr(getattr(trainer, "scaling_config", None), "num_workers", 1)
    return int(n[1] if isinstance(n, (tuple, list)) else n or 1)


def start_hub(trainer: Any, s: Settings) -> Any:
    """The run's event hub on the driver's node (hard affinity: the ConfigMap sink needs the
    token only the head mounts); run_started, and run_resumed when the run has a checkpoint."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from submitter.contract import naming

    if not ray.is_initialized():
        ray.init()
    try:
        hub = ray.get_actor(HUB_NAME)
    except ValueError:
        env = {k: s.environ[k] for k in (naming.ENV_PROGRESS_CONFIGMAP, naming.ENV_NAMESPACE)
               if s.environ.get(k)}
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        hub = ray.remote(ScriptHub).options(name=HUB_NAME, num_cpus=0, scheduling_strategy=here,
                                            max_concurrency=1, lifetime=None).remote(s.run_dir, env)
    ray.get(hub.started.remote(s.name, _num_workers(trainer), s.storage_root, s.entry))
    if not _poller:
        _poller_of(hub).start()
    return hub


#: The driver's output shows the hub's events as they come (what `submit --local` and
#: `submitter logs` read) and its sinks' problems once, as the GPT-2 driver does.
_poller: list[EventPoller] = []


def _print_event(event: dict[str, Any]) -> None:
    from submitter.contract import events as ev

    print(ev.to_stdout_line(event), flush=True)


def _poller_of(hub: Any) -> EventPoller:
    if not _poller:
        _poller.append(EventPoller(hub, _print_event, every=0.5,
                                   notice=lambda line: print(line, flush=True)))
    return _poller[0]


def drain(hub: Any) -> None:
    """Print the hub's events not printed yet (stdout lines with the events' prefix), and a
    sink's problem not said yet."""
    _poller_of(hub).drain(timeout=30)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def progress_fields(metrics: Mapping[str, Any], reports: int) -> dict[str, Any]:
    """A progress event's fields from a script's metrics: its own names kept under `metrics`,
    `loss` (and lr, tokens_per_sec, epoch, step when reported) in the GPT-2 job's places; the
    step is the report's count when the script reports none."""
    own = {k: v for k, v in metrics.items() if _number(v) is not None}
    step = next((int(metrics[k]) for k in STEP_KEYS if _number(metrics.get(k)) is not None),
                reports)
    epoch = int(metrics["epoch"]) if _number(metrics.get("epoch")) is not None else 0
    return {"epoch": epoch, "step": step, "loss": _number(metrics.get("loss")),
            "lr": _number(metrics.get("lr")),
            "tokens_per_sec": _number(metrics.get("tokens_per_sec")), "metrics": own}


def position(metrics: Mapping[str, Any]) -> Optional[tuple[int, int]]:
    """(epoch, step) as the script reported them, or None when it reports neither (then
    whether it resumed cannot be told from its reports)."""
    epoch = _number(metrics.get("epoch"))
    step = next((_number(metrics[k]) for k in STEP_KEYS if _number(metrics.get(k)) is not None),
                None)
    if epoch is None and step is None:
        return None
    return int(epoch or 0), int(step or 0)


class ScriptHub(Emitter):
    """The run's emitter (events.jsonl, the progress ConfigMap, trackers) plus what a script
    run folds: report counts, and whether the first report after a checkpoint started over."""

    def __init__(self, run_dir: Optional[str], environ: Mapping[str, str]) -> None:
        sinks, history = run_sinks(run_dir, environ)
        super().__init__(sinks, history)
        self.run_dir = run_dir
        progress = [e for e in history if e.get("type") == "progress"]
        self._first = position(progress[0].get("metrics") or {}) if progress else None
        # a script that reports no step: its steps continue the run's count
        self.reports = int(progress[-1].get("step") or 0) if progress else 0
        self.group_reports = 0
        self.first_position: Optional[tuple[int, int]] = None
        self.checkpoint_before = self.state.last_checkpoint
        self.warned = False

    def started(self, name: str, num_workers: int, storage_root: str, entry: str) -> None:
        if self.starts:
            return  # another fit() in the same script: one run
        self.starts = 1
        before = self.state
        self.emit("run_started", run_name=name, num_workers=num_workers,
                  storage_path=storage_root, run_dir=self.run_dir, script=entry)
        if before.last_checkpoint:
            self.emit("run_resumed", resumed_from=before.last_checkpoint,
                      epoch=before.epoch or 0, step=before.step or 0)

    def report(self, metrics: Mapping[str, Any], checkpoint: Optional[str]) -> None:
        self.reports += 1
        self.group_reports += 1
        fields = progress_fields(metrics, self.reports)
        here = position(metrics)
        if self.first_position is None:
            self.first_position = self._first or here
        if (self.group_reports == 1 and self.checkpoint_before and not self.warned
                and here is not None and self.first_position is not None
                and here <= self.first_position):
            self.warned = True  # said once: `watch` prints it
            fields["from_scratch"] = self.checkpoint_before
        self.emit("progress", **fields)
        if checkpoint:
            # after the driver's SIGTERM: the checkpoint its should_stop() asked for
            reason = "preemption" if self.preemption_requested() else "report"
            self.emit("checkpoint_saved", epoch=fields["epoch"], step=fields["step"],
                      path=checkpoint, registered=True, reason=reason)
            self.checkpoint_before = checkpoint

    def failed_workers(self, errors: Mapping[int, str]) -> None:
        self.group_reports = 0
        error = "; ".join(f"rank {rank}: {text}" for rank, text in sorted(errors.items()))
        self.emit("worker_group_restarted", attempt=self.state.restarts + 1,
                  resumed_from=self.state.last_checkpoint, error=error[:500])

    def finished(self) -> dict[str, Any]:
        """run_finished with where the run ended (the last report and checkpoint)."""
        st = self.state
        return self.emit("run_finished", epoch=st.epoch, step=st.step, train_loss=st.loss,
                         latest_checkpoint=st.last_checkpoint, checkpoint_dir=self.run_dir)

    def failed(self, error: str, reason: Optional[str] = None) -> None:
        self.emit("run_failed", error=error, **({"reason": reason} if reason else {}))


def _ray_user_callback() -> Any:
    import ray.train

    return ray.train.UserCallback


class ScriptEvents(_ray_user_callback()):  # type: ignore[misc]
    """Rank 0's reports and the workers' failures, forwarded to the hub (the controller may run
    on another node than the driver)."""

    def _hub(self) -> Any:
        import ray

        return ray.get_actor(HUB_NAME)

    def after_report(self, run_context: Any, metrics: list, checkpoint: Any) -> None:
        import ray

        path = getattr(checkpoint, "path", None) if checkpoint is not None else None
        ray.get(self._hub().report.remote(dict(metrics[0] if metrics else {}), path), timeout=60)

    def after_exception(self, run_context: Any, worker_exceptions: dict) -> None:
        import ray

        from training.run.failure import line_of

        errors = {int(rank): line_of(e)[:200] for rank, e in worker_exceptions.items()}
        try:  # an event that cannot be forwarded (the hub busy under load) never fails the run
            ray.get(self._hub().failed_workers.remote(errors), timeout=60)
        except Exception as e:  # noqa: BLE001 - the errors are kept under <run>/logs/ regardless
            print(f"events: cannot forward the workers' failure: {e}", file=sys.stderr)


def started() -> bool:
    """Whether a fit() of this process started the hub (before it, SIGTERM just ends the
    script)."""
    return bool(_poller)


def hub_or_none() -> Any:
    try:
        import ray

        return ray.get_actor(HUB_NAME) if ray.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


