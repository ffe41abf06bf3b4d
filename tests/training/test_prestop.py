"""The Ray pods' preStop hook (training/prestop.py): which processes it signals, and that it
waits for them, bounded. The stand-in's SIGTERM-to-the-head scenario runs it in a real pod."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from training import prestop


@pytest.mark.parametrize("argv, hit", [
    (["python", "-m", "training"], True),
    (["/usr/bin/python3", "-u", "-m", "training", "--job", "x"], True),
    (["python", "-m", "training", "export", "run"], False),
    (["python", "-m", "training.prestop", "--timeout", "5"], False),
    (["python", "-m", "training.run_script"], True),  # a --script job's driver
    (["python", "-m", "training.run_scripts"], False),
    (["python", "-m", "trainingx"], False),
    (["ray::RayTrainWorker.run_train_fn"], True),
    (["ray::RayTrainWorker"], True),
    (["ray::TrainController.run"], False),
    (["ray", "start", "--head", "--block"], False),
    ([], False),
])
def test_what_the_hook_signals(argv, hit):
    assert prestop.is_target(argv) is hit


def fake_proc(root: Path, pid: int, argv: list[str] | str, hostname: str) -> None:
    d = root / str(pid)
    d.mkdir()
    raw = argv.encode() if isinstance(argv, str) else b"\0".join(a.encode() for a in argv) + b"\0"
    (d / "cmdline").write_bytes(raw)
    (d / "environ").write_bytes(f"PATH=/bin\0HOSTNAME={hostname}\0".encode())


def test_only_this_pods_processes(tmp_path):
    """Several pods on one host (the stand-in) or one container (a real pod): the hook's own
    HOSTNAME picks the pod; a process title written over argv (Ray's) is read too."""
    fake_proc(tmp_path, 10, ["python", "-m", "training"], "head-a")
    fake_proc(tmp_path, 11, "ray::RayTrainWorker.run_train_fn" + "\0" * 20, "head-a")
    fake_proc(tmp_path, 12, ["python", "-m", "training"], "other-pod")
    fake_proc(tmp_path, 13, ["ray", "start", "--block"], "head-a")
    fake_proc(tmp_path, 14, ["python", "-m", "training.prestop"], "head-a")
    (tmp_path / "self").mkdir()
    assert prestop.targets(tmp_path, "head-a") == [10, 11]
    assert prestop.targets(tmp_path, None) == [10, 11, 12]
    assert prestop.targets(tmp_path, "head-a", me=10) == [11]


def test_stop_signals_and_waits_for_the_exit():
    """A process that takes a while to finish after SIGTERM (a checkpoint): the hook waits."""
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.0), sys.exit(143)))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    assert prestop.stop([child.pid], timeout=30) == []
    assert child.wait(5) == 143


def test_stop_is_bounded_by_its_timeout():
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        started = time.monotonic()
        assert prestop.stop([child.pid], timeout=0.5) == [child.pid]
        assert time.monotonic() - started < 30  # a hang guard, not a timing
    finally:
        child.kill()
        child.wait()


def test_bad_timeout_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        prestop.main(["--timeout", "nan"])
    assert e.value.code == 2
    assert "--timeout" in capsys.readouterr().err


RAYLET = "/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet"


def test_the_node_to_drain_is_this_worker_pods_raylet_and_never_the_heads(tmp_path):
    """The hook drains its own pod's Ray node, read from the raylet's command line; on the head
    (its GCS server runs there: the driver and the run's hub live on) nothing is drained."""
    fake_proc(tmp_path, 20, [RAYLET, "--raylet_socket_name=/tmp/s", "--node_id=abc123",
                             "--gcs-address=10.0.0.1:6379"], "worker-a")
    fake_proc(tmp_path, 21, [RAYLET, "--node_id=def456", "--gcs-address=10.0.0.1:6379"], "head-b")
    fake_proc(tmp_path, 22, ["/venv/.../ray/core/src/ray/gcs/gcs_server", "--gcs_server_port=6379"],
              "head-b")
    fake_proc(tmp_path, 23, ["ray", "start", "--block"], "pod-c")
    assert prestop.worker_node(tmp_path, "worker-a") == ("abc123", "10.0.0.1:6379")
    assert prestop.worker_node(tmp_path, "head-b") is None
    assert prestop.worker_node(tmp_path, "pod-c") is None  # no raylet (yet): nothing to drain


def test_a_drain_that_gets_no_answer_does_not_hold_the_signals_back(monkeypatch):
    monkeypatch.setattr(prestop, "drain", lambda *a: time.sleep(30) or "drained")
    start = time.monotonic()
    said = prestop.drain_in_time(("abc", "10.0.0.1:6379"), 20.0, wait_s=0.5)
    assert time.monotonic() - start < 5 and said.startswith("not drained (no answer")
    assert prestop.drain_in_time(None, 20.0).startswith("not drained (the head pod")


def test_a_drain_that_fails_says_why_and_never_raises():
    """No GCS at that address: one line, no traceback (the signals still go out)."""
    said = prestop.drain_in_time(("00" * 28, "127.0.0.1:9"), 5.0, wait_s=4.0)
    assert said.startswith("not drained ("), said
