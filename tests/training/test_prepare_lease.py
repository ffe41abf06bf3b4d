"""One prepare of a corpus at a time (issue 37 item 6): the lease in the corpus directory, on a
volume (exclusive create) and in a bucket (write, settle, read back); a second prepare is
refused with exit 8 naming the holder, a lease whose holder stopped beating is taken over."""

from __future__ import annotations

import json
import os
import threading

import pyarrow.fs as pafs
import pytest

from tests.support.s3 import s3_server  # noqa: F401 - fixture
from training.data.lease import LEASE, CorpusBusy, Lease


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _me(name: str) -> dict:
    return {"id": f"id-{name}", "host": f"pod-{name}", "pid": 7, "job": f"job-{name}"}


def _leases(fs, root, clock):
    return [Lease(fs, root, _me(n), clock=clock, stale_s=300, settle_s=0, sleep=lambda s: None)
            for n in ("a", "b")]


def _exercise(fs, root):
    clock = Clock()
    a, b = _leases(fs, root, clock)
    a.acquire()
    clock.t += 100
    with pytest.raises(CorpusBusy, match="job job-a on pod-a \\(pid 7\\), last beat 100s ago") as e:
        b.acquire()
    assert e.value.exit_code == 8 and "\n" not in str(e.value)
    assert a.beat() and b.read()["id"] == "id-a"
    clock.t += 299  # a beat 299 s ago: still held
    with pytest.raises(CorpusBusy):
        b.acquire()
    clock.t += 2  # 301 s without a beat: the holder stopped; b takes over and says whose
    b.acquire()
    assert b.took_over["id"] == "id-a" and b.read()["id"] == "id-b"
    assert not a.beat() and a.lost["id"] == "id-b"  # a learns it lost the lease
    a.release()  # not a's any more: left alone
    assert b.read()["id"] == "id-b"
    b.release()
    assert b.read() is None


def test_a_volume_lease_refuses_a_second_prepare_and_takes_over_a_stale_one(tmp_path):
    _exercise(pafs.LocalFileSystem(), str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == []  # nothing left beside it


def test_of_many_prepares_starting_at_once_on_a_volume_one_holds_the_lease(tmp_path):
    fs, clock, won, busy = pafs.LocalFileSystem(), Clock(), [], []
    leases = [Lease(fs, str(tmp_path), _me(str(i)), clock=clock) for i in range(8)]
    start = threading.Barrier(len(leases))

    def take(lease):
        start.wait()
        try:
            lease.acquire()
            won.append(lease.me["id"])
        except CorpusBusy:
            busy.append(lease.me["id"])

    threads = [threading.Thread(target=take, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(busy) == 7
    assert json.loads((tmp_path / LEASE).read_text())["id"] == won[0]


def test_a_bucket_lease_does_the_same(s3_server):
    s3_server.make_bucket("corpora")
    _exercise(s3_server.filesystem(), "corpora/c")


def test_the_program_refuses_a_second_prepare_with_exit_8_before_writing(storage, tmp_path, capsys):
    from submitter.contract.naming import ENV_JOB
    from training import prepare as program

    (tmp_path / "d.txt").write_text("some text\n" * 50, encoding="utf-8")
    corpus = storage / "corpora" / "c"
    corpus.mkdir(parents=True)
    clock = Clock(__import__("time").time())
    Lease(pafs.LocalFileSystem(), str(corpus), _me("other"), clock=clock).acquire()
    job = {"name": "c", "data": str(tmp_path / "d.txt"), "tokenizer": "byte",
           "storage_path": str(storage)}
    for argv in ([], ["--force"]):  # --force (the program's own flag) takes no lease either
        assert program.main(argv, environ={ENV_JOB: json.dumps(job)}) == 8
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "another prepare holds this corpus (job job-other on pod-other" in err[0]
    assert sorted(os.listdir(corpus)) == [LEASE]  # no plan, no logs, no shard
