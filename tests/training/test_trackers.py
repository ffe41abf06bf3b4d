"""The trackers (training.events.trackers) behind the run's emitter, without Ray: the same Emitter, the
same sinks a run builds (events.jsonl + TrackerSink), fed the events a run sends. Real
backends: TensorBoard event files read back with TensorBoard's own EventAccumulator, MLflow
against a `file:` store and against a real `mlflow server` on 127.0.0.1, W&B in offline mode."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

import pytest

from submitter.contract.errors import UsageError
from training.events import trackers as tr
from tests.support.s3 import _free_port
from tests.support.tensorboard import scalars as _scalars
from tests.training.test_parallel import _model, one_rank_group  # noqa: F401 - a fixture
from training.events.emitter import Emitter, events_sink, run_sinks

FAST = (0.05, 0.1, 0.2)


def _job(run_dir: str) -> None:
    os.makedirs(run_dir, exist_ok=True)
    job = {"name": "demo", "model": "tiny", "learning_rate": 0.001, "epochs": 2,
           "env": {"SOME_URL": "not for trackers"}, "labels": {"team": "a"}}
    with open(os.path.join(run_dir, "run.json"), "w") as f:
        json.dump({"v": 1, "job": job, "identity": {}}, f)


def _run_emitter(run_dir: str, environ: dict, **sink_kwargs) -> Emitter:
    """What RunEmitter builds, with the tracker sink's knobs (backoff, close timeout) exposed."""
    fs = events_sink(run_dir)
    history = fs.read()
    sink = tr.TrackerSink(run_dir, environ, history, **sink_kwargs)
    return Emitter([fs, sink], history)


def _session(em: Emitter, steps: list[int], *, start: bool = True, world: int = 2,
             loss0: float = 5.0, epoch_end: int | None = None, finish: str | None = None,
             export_dir: str | None = None) -> None:
    if start:
        em.emit("run_started", run_name="demo", num_workers=world, storage_path="x",
                params=124_000_000, gpu="NVIDIA H100 80GB HBM3", model="gpt2-small",
                block_size=256)
    em.worker_group_started(None, epoch=1, step=steps[0] - 1, world_size=world)
    for s in steps:
        first = {"world_size": world} if s == steps[0] else {}  # as training.gpt2.loop sends it
        em.emit("progress", epoch=1, step=s, loss=loss0 - s / 100, tokens_per_sec=1000.0 + s,
                lr=1e-3, data_wait_fraction=0.01, grad_norm=0.5, **first)
    if epoch_end is not None:
        em.emit("epoch_finished", epoch=1, epochs=2, step=epoch_end, train_loss=4.0,
                val_loss=4.2, tokens_per_sec=1000.0)
    if finish == "ok":
        em.emit("run_finished", epoch=1, step=steps[-1], export_dir=export_dir)
    elif finish == "failed":
        em.emit("run_failed", error="boom")


def test_tensorboard_writes_every_metric_with_the_step_as_global_step(tmp_path):
    run_dir = str(tmp_path / "demo")
    _job(run_dir)
    em = _run_emitter(run_dir, {})
    _session(em, [1, 10, 20], epoch_end=20, finish="ok")
    logdir = os.path.join(run_dir, "tensorboard")
    scalars = _scalars(logdir)
    assert [s for s, _ in scalars["train/loss"]] == [1, 10, 20]
    assert scalars["train/loss"][1][1] == pytest.approx(4.9)
    for tag in ("train/lr", "train/tokens_per_sec", "train/data_wait_fraction", "train/grad_norm",
                "train/workers", "train/mfu"):
        assert [s for s, _ in scalars[tag]] == [1, 10, 20], tag
    assert scalars["train/workers"][0][1] == 2
    # MFU: (6 x params + 12 x layers x width x block) x tokens/s over the workers' peak (H100:
    # 989 TFLOP/s): submitter.contract.flops, the smoke run's and the scaling model's count
    per_token = 6 * 124e6 + 12 * 12 * 768 * 256
    assert scalars["train/mfu"][0][1] == pytest.approx(per_token * 1001 / (2 * 989e12), rel=1e-4)
    assert scalars["val/loss"] == [(20, pytest.approx(4.2))]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir, size_guidance={"tensors": 0})
    acc.Reload()
    text = acc.Tensors("settings/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "learning_rate | 0.001" in text and "SOME_URL" not in text  # no env in trackers
    assert acc.summary_metadata  # hparams (the plugin's experiment/session summaries)
    assert any("hparams" in m.plugin_data.plugin_name for m in acc.summary_metadata.values())


def test_a_restored_run_appends_each_step_once_and_the_missing_ones_are_caught_up(tmp_path):
    """Session 1 reaches step 30 (checkpoint at 20), then dies; session 2 restores step 20 and
    redoes 21..30 with other losses, then goes on. The curve: every step once, the first value
    kept. Then the TensorBoard files lose the last point (a crash before a flush): session 3
    writes it back from the run's events."""
    run_dir = str(tmp_path / "demo")
    _job(run_dir)
    _session(_run_emitter(run_dir, {}), [1, 10, 20, 30], finish="failed")
    em = _run_emitter(run_dir, {})
    _session(em, [21, 30, 40], start=True, world=1, loss0=9.0, epoch_end=40, finish="failed")
    logdir = os.path.join(run_dir, "tensorboard")
    loss = _scalars(logdir)["train/loss"]
    assert [s for s, _ in loss] == [1, 10, 20, 30, 40]
    assert dict(loss)[30] == pytest.approx(5.0 - 0.3)  # session 1's, not the redone one
    assert [v for _, v in _scalars(logdir)["train/workers"]] == [2, 2, 2, 2, 1]  # resize shows

    # crash before a flush: the newest event file never got session 2's points
    newest = max(glob.glob(os.path.join(logdir, "events.out.tfevents.*")), key=os.path.getmtime)
    os.remove(newest)
    assert [s for s, _ in _scalars(logdir)["train/loss"]] == [1, 10, 20, 30]
    _session(_run_emitter(run_dir, {}), [41, 50], finish="ok")
    loss = _scalars(logdir)["train/loss"]
    assert [s for s, _ in loss] == [1, 10, 20, 30, 40, 41, 50]  # 41: a start's first step
    assert _scalars(logdir)["val/loss"] == [(40, pytest.approx(4.2))]


def test_tensorboard_in_a_bucket_uploads_the_event_files(s3_server, tmp_path):
    """An object-store run directory: the event files are written locally and uploaded under
    <run>/tensorboard/; a resumed run reads them back from the bucket (no duplicate steps)."""
    from pyarrow import fs as pafs

    s3_server.make_bucket("bkt")
    run_dir = "s3://bkt/runs/demo"
    em = _run_emitter(run_dir, {})
    _session(em, [1, 10, 20], finish="failed")
    _session(_run_emitter(run_dir, {}), [11, 20, 30], finish="ok")
    filesystem, base = s3_server.filesystem(), "bkt/runs/demo/tensorboard"
    local = tmp_path / "tb"
    local.mkdir()
    files = [i for i in filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
             if "tfevents" in i.path]
    assert len(files) == 2  # one per driver session
    for info in files:
        with filesystem.open_input_stream(info.path) as f:
            (local / os.path.basename(info.path)).write_bytes(f.read())
    assert [s for s, _ in _scalars(str(local))["train/loss"]] == [1, 10, 20, 30]


# --- MLflow -------------------------------------------------------------------------------------

def _mlflow_checks(uri: str, run_dir: str, tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    export = tmp_path / "model"
    export.mkdir()
    (export / "config.json").write_text("{}")
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "gpt2"}
    _session(_run_emitter(run_dir, env), [1, 10, 20, 30], finish="failed")
    _session(_run_emitter(run_dir, env), [21, 30, 40], loss0=9.0, epoch_end=40, finish="ok",
             export_dir=str(export))
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("gpt2")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1  # resumed, not duplicated
    run = runs[0]
    assert json.load(open(os.path.join(run_dir, "mlflow.json")))["run_id"] == run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == "0.001" and "env" not in run.data.params
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(steps) == [1, 10, 20, 30, 40]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/loss")] == [40]
    for tag in ("train/lr", "train/tokens_per_sec", "train/grad_norm", "train/workers"):
        assert client.get_metric_history(run.info.run_id, tag), tag
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "model")]
    assert artifacts == ["model/config.json"]


def test_mlflow_file_store_one_run_resumed_with_params_metrics_and_the_model(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x: a user's opt-in
    run_dir = str(tmp_path / "demo")
    _job(run_dir)
    _mlflow_checks(f"file:{tmp_path / 'mlruns'}", run_dir, tmp_path)


def _start_mlflow_server(tmp_path, port: int) -> subprocess.Popen:
    store = tmp_path / "server"
    store.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
         "--artifacts-destination", str(store / "artifacts"), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=open(store / "server.log", "ab"),
        start_new_session=True)


def _wait_http(port: int, proc: subprocess.Popen, deadline_s: float = 120.0) -> None:
    import urllib.request

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "mlflow server exited"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("mlflow server did not answer")


def _stop(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def mlflow_server(tmp_path):
    port = _free_port()
    proc = _start_mlflow_server(tmp_path, port)
    try:
        _wait_http(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def test_mlflow_server_one_run_resumed_with_params_metrics_and_the_model(mlflow_server, tmp_path):
    run_dir = str(tmp_path / "demo")
    _job(run_dir)
    _mlflow_checks(mlflow_server, run_dir, tmp_path)


def test_a_tracker_that_is_down_never_stops_training_and_catches_up(tmp_path, monkeypatch):
    """MLflow's server is not there when the run starts: the events go on at once, one
    tracker_failed says so; the server comes up, tracker_recovered, and every step is there."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    run_dir = str(tmp_path / "demo")
    _job(run_dir)
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    em = _run_emitter(run_dir, {"MLFLOW_TRACKING_URI": uri}, backoff=FAST + (0.5,))
    t0 = time.monotonic()
    _session(em, [1, 10, 20, 30])
    assert time.monotonic() - t0 < 60  # guards a hang only: the emitter never waits for MLflow
    deadline = time.monotonic() + 60
    while not any(e["type"] == "tracker_failed" for e in em.session):
        assert time.monotonic() < deadline, "no tracker_failed event"
        time.sleep(0.05)
    proc = _start_mlflow_server(tmp_path, port)
    try:
        _wait_http(port, proc)
        deadline = time.monotonic() + 120
        while not any(e["type"] == "tracker_recovered" for e in em.session):
            assert time.monotonic() < deadline, "no tracker_recovered event"
            time.sleep(0.1)
        em.emit("run_finished", step=30)
        from mlflow.tracking import MlflowClient

        run_id = json.load(open(os.path.join(run_dir, "mlflow.json")))["run_id"]
        steps = [m.step for m in MlflowClient(uri).get_metric_history(run_id, "train/loss")]
        assert sorted(steps) == [1, 10, 20, 30]
    finally:
        _stop(proc)
    failed = [e for e in em.session if e["type"] == "tracker_failed"]
    assert len(failed) == 1 and failed[0]["tracker"] == "mlflow"  # warned once
    # the same events in events.jsonl: `watch` and `report` see them
    types = [e["type"] for e in events_sink(run_dir).read()]
    assert "tracker_failed" in types and "tracker_recovered" in types


class _Flaky(tr.Backend):
    """A backend whose server answers errors for a while (then it comes back)."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures, self.logged, self.closed = failures, [], None

    def log(self, step, values):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("503 Service Unavailable")
        self.logged.append(step)

    def close(self, ok):
        self.closed = ok


def test_a_failing_backend_is_retried_in_order_and_warned_about_once(tmp_path, caplog):
    run_dir = str(tmp_path / "demo")
    _job(run_dir)
    flaky = _Flaky(failures=4)
    em = Emitter([tr.TrackerSink(run_dir, {}, [], backends=[flaky], backoff=FAST)], [])
    with caplog.at_level("WARNING", logger="training.events.trackers"):
        _session(em, [1, 10, 20], finish="ok")
    assert flaky.logged == [1, 10, 20] and flaky.closed is True
    assert sum("tracker flaky failed" in r.getMessage() for r in caplog.records) == 1
    deadline = time.monotonic() + 30
    while [e["type"] for e in em.session].count("tracker_recovered") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert [e["type"] for e in em.session].count("tracker_failed") == 1


def test_a_backend_down_to_the_end_costs_the_close_timeout_not_the_run(tmp_path):
    run_dir = str(tmp_path / "demo")
    _job(run_dir)
    dead = _Flaky(failures=10**9)
    em = Emitter([tr.TrackerSink(run_dir, {}, [], backends=[dead], backoff=FAST,
                                 close_timeout=3)], [])
    t0 = time.monotonic()
    _session(em, [1, 10], finish="ok")
    assert time.monotonic() - t0 < 60  # bounded (3 s here), a guard against hangs only
    assert dead.logged == []


# --- W&B offline ---------------------------------------------------------------------------------

def _wandb_records(path: str):
    """The records of a .wandb file: W&B's LevelDB-style log (a 7-byte `:W&B` header, then
    32 KiB blocks of records: crc32 (4), length (2), type (1: full, 2: first, 3: middle, 4: last)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, rtype = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        payload, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if rtype == 1:
            yield payload
        elif rtype in (2, 3):
            parts = (b"" if rtype == 2 else parts) + payload
        elif rtype == 4:
            yield parts + payload


def _wandb_history(run_file: str) -> list[dict]:
    """The history rows in an offline run's .wandb file."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for data in _wandb_records(run_file):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in rec.history.item})
    return rows


def _wandb_session_order(run_file: str, run_id: str) -> tuple[str, int]:
    """offline-run-<yyyymmdd_hhmmss>-<run id>[-N]: a second session in the same second gets
    -N (which sorts before the first's name)."""
    name = os.path.basename(os.path.dirname(run_file))
    stamp, _, tail = name.removeprefix("offline-run-").partition(f"-{run_id}")
    return stamp, int(tail.lstrip("-") or 0)


def test_wandb_offline_run_in_the_run_directory_resumed_by_id(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = str(tmp_path / "demo")
    _job(run_dir)
    env = {"WANDB_MODE": "offline"}
    monkeypatch.setenv("WANDB_MODE", "offline")
    _session(_run_emitter(run_dir, env), [1, 10, 20], finish="failed")
    _session(_run_emitter(run_dir, env), [11, 20, 30], epoch_end=30, finish="ok")
    import wandb

    wandb.teardown()  # finish() returns before W&B's service has closed the run's file
    run_id = json.load(open(os.path.join(run_dir, "wandb.json")))["id"]
    files = sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", f"run-{run_id}.wandb")),
                   key=lambda f: _wandb_session_order(f, run_id))
    assert len(files) == 2  # one per driver session, one W&B run id: they sync into one run
    rows = [r for f in files for r in _wandb_history(f)]
    # every row once: session 2 sends nothing at the steps session 1 wrote (W&B drops a step
    # below a resumed run's last one), its first group's world size came from the history
    assert [r["_step"] for r in rows] == [1, 10, 20, 30]
    assert any(r.get("val/loss") == pytest.approx(4.2) and r["_step"] == 30 for r in rows)
    assert all("train/grad_norm" in r and "train/workers" in r for r in rows if "train/loss" in r)


# --- which trackers, and the one line when one is missing ----------------------------------------

def test_the_environment_picks_the_trackers():
    assert tr.requested({}) == ["tensorboard"]
    assert tr.requested({"MLFLOW_TRACKING_URI": "http://x"}) == ["tensorboard", "mlflow"]
    assert tr.requested({"WANDB_API_KEY": "k"}) == ["tensorboard", "wandb"]
    assert tr.requested({"WANDB_MODE": "offline"}) == ["tensorboard", "wandb"]
    assert tr.requested({"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}) == ["tensorboard"]


def test_a_tracker_asked_for_but_not_installed_is_one_line_naming_the_pip_command():
    missing = {"mlflow", "wandb"}

    def find(module):
        return None if module in missing else object()

    assert tr.check_installed({}, find) == ["tensorboard"]
    with pytest.raises(UsageError) as e:
        tr.check_installed({"MLFLOW_TRACKING_URI": "http://x"}, find)
    assert 'pip install "submitter-gpt2[mlflow]"' in str(e.value) and "\n" not in str(e.value)
    assert e.value.exit_code == 2
    with pytest.raises(UsageError, match=r"submitter-gpt2\[wandb\]"):
        tr.check_installed({"WANDB_MODE": "offline"}, find)


def test_run_sinks_carry_the_trackers(tmp_path):
    sinks, _ = run_sinks(str(tmp_path / "demo"), {})
    assert any(isinstance(s, tr.TrackerSink) for s in sinks)
    for s in sinks:
        if isinstance(s, tr.TrackerSink):
            s.close(True)


@pytest.mark.parametrize("env, words", [
    ({"WANDB_MODE": "ofline"}, "WANDB_MODE='ofline' is not a W&B mode"),
    ({"MLFLOW_TRACKING_URI": "mlflow.mlops:5000"}, None),  # a scheme-like prefix: MLflow's call
    ({"MLFLOW_TRACKING_URI": "mlruns"}, "MLFLOW_TRACKING_URI='mlruns' is not a tracking URI"),
])
def test_bad_tracker_values_are_one_line_before_anything_starts(env, words):
    if words is None:
        tr.check_values(env)
        return
    with pytest.raises(UsageError) as e:
        tr.check_installed(env, lambda module: object())
    assert words in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2


def test_python_m_training_exits_2_with_one_line_for_a_bad_tracker_value(storage):
    """The entrypoint itself: nothing started, nothing written, exit 2."""
    env = {**os.environ, "WANDB_MODE": "sometimes"}
    proc = subprocess.run([sys.executable, "-m", "training", "--name", "demo", "--storage-path",
                           str(storage), "--model", "tiny", "--tokenizer", "byte"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "WANDB_MODE" in proc.stderr
    assert not (storage / "demo").exists()


def test_the_grad_norm_reads_as_a_float_under_fsdp_and_plain(one_rank_group):
    """What the loop puts in progress events: FSDP2's norm is a DTensor (its full value)."""
    import torch

    from training.gpt2.loop import _norm_value
    from training.gpt2.parallel import shard_fsdp
    from training.gpt2.precision import choose_precision

    assert _norm_value(None) is None
    for model in (_model(), shard_fsdp(_model(), choose_precision("fp32", "cpu", False))):
        x = torch.randint(0, 256, (2, 32))
        model(input_ids=x, labels=x).loss.backward()
        norm = _norm_value(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        assert isinstance(norm, float) and 0 < norm < 100


def test_the_exported_model_is_fetched_only_for_a_backend_that_logs_it(tmp_path, monkeypatch):
    """Issue 23: every run into a bucket downloaded its exported model (~0.5 GB) at the end,
    for TensorBoard and W&B too; only a backend with `artifact` (MLflow) needs it."""
    fetched: list[str] = []
    monkeypatch.setattr(tr, "_local_copy", lambda uri: fetched.append(uri) or (str(tmp_path), False))

    class Logs(tr.Backend):
        name = "logs"

    class Models(tr.Backend):
        name = "models"

        def __init__(self):
            self.got: list[str] = []

        def artifact(self, local_dir):
            self.got.append(local_dir)

    run_dir = str(tmp_path / "demo")
    _job(run_dir)
    em = Emitter([tr.TrackerSink(run_dir, {}, [], backends=[Logs()], backoff=FAST)])
    _session(em, [1, 2], finish="ok", export_dir="s3://bucket/runs/demo/model")
    assert fetched == []
    models = Models()
    em = Emitter([tr.TrackerSink(run_dir, {}, [], backends=[Logs(), models], backoff=FAST)])
    _session(em, [1, 2], finish="ok", export_dir="s3://bucket/runs/demo/model")
    assert fetched == ["s3://bucket/runs/demo/model"] and models.got == [str(tmp_path)]
