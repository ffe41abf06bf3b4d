"""The run's stored logs (issue 26, item 3): the driver's output and the workers' errors under
`<run>/logs/`, redacted, size-capped and rotated, uploaded to a bucket; and what
`submitter logs` reads back from there."""

from __future__ import annotations

import io
import os
import sys

import pytest

from submitter.contract import naming
from submitter.contract import run_logs as names
from submitter.contract.run_logs import MASK, Redactor
from training.run import logs as run_logs
from training.events.emitter import Emitter, FileSink

SECRET = "s3cr3t-v4lue-do-not-print"
ENV = {"AWS_SECRET_ACCESS_KEY": SECRET, "HF_TOKEN": "hf_abcdefghijkl", "PLAIN": "plain-value",
       "MY_DB": "db-password-123", "SHORT_TOKEN": "abc"}


# --- redaction -----------------------------------------------------------------------------

def test_redaction_masks_credentials_secret_env_urls_and_bearer_tokens():
    redact = Redactor.from_environ(ENV, secret_names=["MY_DB"])
    text = (f"key={SECRET} hf=hf_abcdefghijkl db=db-password-123 plain=plain-value abc "
            "url=postgresql://user:pa55word@db:5432/x header='Authorization: Bearer eyJhbGciOi.x.y'")
    out = redact(text)
    for secret in (SECRET, "hf_abcdefghijkl", "db-password-123", "pa55word", "eyJhbGciOi.x.y"):
        assert secret not in out
    assert "plain=plain-value abc" in out  # not a credential; too short to mask safely
    assert "postgresql://user:***@db:5432/x" in out and "Bearer ***" in out


def test_the_job_documents_secret_env_names_are_masked():
    job = {"secret_env": {"MY_DB": "db-creds:password"}}
    assert names.secret_names_of(job) == ["MY_DB"] and names.secret_names_of(None) == []


def test_events_get_the_same_redaction(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    em = Emitter([FileSink(str(tmp_path / naming.EVENTS_FILE))])
    em.emit("run_failed", error=f"OSError: signature {SECRET} rejected")
    text = (tmp_path / naming.EVENTS_FILE).read_text()
    assert SECRET not in text and f"signature {MASK} rejected" in text


# --- rotation ------------------------------------------------------------------------------

def test_a_log_file_rotates_at_its_cap_and_keeps_its_backups(tmp_path):
    rotated: list[str] = []
    f = run_logs.RotatingFile(str(tmp_path), "driver.log", max_bytes=100, backups=2,
                              on_rotate=rotated.append)
    for i in range(40):
        f.write(f"line {i:03d} ".encode() + b"x" * 10 + b"\n")  # 20 bytes a line
    f.close()
    assert sorted(os.listdir(tmp_path)) == ["driver.log", "driver.log.1", "driver.log.2"]
    sizes = [os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path)]
    assert all(s <= 100 for s in sizes)
    text = "".join((tmp_path / n).read_text() for n in ("driver.log.2", "driver.log.1", "driver.log"))
    assert text.splitlines()[-1].startswith("line 039") and "line 000" not in text  # oldest dropped
    numbers = [int(line.split()[1]) for line in text.splitlines()]
    assert numbers == list(range(numbers[0], 40))  # in order, nothing lost within the cap
    assert rotated[-2:] == ["driver.log.2", "driver.log.1"]


def test_sessions_are_read_oldest_first_each_in_writing_order():
    listed = ["worker-1.err.log", "driver-20260102T000000Z-7.log", "driver-20260101T000000Z-5.log.1",
              "driver-20260101T000000Z-5.log", "driver-20260101T000000Z-5.log.2", "events.jsonl"]
    assert names.driver_sessions(listed) == [
        ["driver-20260101T000000Z-5.log.2", "driver-20260101T000000Z-5.log.1",
         "driver-20260101T000000Z-5.log"], ["driver-20260102T000000Z-7.log"]]
    assert names.worker_err_logs(listed) == ["worker-1.err.log"]


def test_only_the_newest_sessions_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(names, "MAX_SESSIONS", 3)
    logs = tmp_path / names.LOGS_DIR
    logs.mkdir()
    for day in range(1, 6):
        (logs / names.driver_log_name(f"202601{day:02d}T000000Z", 1)).write_text("old\n")
    (logs / "worker-0.err.log").write_text("kept\n")
    new = run_logs.DriverLog(str(tmp_path), environ={})  # a new session prunes
    new.close()
    left = sorted(os.listdir(logs))
    assert left == sorted(["driver-20260104T000000Z-1.log", "driver-20260105T000000Z-1.log",
                           new.name, "worker-0.err.log"])


# --- the driver's output -------------------------------------------------------------------

def test_the_driver_output_is_kept_redacted_and_the_terminal_sees_it_unchanged(tmp_path, monkeypatch):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    log = run_logs.DriverLog(str(tmp_path), {"secret_env": {"MY_DB": "x:y"}}, environ=ENV).start()
    print("step 1 loss 3.2")
    sys.stdout.write(f"a secret split {SECRET[:5]}")
    sys.stdout.write(f"{SECRET[5:]} across writes\n")
    print("db-password-123 and no newline at the end", end="")
    log.close()
    assert sys.stdout is terminal  # restored
    assert SECRET in terminal.getvalue()  # the pod's own output is Ray's, not ours to change
    (kept,) = os.listdir(tmp_path / names.LOGS_DIR)
    assert kept.startswith(names.DRIVER_PREFIX) and kept.endswith(f"-{os.getpid()}.log")
    text = (tmp_path / names.LOGS_DIR / kept).read_text()
    assert text.startswith("=== driver session ")
    assert "step 1 loss 3.2\n" in text and f"a secret split {MASK} across writes\n" in text
    assert text.endswith(f"{MASK} and no newline at the end\n")
    assert SECRET not in text and "db-password-123" not in text


def test_both_drivers_keep_their_output_for_the_block_however_it_ends(tmp_path, monkeypatch):
    """kept_logs: what `python -m training` and the script runner both run under."""
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    with pytest.raises(ValueError):
        with run_logs.kept_logs(str(tmp_path), {}):
            print("inside", end="")
            raise ValueError("the script's own error")
    assert sys.stdout is terminal
    print("after")
    (kept,) = os.listdir(tmp_path / names.LOGS_DIR)
    text = (tmp_path / names.LOGS_DIR / kept).read_text()
    assert text.endswith("inside\n") and "after" not in text


def test_a_log_that_cannot_be_written_never_stops_the_driver(tmp_path, capsys):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    assert run_logs.capture_driver(str(blocked)) is None
    assert "the driver's output is not kept" in capsys.readouterr().err


# --- the workers' errors -------------------------------------------------------------------

def _raised(message: str) -> BaseException:
    try:
        raise RuntimeError(message)
    except RuntimeError as e:
        return e


def test_a_failed_workers_traceback_is_appended_redacted_and_capped(tmp_path):
    store = run_logs.LogStore(str(tmp_path))
    redact = Redactor.from_environ(ENV)
    for n in range(3):
        text = run_logs.worker_error_text(1, _raised(f"boom {n} with {SECRET}"), "2026-01-01T00:00:00Z")
        run_logs.append_worker_error(store, 1, text, redact, max_bytes=600)
    data = (tmp_path / names.LOGS_DIR / "worker-1.err.log").read_text()
    assert len(data.encode()) <= 600 and SECRET not in data
    assert "boom 2 with ***" in data and "Traceback (most recent call last)" in data
    assert "boom 0" not in data  # the oldest text went first


def test_the_ray_train_callback_writes_each_failed_rank(tmp_path, monkeypatch):
    pytest.importorskip("ray.train")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    callback = run_logs.worker_error_logs(str(tmp_path), {})
    callback.after_exception(None, {0: _raised("rank 0 died"), 1: _raised(f"rank 1 {SECRET}")})
    logs = tmp_path / names.LOGS_DIR
    assert sorted(os.listdir(logs)) == ["worker-0.err.log", "worker-1.err.log"]
    assert "rank 0 died" in (logs / "worker-0.err.log").read_text()
    assert SECRET not in (logs / "worker-1.err.log").read_text()


def test_a_worker_keeps_its_own_error_before_it_leaves_the_worker(tmp_path, monkeypatch):
    """On the storage before Ray Train's controller can learn of it, so before the run can be
    reported failed, whatever the load and whichever controller callback fails (#39 item 7)."""
    import inspect

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setattr(run_logs, "world_rank", lambda: 2)
    err_log = tmp_path / names.LOGS_DIR / "worker-2.err.log"
    seen = []

    def train_func(config):
        seen.append(err_log.exists())
        raise ValueError(f"bad batch {config['n']} {SECRET}")

    wrapped = run_logs.keeping_own_error(train_func, str(tmp_path), {})
    assert list(inspect.signature(wrapped).parameters) == ["config"]  # Ray Train passes config by it
    with pytest.raises(ValueError, match="bad batch 3") as raised:
        wrapped({"n": 3})
    assert seen == [False]  # written after the function failed, and the same error re-raised
    text = err_log.read_text()
    assert "=== worker rank 2 failed at" in text and "ValueError: bad batch 3 ***" in text
    assert SECRET not in text and "in train_func" in text  # the worker's own traceback
    assert raised.value.__traceback__ is not None
    assert run_logs.keeping_own_error(lambda: 7, str(tmp_path))() == 7


def test_a_storage_that_fails_never_hides_the_workers_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_logs, "append_worker_error",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("read-only")))
    with pytest.raises(KeyError):
        run_logs.keeping_own_error(lambda: {}["x"], str(tmp_path))()
    assert "cannot keep rank 0's error: read-only" in capsys.readouterr().err
    try:
        run_logs.keeping_own_error(lambda: {}["x"], str(tmp_path))()
    except KeyError as e:
        assert not run_logs.kept_by_worker(e)  # so the controller keeps it instead


def test_the_controller_keeps_only_what_the_workers_could_not(tmp_path):
    """An error its worker kept (marked, and the mark survives the pickling to the controller,
    where Ray Train hands over the bare exception) is not written again; a worker that died is
    kept by the controller."""
    import pickle

    pytest.importorskip("ray.train")
    try:
        run_logs.keeping_own_error(lambda: 1 / 0, str(tmp_path / "w"))()
    except ZeroDivisionError as e:
        own = pickle.loads(pickle.dumps(e))
    callback = run_logs.worker_error_logs(str(tmp_path), {})
    callback.after_exception(None, {0: own, 1: _raised("actor died unexpectedly")})
    logs = tmp_path / names.LOGS_DIR
    assert sorted(os.listdir(logs)) == ["worker-1.err.log"]
    assert "actor died unexpectedly" in (logs / "worker-1.err.log").read_text()
    callback.after_exception(None, {0: ZeroDivisionError("not kept by its worker")})
    assert "not kept by its worker" in (logs / "worker-0.err.log").read_text()


def test_a_failure_event_that_cannot_be_forwarded_never_fails_the_run(monkeypatch, capsys):
    """The script's event callback runs in the controller: a hub that does not answer (a
    timeout under load) must not turn a worker's error into the controller's own."""
    pytest.importorskip("ray.train")
    from training.script.hooks import ScriptEvents

    events = ScriptEvents()
    monkeypatch.setattr(ScriptEvents, "_hub", lambda self: (_ for _ in ()).throw(
        TimeoutError("Get timed out: some object(s) not ready")))
    events.after_exception(None, {1: _raised("bad batch")})
    assert "cannot forward the workers' failure: Get timed out" in capsys.readouterr().err


# --- a bucket ------------------------------------------------------------------------------

def test_in_a_bucket_the_log_is_uploaded_while_running_and_at_the_end(s3_server, tmp_path):
    from submitter.stored_logs import find_run, show

    s3_server.make_bucket("logs")
    run_dir = "s3://logs/runs/default/job"
    log = run_logs.DriverLog(run_dir, environ={**os.environ}, upload_every=0.2).start()
    try:
        print("first line")
        import time

        deadline = time.monotonic() + 30
        while not [k for k in s3_server.list("logs/runs/default/job/logs") if k.endswith(".log")]:
            assert time.monotonic() < deadline, "not uploaded while running"
            time.sleep(0.1)
        print(f"last line, secret {os.environ['AWS_SECRET_ACCESS_KEY']}")
    finally:
        log.close()
    assert not os.path.exists(log.directory)  # the local copy is gone
    run = find_run("s3://logs/runs", "job", "default")
    out = io.StringIO()
    show(run, out)
    assert "first line\n" in out.getvalue() and f"last line, secret {MASK}\n" in out.getvalue()
