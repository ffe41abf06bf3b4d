"""The run's metrics where ML engineers already look: TensorBoard always, MLflow and Weights &
Biases when their own environment variables ask for them.

One writer per run: the run's emitter (training.events.emitter, the driver's actor) already receives
every metric rank 0 reports, so the trackers hang off it as one more sink (`TrackerSink`) and
the training step pays nothing for them. Each backend runs in a thread of its own behind a
queue, so a slow or absent server never blocks the emitter: a call that fails is retried with
backoff (the metrics wait in the queue), the first failure is logged once and becomes a
`tracker_failed` event, the recovery a `tracker_recovered` event.

Curves stay clean across restarts and resizes: the global step is the optimizer step, and a
backend writes a metric only for steps above the last one it holds. The last step comes from
the backend itself where it can say (TensorBoard's event files, MLflow's metric history), else
from the run's event history; points the history holds and the backend lacks are written first
(a tracker that was down catches up). So the steps a restored run redoes appear once.

Where each writes:
- TensorBoard: `<run>/tensorboard/` (the PVC, or a local directory uploaded to the bucket on
  flush: objects cannot be appended to, and each driver session writes its own event file).
- MLflow: `MLFLOW_TRACKING_URI` (and MLflow's other variables); one MLflow run per submitter run,
  its id kept in `<run>/mlflow.json`; params from the job document; the exported model at the end.
- W&B: `WANDB_API_KEY` or `WANDB_MODE`; one W&B run per submitter run, its id in `<run>/wandb.json`
  (resumed by id); files under `WANDB_DIR`, else the run directory when it is a local path.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import queue
import shutil
import struct
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Iterable, Mapping, Optional

from submitter.contract import events as ev
from submitter.contract.errors import UsageError
from submitter.contract.tracking import tracker_env_problem
from submitter.contract.flops import mfu, peak_for, preset_flops_per_token
from submitter.contract.stack import pip_install
from training.run.object_store import split_uri
from training.run.identity import RUN_FILE, is_local, join, read_json

log = logging.getLogger("training.events.trackers")

TENSORBOARD_DIR = "tensorboard"
MLFLOW_FILE = "mlflow.json"
WANDB_FILE = "wandb.json"
#: Event field -> metric name, per event type (the names torchtitan and Lightning users know).
PROGRESS_METRICS = {"loss": "train/loss", "lr": "train/lr", "tokens_per_sec": "train/tokens_per_sec",
                    "data_wait_fraction": "train/data_wait_fraction", "grad_norm": "train/grad_norm"}
EPOCH_METRICS = {"val_loss": "val/loss", "train_loss": "train/epoch_loss", "epoch": "train/epoch"}
#: Settings that are no metric of the run and may hold what is nobody's business in a tracker.
PRIVATE_SETTINGS = ("env", "secret_env", "env_from_secret")
#: Seconds a backend gets to drain its queue when the run ends (an artifact upload included).
CLOSE_TIMEOUT_S = 120.0
#: Metric points a backend queues while its server is down (the oldest are dropped beyond).
MAX_QUEUED = 50_000
#: Seconds a backend that is failing when the run ends gets before it is left behind.
FAILING_GRACE_S = 10.0
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class TrackerMissing(UsageError):
    """A tracker's variables are set but its package is not installed here."""


# --- which trackers, and are they here ---------------------------------------------------------

def requested(environ: Mapping[str, str]) -> list[str]:
    """The trackers this environment asks for, in order; TensorBoard always."""
    out = ["tensorboard"]
    if environ.get("MLFLOW_TRACKING_URI"):
        out.append("mlflow")
    if (environ.get("WANDB_API_KEY") or environ.get("WANDB_MODE")) and \
            environ.get("WANDB_MODE") != "disabled":
        out.append("wandb")
    return out


#: tracker -> (module it needs, what to install, the variable that asked for it)
_PACKAGES = {"tensorboard": ("tensorboardX", pip_install("train"), None),
             "mlflow": ("mlflow", pip_install("mlflow"), "MLFLOW_TRACKING_URI"),
             "wandb": ("wandb", pip_install("wandb"), "WANDB_API_KEY or WANDB_MODE")}


def check_values(environ: Mapping[str, str]) -> None:
    """The trackers' variables that can be wrong before anything starts (UsageError, exit 2)."""
    problem = tracker_env_problem(environ)
    if problem:
        raise UsageError(problem)


def check_installed(environ: Mapping[str, str],
                    find: Callable[[str], Any] = importlib.util.find_spec) -> list[str]:
    """Before training starts: the trackers' variables make sense and every requested
    tracker's package can be imported here, else UsageError (exit 2) with one line (naming
    the pip command). Returns the requested trackers."""
    check_values(environ)
    names = requested(environ)
    for name in names:
        module, pip, variable = _PACKAGES[name]
        if find(module) is None:
            why = f"{variable} is set, but " if variable else ""
            raise TrackerMissing(f"{why}{module} is not installed where the run's driver runs "
                                 f"(for a cluster job: in the image): {pip}, or unset it")
    return names


# --- events -> metric points (pure) ------------------------------------------------------------

def peak_tflops(gpu: Optional[str]) -> Optional[float]:
    """The run's GPU's dense 16-bit peak (submitter.contract.flops, the table the GPU smoke run uses), or
    None: MFU is written only where the card is known."""
    peak = peak_for(gpu) if gpu else None
    return peak.tflops if peak else None


def points_of(event: Mapping[str, Any], facts: Mapping[str, Any],
              world_size: Optional[int]) -> list[tuple[int, dict[str, float]]]:
    """The metric points in one event: [(step, {name: value})]. `facts` are run_started's
    fields (model, params, block_size, gpu: for MFU); `world_size` the group training now."""
    etype, step = event.get("type"), event.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return []
    names = PROGRESS_METRICS if etype == "progress" else \
        EPOCH_METRICS if etype == "epoch_finished" else \
        {"val_loss": "val/loss"} if etype == "checkpoint_saved" else {}  # interval saves too
    values = {name: float(event[k]) for k, name in names.items()
              if isinstance(event.get(k), (int, float)) and not isinstance(event.get(k), bool)}
    if etype == "progress":
        if world_size:
            values["train/workers"] = float(world_size)
        peak, params, tok_s = peak_tflops(facts.get("gpu")), facts.get("params"), \
            event.get("tokens_per_sec")
        block = facts.get("block_size")
        per_token = preset_flops_per_token(str(facts.get("model")), params, block) \
            if isinstance(params, int) and isinstance(block, int) else None
        if peak and per_token and isinstance(tok_s, (int, float)) and world_size:
            values["train/mfu"] = mfu(tok_s / world_size, per_token, peak)  # submitter.contract.flops
    return [(step, values)] if values else []


def history_points(history: Iterable[Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """Every metric point of the run's earlier events, in order (duplicates of redone steps
    included: a backend keeps the first)."""
    facts: dict[str, Any] = {}
    state = ev.ProgressState()
    out: list[tuple[int, dict[str, float]]] = []
    for e in history:
        if e.get("type") == "run_started":
            facts = dict(e)
        state = ev.apply(state, e)  # the group's size as the live sink sees it (the emitter's fold)
        out.extend(points_of(e, facts, state.world_size))
    return out


def last_steps(points: Iterable[tuple[int, Mapping[str, float]]]) -> dict[str, int]:
    last: dict[str, int] = {}
    for step, values in points:
        for name in values:
            last[name] = max(step, last.get(name, step))
    return last


def new_values(step: int, values: Mapping[str, float], last: dict[str, int]) -> dict[str, float]:
    """The values above each metric's last written step (and mark them written)."""
    out = {k: v for k, v in values.items() if step > last.get(k, -1)}
    for k in out:
        last[k] = step
    return out


def params_of(job: Mapping[str, Any]) -> dict[str, Any]:
    """The job document as flat params: scalars as they are, the rest as JSON; no env."""
    out: dict[str, Any] = {}
    for key, value in sorted(job.items()):
        if key in PRIVATE_SETTINGS:
            continue
        out[key] = value if isinstance(value, (str, int, float, bool)) or value is None \
            else json.dumps(value, sort_keys=True)
    return out


def settings_markdown(params: Mapping[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {str(v).replace('|', '/')} |" for k, v in params.items())
    return "| setting | value |\n|---|---|\n" + rows


# --- TensorBoard event files: read back the last step -----------------------------------------

def read_records(data: bytes) -> Iterable[bytes]:
    """TFRecord payloads (length, crc, payload, crc); a torn tail ends the file."""
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length + 4
        if end > len(data):
            return
        yield data[pos + 12:pos + 12 + length]
        pos = end


def event_file_steps(data: bytes) -> dict[str, int]:
    """The last step of every scalar in one event file's bytes."""
    from tensorboardX.proto.event_pb2 import Event

    last: dict[str, int] = {}
    for payload in read_records(data):
        event = Event()
        try:
            event.ParseFromString(payload)
        except Exception:  # noqa: BLE001 - a damaged record: skip it
            continue
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                last[value.tag] = max(event.step, last.get(value.tag, event.step))
    return last


def _is_event_file(path: str) -> bool:
    return "tfevents" in os.path.basename(path)


def read_event_files(logdir: str) -> list[bytes]:
    """The bytes of every event file under a directory or an object-store URI."""
    out: list[bytes] = []
    if is_local(logdir):
        for root, _, files in os.walk(logdir.removeprefix("file://")):
            for name in sorted(files):
                if _is_event_file(name):
                    with open(os.path.join(root, name), "rb") as f:
                        out.append(f.read())
        return out
    from pyarrow import fs as pafs

    filesystem, path = split_uri(logdir)
    for info in filesystem.get_file_info(pafs.FileSelector(path, recursive=True,
                                                           allow_not_found=True)):
        if info.type == pafs.FileType.File and _is_event_file(info.path):
            with filesystem.open_input_stream(info.path) as f:
                out.append(f.read())
    return out


# --- the backends: one small class each, one interface -----------------------------------------

class Backend:
    """open -> last_steps -> log* -> artifact? -> close. Every call may raise (a server that is
    down): the worker retries it. `name` is what events and warnings call it."""

    name = "backend"

    def open(self, run: "RunInfo") -> None: ...

    def last_steps(self) -> Optional[dict[str, int]]:
        """The last step of each metric the backend holds; None: it cannot say."""
        return None

    #: Seconds between calls: a network backend sends the points of that time in one call.
    min_interval = 0.0

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def log_many(self, points: list[tuple[int, dict[str, float]]]) -> None:
        for step, values in points:
            self.log(step, values)

    def artifact(self, local_dir: str) -> None: ...

    def flush(self) -> None: ...

    def close(self, ok: bool) -> None: ...


class RunInfo:
    """What a backend needs to know of the run (read once, at open)."""

    def __init__(self, run_dir: str, environ: Mapping[str, str]) -> None:
        self.run_dir, self.environ = run_dir, environ
        self.name = os.path.basename(run_dir.rstrip("/"))
        self._record: Optional[dict[str, Any]] = None

    @property
    def params(self) -> dict[str, Any]:
        if self._record is None:
            self._record = read_json(join(self.run_dir, RUN_FILE)) or {}
        return params_of(self._record.get("job") or {})


class TensorBoard(Backend):
    """`<run>/tensorboard/` event files, via tensorboardX (no TensorFlow, no torch import)."""

    name = "tensorboard"

    def __init__(self, upload_every: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.upload_every, self.clock = upload_every, clock
        self.writer: Any = None
        self._uploaded: Optional[float] = None
        self._added: dict[str, int] = {}

    def open(self, run: RunInfo) -> None:
        from tensorboardX import SummaryWriter

        self.remote = join(run.run_dir, TENSORBOARD_DIR)
        existing = read_event_files(self.remote)
        self._last = {}
        for data in existing:
            for tag, step in event_file_steps(data).items():
                self._last[tag] = max(step, self._last.get(tag, step))
        if is_local(self.remote):
            self.local = self.remote.removeprefix("file://")
        else:  # write here, upload the session's file on flush
            self.local = tempfile.mkdtemp(prefix="tensorboard-")
        # two writers opening one run's directory at once (a retried driver beside the one
        # still draining): tensorboardX checks, then creates, and the later one raised
        # FileExistsError; a directory that exists already is never created
        os.makedirs(self.local, exist_ok=True)
        # one file per driver session (the name has only the second and the host otherwise)
        self.writer = SummaryWriter(self.local, flush_secs=10,
                                    filename_suffix=f".{os.getpid()}.{uuid.uuid4().hex[:8]}")
        if not existing:  # a new run: its settings, once
            params = run.params
            self.writer.add_text("settings", settings_markdown(params), 0)
            _write_hparams(self.writer, params)

    def last_steps(self) -> Optional[dict[str, int]]:
        return dict(self._last)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            if step > self._added.get(tag, -1):  # a retry after a failed upload adds nothing twice
                self.writer.add_scalar(tag, value, step)
                self._added[tag] = step
        if not is_local(self.remote) and (self._uploaded is None or
                                          self.clock() - self._uploaded >= self.upload_every):
            self.flush()

    def flush(self) -> None:
        self.writer.flush()
        if not is_local(self.remote):
            upload_dir(self.local, self.remote)
            self._uploaded = self.clock()

    def close(self, ok: bool) -> None:
        if self.writer is not None:
            self.writer.close()
            if not is_local(self.remote):
                upload_dir(self.local, self.remote)
                shutil.rmtree(self.local, ignore_errors=True)
            self.writer = None


def _write_hparams(writer: Any, params: Mapping[str, Any]) -> None:
    """The settings in TensorBoard's HParams tab, in this run (not a sub-run)."""
    from tensorboardX.summary import hparams

    values = {k: (v if isinstance(v, (int, float, str, bool)) else str(v))
              for k, v in params.items()}
    exp, ssi, sei = hparams(values, {"val/loss": 0.0})
    file_writer = writer._get_file_writer()
    for summary in (exp, ssi, sei):
        file_writer.add_summary(summary)


def upload_dir(local_dir: str, remote: str) -> None:
    """Copy every file under local_dir to the same relative path under an object-store URI."""
    filesystem, base = split_uri(remote)
    for root, _, files in os.walk(local_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), local_dir).replace(os.sep, "/")
            with open(os.path.join(root, name), "rb") as src, \
                    filesystem.open_output_stream(f"{base.split('?')[0]}/{rel}") as dst:
                dst.write(src.read())


def _stored_id(path: str, key: str, matches: Mapping[str, Any]) -> Optional[str]:
    """The tracker run id kept in the run directory, if it belongs to the same server."""
    stored = read_json(path) or {}
    if all(stored.get(k) == v for k, v in matches.items()):
        return stored.get(key)
    return None


def write_json(path: str, data: Mapping[str, Any]) -> None:
    """Write (or replace) a small JSON file at a path or URI."""
    text = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")
    if is_local(path):
        p = path.removeprefix("file://")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p + ".tmp", "wb") as f:
            f.write(text)
        os.replace(p + ".tmp", p)
        return
    filesystem, p = split_uri(path)
    with filesystem.open_output_stream(p.split("?")[0]) as f:
        f.write(text)


class Mlflow(Backend):
    """One MLflow run per submitter run (its id in `<run>/mlflow.json`), resumed after restarts."""

    name = "mlflow"
    min_interval = 5.0

    def open(self, run: RunInfo) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = run.environ["MLFLOW_TRACKING_URI"]
        self.client = MlflowClient(tracking_uri=self.uri)
        path = join(run.run_dir, MLFLOW_FILE)
        self.run_id = _stored_id(path, "run_id", {"tracking_uri": self.uri})
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = _mlflow_experiment(self.client, run.environ)
        created = self.client.create_run(experiment, run_name=run.name,
                                         tags={"submitter.run_dir": run.run_dir})
        self.run_id = created.info.run_id
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in run.params.items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        write_json(path, {"run_id": self.run_id, "tracking_uri": self.uri,
                          "experiment_id": experiment})

    def last_steps(self) -> Optional[dict[str, int]]:
        out: dict[str, int] = {}
        for key in self.client.get_run(self.run_id).data.metrics:
            history = self.client.get_metric_history(self.run_id, key)
            if history:
                out[key] = max(m.step for m in history)
        return out

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.log_many([(step, dict(values))])

    def log_many(self, points: list[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for step, values in points for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # log_batch's limit
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def artifact(self, local_dir: str) -> None:
        self.client.log_artifacts(self.run_id, local_dir, artifact_path="model")

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


def _mlflow_experiment(client: Any, environ: Mapping[str, str]) -> str:
    """MLflow's own variables pick the experiment; else one named `submitter`."""
    if environ.get("MLFLOW_EXPERIMENT_ID"):
        return environ["MLFLOW_EXPERIMENT_ID"]
    name = environ.get("MLFLOW_EXPERIMENT_NAME") or "submitter"
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)


class Wandb(Backend):
    """One W&B run per submitter run, resumed by the id kept in `<run>/wandb.json`."""

    name = "wandb"

    def open(self, run: RunInfo) -> None:
        import wandb

        path = join(run.run_dir, WANDB_FILE)
        project = run.environ.get("WANDB_PROJECT") or "submitter"
        run_id = _stored_id(path, "id", {"project": project})
        if run_id is None:
            run_id = f"{run.name[:40]}-{uuid.uuid4().hex[:12]}"
            write_json(path, {"id": run_id, "project": project})
        directory = run.environ.get("WANDB_DIR") or (
            run.run_dir.removeprefix("file://") if is_local(run.run_dir) else tempfile.mkdtemp())
        os.makedirs(directory, exist_ok=True)
        self.run = wandb.init(project=project, entity=run.environ.get("WANDB_ENTITY"),
                              name=run.name, id=run_id, resume="allow", dir=directory,
                              mode=_WANDB_MODE_NAMES.get(run.environ.get("WANDB_MODE") or "",
                                                         run.environ.get("WANDB_MODE")),
                              config=run.params,
                              settings=wandb.Settings(console="off", x_disable_stats=True))

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


_WANDB_MODE_NAMES = {"dryrun": "offline", "run": "online"}


BACKENDS: dict[str, Callable[[], Backend]] = {"tensorboard": TensorBoard, "mlflow": Mlflow,
                                               "wandb": Wandb}


# --- one worker thread per backend: queue, retries, warnings ----------------------------------

Notify = Callable[..., None]


class Worker:
    """Feeds one backend from a queue in its own thread. A call that raises is retried with
    backoff until it succeeds (the queue waits); the first failure warns and notifies
    (`tracker_failed`), the first success after it notifies `tracker_recovered`."""

    def __init__(self, backend: Backend, run: RunInfo, history: list[tuple[int, dict[str, float]]],
                 notify: Notify, backoff: tuple[float, ...] = BACKOFF_S) -> None:
        self.backend, self.run, self.history = backend, run, history
        self.notify, self.backoff = notify, backoff
        self.queue: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        self.failing: Optional[float] = None
        self.closing = threading.Event()
        self.opened = threading.Event()  # the backend is open and caught up with the history
        self.dropped = 0
        self.gave_up = False
        self.deadline = self.closed_at = float("inf")
        self.thread = threading.Thread(target=self._main, name=f"tracker-{backend.name}",
                                       daemon=True)
        self.thread.start()

    def put(self, op: str, arg: Any = None) -> None:
        if op == "log" and self.queue.qsize() >= MAX_QUEUED:
            self.dropped += 1
            return
        self.queue.put((op, arg))

    def close(self, ok: bool, timeout: float) -> bool:
        """Ask the backend to finish; wait up to `timeout` (True if it did)."""
        self.closed_at = time.monotonic()
        self.deadline = self.closed_at + timeout
        self.queue.put(("close", ok))
        self.closing.set()
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _call(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Call until it succeeds (True), or until closing makes a failing call give up."""
        attempt = 0
        while not self.gave_up:
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - a tracker never stops training
                error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                if self.failing is None:
                    self.failing = time.monotonic()
                    log.warning("tracker %s failed (%s); training goes on, retrying with "
                                "backoff", self.backend.name, error)
                    self.notify("tracker_failed", tracker=self.backend.name, error=error)
                now = time.monotonic()
                if self.closing.is_set() and (now >= self.deadline or
                                              now >= self.closed_at + FAILING_GRACE_S):
                    self.gave_up = True  # the run is over: what is left of the queue goes
                    break
                time.sleep(self.backoff[min(attempt, len(self.backoff) - 1)])
                attempt += 1
                continue
            if self.failing is not None:
                down = round(time.monotonic() - self.failing, 1)
                self.failing = None
                self.notify("tracker_recovered", tracker=self.backend.name, down_s=down)
            return True
        return False

    def _main(self) -> None:
        b = self.backend
        if not self._call(b.open, self.run):
            return
        last: dict[str, int] = {}
        self._call(lambda: last.update(_known_last(b, self.history)))
        # what the backend lacks of the run so far
        self._log([(step, new_values(step, values, last)) for step, values in self.history])
        self.opened.set()
        pending: Optional[tuple[str, Any]] = None
        sent = float("-inf")
        while True:
            op, arg = pending or self.queue.get()
            pending = None
            if op == "log":  # with the points that come within the backend's min_interval
                points = [arg]
                while True:
                    wait = sent + b.min_interval - time.monotonic()
                    try:
                        nxt = self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt[0] != "log":
                        pending = nxt
                        break
                    points.append(nxt[1])
                self._log([(step, new_values(step, values, last)) for step, values in points])
                sent = time.monotonic()
            elif op == "artifact":
                self._call(b.artifact, arg)
            elif op == "flush":
                self._call(b.flush)
            elif op == "close":
                self._call(b.close, arg)
                return

    def _log(self, points: list[tuple[int, dict[str, float]]]) -> None:
        points = [(step, values) for step, values in points if values]
        if points:
            self._call(self.backend.log_many, points)


def _known_last(backend: Backend, history: list[tuple[int, dict[str, float]]]) -> dict[str, int]:
    own = backend.last_steps()
    return dict(own) if own is not None else last_steps(history)


# --- the emitter sink --------------------------------------------------------------------------

def _local_copy(uri: str) -> tuple[str, bool]:
    """A local directory with an export's files (downloaded from an object store). (dir, temp)."""
    if is_local(uri):
        return uri.removeprefix("file://"), False
    from pyarrow import fs as pafs

    filesystem, base = split_uri(uri)
    base = base.split("?")[0]
    out = tempfile.mkdtemp(prefix="export-")
    for info in filesystem.get_file_info(pafs.FileSelector(base, recursive=True)):
        if info.type == pafs.FileType.File:
            target = os.path.join(out, os.path.relpath(info.path, base))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with filesystem.open_input_stream(info.path) as src, open(target, "wb") as dst:
                dst.write(src.read())
    return out, True


class TrackerSink:
    """An emitter sink (training.events.emitter.Sink): events -> metric points -> every backend's
    worker. `bind(emit)` gives it the emitter, for the tracker_failed/recovered events."""

    def __init__(self, run_dir: str, environ: Mapping[str, str],
                 history: list[Mapping[str, Any]],
                 backends: Optional[list[Backend]] = None, backoff: tuple[float, ...] = BACKOFF_S,
                 close_timeout: float = CLOSE_TIMEOUT_S) -> None:
        self.run = RunInfo(run_dir, environ)
        self.facts: dict[str, Any] = {}
        for e in history:
            if e.get("type") == "run_started":
                self.facts = dict(e)
        self.close_timeout = close_timeout
        self._emit: Optional[Callable[..., Any]] = None
        self._notices: "queue.Queue[tuple[str, dict[str, Any]]]" = queue.Queue()
        threading.Thread(target=self._notifier, name="tracker-events", daemon=True).start()
        past = history_points(history)
        chosen = backends if backends is not None else [BACKENDS[n]() for n in requested(environ)]
        self.workers = [Worker(b, self.run, past, self._notify, backoff) for b in chosen]
        self.closed = False

    def bind(self, emit: Callable[..., Any]) -> None:
        self._emit = emit

    def _notify(self, etype: str, **fields: Any) -> None:
        self._notices.put((etype, fields))

    def _notifier(self) -> None:
        """Emits the workers' notices from a thread of its own: a worker never waits for the
        emitter, which may be waiting for the worker (at close)."""
        while True:
            etype, fields = self._notices.get()
            if self._emit is not None:
                try:
                    self._emit(etype, **fields)
                except Exception as e:  # noqa: BLE001
                    log.warning("could not record %s: %s", etype, e)

    def write(self, event: Mapping[str, Any], state: Any) -> None:
        if self.closed:
            return
        etype = event.get("type")
        if etype == "run_started":
            self.facts = dict(event)
        for step, values in points_of(event, self.facts, getattr(state, "world_size", None)):
            for w in self.workers:
                w.put("log", (step, values))
        if etype in ("checkpoint_saved", "epoch_finished"):
            for w in self.workers:
                w.put("flush")
        if etype == "run_finished" and event.get("export_dir"):
            self._artifact(str(event["export_dir"]))
        if etype in ("run_finished", "run_failed", "run_stopped"):  # stopped: by a limit
            self.close(ok=etype == "run_finished")

    def _artifact(self, export_dir: str) -> None:
        """The exported model to the backends that log one (MLflow); fetched from an object
        store (~0.5 GB for gpt2-small) only when one of them asked for it."""
        takers = [w for w in self.workers if type(w.backend).artifact is not Backend.artifact]
        if not takers:
            return
        try:
            local, temp = _local_copy(export_dir)
        except Exception as e:  # noqa: BLE001
            log.warning("could not read the exported model %s for the trackers: %s", export_dir, e)
            return
        for w in takers:
            w.put("artifact", local)
        self._temp_export = local if temp else None

    def close(self, ok: bool) -> None:
        """Drain and end every backend (the driver kills the emitter right after the run's
        last event); a backend still failing after `close_timeout` is left behind."""
        self.closed = True
        deadline = time.monotonic() + self.close_timeout
        for w in self.workers:
            if not w.close(ok, max(0.0, deadline - time.monotonic())):
                log.warning("tracker %s did not finish within %.0f s", w.backend.name,
                            self.close_timeout)
            if w.dropped:
                log.warning("tracker %s was down long enough to drop %d metric points",
                            w.backend.name, w.dropped)
        if getattr(self, "_temp_export", None):
            shutil.rmtree(self._temp_export, ignore_errors=True)
