"""The events file never holds one seq twice, whoever writes: a stale emitter beside a retried
driver's, a tracker's thread, emitters in other processes. And opening a tracker twice on one
run directory is harmless (issue 23, item 5)."""

from __future__ import annotations

import multiprocessing
import os
import threading

from submitter.contract import naming
from training.events.emitter import Emitter, FileSink, RunEmitter

WRITERS, THREADS, EVENTS = 4, 2, 40
PROGRESS = {"epoch": 1, "loss": 1.0, "lr": 1e-3, "tokens_per_sec": 1.0}


def _events_file(run_dir) -> FileSink:
    return FileSink(os.path.join(str(run_dir), naming.EVENTS_FILE))


def _write_from_a_process(run_dir: str, start, count: int) -> None:
    """One emitter per thread, all of one process, each on its own open of the file."""
    start.wait()

    def emit() -> None:
        em = Emitter([_events_file(run_dir)])  # seq 0: it knows nothing of the others
        for i in range(count):
            em.emit("progress", step=i, **PROGRESS)

    threads = [threading.Thread(target=emit) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_concurrent_writers_in_processes_and_threads_never_share_a_seq(tmp_path):
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_write_from_a_process, args=(str(tmp_path), start, EVENTS))
             for _ in range(WRITERS)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    seqs = [e["seq"] for e in _events_file(tmp_path).read()]
    total = WRITERS * THREADS * EVENTS
    assert len(seqs) == total  # nothing lost or glued together
    assert seqs == list(range(1, total + 1))  # unique, and in file order


def test_a_stale_emitter_continues_after_the_events_another_wrote(tmp_path):
    old = RunEmitter(str(tmp_path), {})
    old.emit("run_started", run_name="job", num_workers=1, storage_path="/s")
    new = RunEmitter(str(tmp_path), {})  # a retried driver while the old one drains
    assert new.emit("run_started", run_name="job", num_workers=1, storage_path="/s")["seq"] == 2
    assert new.emit("progress", step=4, **PROGRESS)["seq"] == 3
    late = old.emit("run_failed", error="node drained")  # its own counter says 2
    assert late["seq"] == 4 and old.seq == 4
    assert [e["seq"] for e in _events_file(tmp_path).read()] == [1, 2, 3, 4]


def test_a_tracker_thread_and_the_driver_share_one_numbering(tmp_path):
    em = RunEmitter(str(tmp_path), {})
    threads = [threading.Thread(target=lambda: [em.emit("tracker_failed", tracker="x", error="e")
                                                for _ in range(25)]) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(25):
        em.emit("progress", step=1, **PROGRESS)
    for t in threads:
        t.join()
    assert [e["seq"] for e in _events_file(tmp_path).read()] == list(range(1, 101))


def test_a_file_torn_by_a_crash_is_numbered_after_its_last_whole_event(tmp_path):
    path = tmp_path / naming.EVENTS_FILE
    em = Emitter([_events_file(tmp_path)])
    em.emit("run_started", run_name="r", num_workers=1, storage_path="/s")
    with open(path, "a") as f:
        f.write('{"v":1,"type":"progress","seq":9')  # torn: not an event, its seq not taken
    assert Emitter([_events_file(tmp_path)]).emit("run_finished")["seq"] == 2
    assert [e["seq"] for e in _events_file(tmp_path).read()] == [1, 2]


def test_only_the_end_of_a_long_events_file_is_read_for_its_seq(tmp_path):
    sink = _events_file(tmp_path)
    em = Emitter([sink])
    for i in range(600):  # well over the tail the sink reads
        em.emit("progress", step=i, **PROGRESS)
    assert os.path.getsize(sink.path) > FileSink.TAIL_BYTES
    assert Emitter([sink]).emit("run_finished")["seq"] == 601


def test_opening_tensorboard_twice_on_one_run_directory_is_harmless(tmp_path, monkeypatch):
    """The race, made certain: another writer creates the directory between tensorboardX's
    check and its makedirs (it raised FileExistsError, and the run got a tracker_failed event
    with a duplicate seq)."""
    import tensorboardX.record_writer as rw

    from training.events.trackers import TENSORBOARD_DIR, RunInfo, TensorBoard

    real = os.makedirs

    def another_writer_was_first(path, *args, **kwargs):
        real(path, exist_ok=True)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(rw.os, "makedirs", another_writer_was_first)
    run = RunInfo(str(tmp_path), {})
    first, second = TensorBoard(), TensorBoard()
    first.open(run)
    second.open(run)
    for backend in (first, second):
        backend.log(1, {"train/loss": 1.0})
        backend.close(ok=True)
    assert len(os.listdir(tmp_path / TENSORBOARD_DIR)) == 2  # one event file per session
