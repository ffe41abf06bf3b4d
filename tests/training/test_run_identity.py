"""Run identity: where a run lives, what it is (run.json), who drives it (run.lock)."""

from __future__ import annotations

import json
import os

import pytest

from submitter.contract import events as ev
from submitter.contract import naming
from submitter.contract.spec import JobSpec
from training.run.identity import (LOCK_FILE, RUN_FILE, RunFinished, RunLock, RunLocked,
                                   RunMismatch, check_not_finished, claim_run, identity,
                                   run_storage_path)

POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


def _ident(**changes):
    job = JobSpec.build(name="j", model="tiny", dataset="python-stdlib", dataset_config=None).to_dict()
    job.update(changes)
    return job, identity(job, "byte", 257, 128)


# --- where ---------------------------------------------------------------------------------------

def test_a_cluster_run_lives_under_its_namespace():
    assert run_storage_path("/mnt/checkpoints", "team-a", POD) == "/mnt/checkpoints/team-a"
    assert run_storage_path("s3://b/runs/", "team-a", POD) == "s3://b/runs/team-a"
    # the namespace the pod really runs in wins over the document's (a chart installed with -n)
    pod = {**POD, naming.ENV_NAMESPACE: "team-b"}
    assert run_storage_path("/mnt/checkpoints", "default", pod) == "/mnt/checkpoints/team-b"


def test_same_name_in_two_namespaces_gives_two_run_directories():
    from training.driver import prepare_run

    a, _ = prepare_run(JobSpec.build(name="x", namespace="a", storage_path="s3://b/r"), POD)
    b, _ = prepare_run(JobSpec.build(name="x", namespace="b", storage_path="s3://b/r"), POD)
    assert (a.storage_path, a.run_name) == ("s3://b/r/a", "x")
    assert (b.storage_path, b.run_name) == ("s3://b/r/b", "x")


def test_a_local_run_lives_directly_under_the_storage_path():
    assert run_storage_path("/data/runs", "default", {}) == "/data/runs"


# --- what ----------------------------------------------------------------------------------------

def test_run_json_is_written_once_beside_the_checkpoints(tmp_path):
    job, ident = _ident()
    assert "new" in claim_run(str(tmp_path / "j"), job, ident)
    first = (tmp_path / "j" / RUN_FILE).read_text()
    assert "continuing" in claim_run(str(tmp_path / "j"), {**job, "epochs": 9}, ident)
    assert (tmp_path / "j" / RUN_FILE).read_text() == first  # never rewritten
    assert json.loads(first)["identity"]["tokenizer"] == "byte"


@pytest.mark.parametrize("change, named", [
    ({"model": "gpt2-small"}, "model: 'tiny' -> 'gpt2-small'"),
    ({"data": "/data/other.txt"}, "data: None -> '/data/other.txt'"),
    ({"block_size": 64}, "block_size: 128 -> 64"),
])
def test_a_resume_with_other_model_data_or_tokenizer_is_refused_naming_the_difference(
        tmp_path, change, named):
    job, ident = _ident()
    claim_run(str(tmp_path / "j"), job, ident)
    (tmp_path / "j" / "checkpoint_epoch001_step0000010").mkdir()
    other_job = {**job, **change}
    other = identity(other_job, "byte", 257, change.get("block_size", 128))
    with pytest.raises(RunMismatch) as e:
        claim_run(str(tmp_path / "j"), other_job, other)
    assert named in str(e.value) and "--name" in str(e.value) and "\n" not in str(e.value)


def test_another_tokenizer_is_refused(tmp_path):
    job, ident = _ident()
    claim_run(str(tmp_path / "j"), job, ident)
    (tmp_path / "j" / "checkpoint_epoch001_step0000010").mkdir()
    with pytest.raises(RunMismatch, match="tokenizer: 'byte' -> 'bpe-file'"):
        claim_run(str(tmp_path / "j"), job, identity(job, "bpe-file", 50257, 128))


def test_more_epochs_and_other_optimisation_settings_extend_the_run(tmp_path):
    job, ident = _ident()
    claim_run(str(tmp_path / "j"), job, ident)
    more = {**job, "epochs": 10, "learning_rate": 1e-4, "replicas": 4}
    assert "continuing" in claim_run(str(tmp_path / "j"), more, identity(more, "byte", 257, 128))


def test_re_running_a_finished_run_says_so_and_how_to_extend_it():
    finished = ev.fold([ev.make_event("run_started", seq=1, run_name="j", num_workers=1,
                                      storage_path="/s"),
                        ev.make_event("run_finished", seq=2, epoch=2, step=240)])
    with pytest.raises(RunFinished) as e:
        check_not_finished(finished, 2, "/s/j", "j")
    assert "already finished 2 epoch(s)" in str(e.value) and "--epochs 3" in str(e.value)
    check_not_finished(finished, 3, "/s/j", "j")  # more epochs: it extends the run
    check_not_finished(ev.fold([]), 2, "/s/j", "j")  # a new run


# --- who -----------------------------------------------------------------------------------------

class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_second_live_driver_on_the_same_host_is_refused_at_once(tmp_path):
    first = RunLock(str(tmp_path), host="h", pid=os.getpid())
    first.acquire()
    try:
        second = RunLock(str(tmp_path), host="h", pid=os.getpid() + 1)
        with pytest.raises(RunLocked) as e:
            second.acquire(wait_s=60, sleep=lambda s: pytest.fail("must not wait"))
        assert f"pid {os.getpid()} on h" in str(e.value) and "--name" in str(e.value)
    finally:
        first.release()
    assert not (tmp_path / LOCK_FILE).exists()  # released: the next driver gets it


def test_a_lock_left_by_a_dead_process_on_this_host_is_taken_over(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "h", "heartbeat": 1000.0,
                                                  "token": "old"}))
    lock = RunLock(str(tmp_path), host="h", clock=Clock(1001.0), alive=lambda pid: False)
    lock.acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == lock.me.token
    lock.release()


def test_a_silent_lock_from_another_host_is_taken_over_after_two_minutes(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 7, "host": "old-head", "heartbeat": 1000.0,
                                                  "token": "old"}))
    clock = Clock(1000.0 + 60)
    lock = RunLock(str(tmp_path), host="new-head", clock=clock)
    with pytest.raises(RunLocked, match="heartbeat 60s ago"):
        lock.acquire()  # fresh heartbeat on another host, no wait asked for
    waited = []

    def sleep(s):
        waited.append(s)
        clock.t += s

    told = []
    lock.acquire(wait_s=130, sleep=sleep, on_wait=told.append)  # a RayJob retry waits it out
    assert len(told) == 1 and "held by pid 7 on old-head" in told[0]
    assert sum(waited) > 60 and json.loads((tmp_path / LOCK_FILE).read_text())["host"] == "new-head"
    lock.release()


def test_a_torn_lock_file_is_stale(tmp_path):
    (tmp_path / LOCK_FILE).write_text('{"pid": 12, "ho')
    lock = RunLock(str(tmp_path), host="h")
    lock.acquire()
    lock.release()


def test_two_local_runs_with_the_default_name_cannot_share_a_directory_silently(tmp_path):
    """`submit --local` twice with the default name: the second live driver is refused by the
    lock; once the first ended, the second continues the same run (or is refused if its
    settings differ)."""
    from submitter.contract.spec import LOCAL_DEFAULTS
    from training.gpt2.config import TrainConfig
    from training.driver import claim_run_dir

    spec = JobSpec.build({**LOCAL_DEFAULTS, "storage_path": str(tmp_path), "tokenizer": "byte"})
    cfg = TrainConfig.from_spec(spec)
    first = claim_run_dir(cfg, notice=lambda line: None, environ={})
    try:
        with pytest.raises(RunLocked):
            claim_run_dir(cfg, notice=lambda line: None, environ={})
    finally:
        first.release()
    lines = []
    claim_run_dir(cfg, notice=lines.append, environ={}).release()
    assert any("continuing" in line for line in lines)
    (tmp_path / spec.name / "checkpoint_epoch001_step0000005").mkdir()
    other = TrainConfig.from_spec(JobSpec.build({**spec.to_dict(), "block_size": 32}))
    with pytest.raises(RunMismatch, match="block_size"):
        claim_run_dir(other, notice=lambda line: None, environ={})
    assert not (tmp_path / spec.name / LOCK_FILE).exists()  # a refused driver leaves no lock


def test_a_run_without_a_checkpoint_may_start_again_with_corrected_settings(tmp_path):
    """A typo in --data failed before the first checkpoint: nothing to protect, so the
    corrected start records its own settings (the old record is kept aside)."""
    job, ident = _ident(data="/data/typo.txt")
    claim_run(str(tmp_path / "j"), job, ident)
    fixed_job, fixed = _ident(data="/data/train.txt")
    assert "new" in claim_run(str(tmp_path / "j"), fixed_job, fixed)
    assert json.loads((tmp_path / "j" / RUN_FILE).read_text())["identity"]["data"] == "/data/train.txt"
    assert (tmp_path / "j" / (RUN_FILE + ".replaced")).exists()
