"""`submitter report` (#11 item 5): a real PNG of the expected size and a self-contained HTML page,
from a local run directory and from a cluster job's ConfigMap; the ETA in status and watch."""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from datetime import datetime, timedelta, timezone

from submitter.cli import main
from submitter.contract import events as ev
from submitter.report import DPI, FIGSIZE
from tests.support.fake_operator import CONFIGMAPS, FakeOperator

NAME = "gpt2-demo"
WIDTH, HEIGHT = int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI)


def a_run() -> list[dict]:
    """Two epochs with a checkpoint each, a worker-group restart, and a finish."""
    events, seq = [], 0

    def emit(etype, **fields):
        nonlocal seq
        seq += 1
        events.append(ev.make_event(etype, seq=seq, **fields))

    emit("run_started", run_name=NAME, num_workers=2, storage_path="/mnt/checkpoints", model="tiny",
         epochs=2, steps_per_epoch=100)
    for step in range(2, 201, 2):
        emit("progress", epoch=1 + step // 101, step=step, loss=5.0 / (1 + step / 50),
             tokens_per_sec=1000.0 + step, lr=1e-3)
        if step == 100:
            emit("epoch_finished", epoch=1, step=100, train_loss=2.0, val_loss=2.2, tokens_per_sec=1100.0)
            emit("checkpoint_saved", epoch=1, step=100, path=f"/mnt/checkpoints/{NAME}/ckpt1")
        if step == 150:
            emit("worker_group_restarted", attempt=1, resumed_from=f"/mnt/checkpoints/{NAME}/ckpt1",
                 epoch=2, step=100)
    emit("epoch_finished", epoch=2, step=200, train_loss=1.5, val_loss=1.7, tokens_per_sec=1200.0)
    emit("checkpoint_saved", epoch=2, step=200, path=f"/mnt/checkpoints/{NAME}/ckpt2")
    emit("run_finished", epoch=2, step=200, val_loss=1.7, checkpoint_dir=f"/mnt/checkpoints/{NAME}")
    return events


def check_outputs(out_dir, *words):
    from PIL import Image

    png = (out_dir / f"{NAME}-report.png").read_bytes()
    image = Image.open(io.BytesIO(png))
    image.load()  # a real, complete PNG
    assert image.format == "PNG" and image.size == (WIDTH, HEIGHT)
    colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 20  # lines and text, not a blank canvas
    page = (out_dir / f"{NAME}-report.html").read_text()
    embedded = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert embedded and base64.b64decode(embedded.group(1)) == png  # self-contained
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)  # no network
    for word in words:
        assert word in page, word


def test_report_from_a_local_run_directory(runner, tmp_path):
    run_dir = tmp_path / "runs" / NAME
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("".join(ev.to_json(e) + "\n" for e in a_run()))
    out = tmp_path / "reports"
    result = runner.invoke(main, ["report", NAME, "--storage-path", str(tmp_path / "runs"),
                                  "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    check_outputs(out, "val_loss", "1.7", "tiny", "restarts", "finished")


def test_report_from_a_cluster_job_uses_the_whole_run_curve(api, kubeconfig, runner, tmp_path):
    assert runner.invoke(main, ["submit", "--name", NAME, "--replicas", "3", "--kubeconfig",
                                kubeconfig]).exit_code == 0
    events = a_run()
    op = FakeOperator(api.emulator, NAME)
    for event in events:  # what the pod's ConfigMap sink writes: recent events, state and curve
        fields = {k: v for k, v in event.items() if k not in ("v", "type", "time", "seq")}
        op.emit(event["type"], **fields)
    api.emulator.merge(CONFIGMAPS, "default", f"{NAME}-progress",
                       {"data": {ev.CURVE_KEY: json.dumps(ev.curve_fold(events))}})
    out = tmp_path / "out"
    result = runner.invoke(main, ["report", NAME, "--kubeconfig", kubeconfig, "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    check_outputs(out, "replicas", "finished")
    from submitter.kube import Kube
    from submitter.report import from_cluster

    run = from_cluster(Kube(kubeconfig=kubeconfig), "default", NAME)
    assert ev.curve_points(run.curve)[0][0] == 2  # the whole run, beyond the last 50 events
    assert run.curve["restarts"] and run.settings["replicas"] == 3


def test_report_without_matplotlib_exits_2_with_the_pip_command(runner, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    result = runner.invoke(main, ["report", NAME, "--storage-path", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == ('error: submitter report needs matplotlib: pip install '
                                     '"submitter-gpt2[report]" (in a checkout: pip install -e ".[report]")')


def test_report_of_a_missing_run_is_one_line(runner, tmp_path):
    result = runner.invoke(main, ["report", NAME, "--storage-path", str(tmp_path)])
    assert result.exit_code == 6 and len(result.stderr.strip().splitlines()) == 1
    assert "--storage-path" in result.stderr


def test_status_and_watch_show_an_eta_from_the_step_cadence(api, kubeconfig, runner):
    assert runner.invoke(main, ["submit", "--name", NAME, "--kubeconfig", kubeconfig]).exit_code == 0
    op = FakeOperator(api.emulator, NAME)
    op.initialize()
    op.run()
    now = datetime.now(timezone.utc)

    def at(seconds_ago: float) -> str:
        return (now - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")

    op.emit("run_started", run_name=NAME, num_workers=2, storage_path="/m", epochs=1,
            steps_per_epoch=1000, time=at(30))
    op.emit("progress", epoch=1, step=100, loss=3.0, tokens_per_sec=1.0, lr=1e-3, time=at(20))
    op.emit("progress", epoch=1, step=110, loss=3.0, tokens_per_sec=1.0, lr=1e-3, time=at(10))
    status = runner.invoke(main, ["status", NAME, "--kubeconfig", kubeconfig])
    assert status.exit_code == 0, status.output
    assert re.search(r"^ETA 14m[0-9]{2}s \(step 110/1000 at 1\.00 s/step\)$", status.stdout, re.M), status.stdout
    as_json = json.loads(runner.invoke(main, ["status", NAME, "--kubeconfig", kubeconfig, "-o", "json"]).stdout)
    assert as_json["totalSteps"] == 1000 and 840 <= as_json["etaSeconds"] <= 880
    op.succeed()
    watched = runner.invoke(main, ["watch", NAME, "--kubeconfig", kubeconfig])
    assert "ETA " in watched.stdout and "step 110/1000" in watched.stdout, watched.stdout
