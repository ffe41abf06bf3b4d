"""`--data <prepared corpus>`: which data path a job takes and why (render's `resolved`, the
run's first lines), and a corpus that cannot be trained on refused in one line, exit 2, before
Ray starts or anything is written (through the real entry, `python -m training`'s main)."""

from __future__ import annotations

import json

import pyarrow.fs as pafs
import pytest

from submitter.contract.data_path import AT_START, ON_THE_FLY, PREPARED, data_path
from submitter.contract.spec import JobSpec
from tests.support.corpus import BYTE, GPT2, make_corpus
from training.data import shards as sh

BLOCK = 16


def test_the_data_path_is_chosen_by_what_the_data_is():
    assert data_path("fineweb10b", "x").kind == PREPARED
    assert data_path("s3://b/corpora/fw", "x").kind == PREPARED
    assert data_path("/mnt/c/fw/manifest.json", "x").kind == PREPARED
    assert data_path("/mnt/c/fw", "x").kind == AT_START
    assert data_path("/mnt/c/train.txt", "x").kind == ON_THE_FLY
    assert data_path(None, "python-stdlib").kind == ON_THE_FLY
    gpu = dict(name="j", gpu_per_pod=2, cpu_per_pod="8")
    prepared, fly = JobSpec.build(data="fw", **gpu), JobSpec.build(**gpu)
    # a prepared corpus is read in the workers' own processes: no CPU kept for Ray Data
    assert prepared.data_cpus_per_pod == 0 and fly.data_cpus_per_pod == 2
    assert prepared.cpus_per_train_worker == 4 and fly.cpus_per_train_worker == 3
    said = prepared.resolved()["dataPath"]
    assert said["kind"] == PREPARED and "no Ray Data" in said["why"]
    assert "on the fly" in fly.resolved()["dataPath"]["why"]


def test_render_takes_a_corpus_name_and_says_which_path(runner):
    from submitter.cli import main as cli

    out = runner.invoke(cli, ["render", "--name", "j", "--data", "fw", "-n", "ns"])
    assert out.exit_code == 0, out.output
    doc = next(json.loads(e["value"]) for e in _envs(out.output) if e["name"] == "SUBMITTER_JOB")
    assert doc["resolved"]["dataPath"]["kind"] == PREPARED
    assert doc["resolved"]["dataCpusPerPod"] == 0


def _envs(text):
    import yaml

    for obj in yaml.safe_load_all(text):
        if obj and obj.get("kind") == "RayJob":
            for group in [obj["spec"]["rayClusterSpec"]["headGroupSpec"]]:
                for c in group["template"]["spec"]["containers"]:
                    yield from c.get("env", [])


def _main(capsys, storage, *argv):
    """`python -m training` (its main, in this process): the exit code and stderr's lines."""
    import ray

    from training.__main__ import main

    code = main(["--name", "j", "--storage-path", str(storage), "--model", "tiny",
                 "--tokenizer", "byte", "--block-size", str(BLOCK), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert not ray.is_initialized()  # refused before Ray started
    assert not (storage / "j").exists()  # nothing written for the run
    return code, err


def _damage_manifest(root):
    m = sh.read_manifest(pafs.LocalFileSystem(), str(root))
    shard = m.shards[0]
    bad = sh.Manifest(**{**m.__dict__, "shards": (sh.Shard(shard.file, shard.split,
                                                           shard.tokens + BLOCK),
                                                  *m.shards[1:])})
    (root / sh.MANIFEST).write_text(bad.to_json())


@pytest.mark.parametrize("tokenizer, damage, says", [
    (GPT2, None, "tokenizer"),
    (BYTE, lambda root: (root / "train-000001.bin").unlink(), "missing"),
    (BYTE, lambda root: (root / "train-000000.bin").write_bytes(
        (root / "train-000000.bin").read_bytes()[:-6]), "truncated"),
    (BYTE, _damage_manifest, "the manifest says"),
    (BYTE, lambda root: (root / sh.MANIFEST).unlink(), "no manifest.json"),
], ids=["tokenizer", "missing-shard", "truncated-shard", "manifest-disagrees", "no-manifest"])
def test_a_corpus_that_cannot_be_trained_on_is_one_line_and_exit_2(
        capsys, storage, tokenizer, damage, says):
    root = storage / "corpora" / "c"
    make_corpus(pafs.LocalFileSystem(), str(root), [BLOCK * 40, BLOCK * 40], block=BLOCK,
                tokenizer=tokenizer)
    if damage:
        damage(root)
    for data in ("c", str(root)):  # by NAME (under the storage) and by path
        code, err = _main(capsys, storage, "--data", data)
        assert code == 2 and len(err) == 1 and says in err[0], err


def test_a_corpus_shorter_than_one_step_is_refused(capsys, storage):
    make_corpus(pafs.LocalFileSystem(), str(storage / "corpora" / "c"), [BLOCK * 12],
                block=BLOCK)  # 12 sequences; 2 workers x 8 a step
    code, err = _main(capsys, storage, "--data", "c", "--replicas", "2")
    assert code == 2 and len(err) == 1 and "fewer than one optimizer step (16)" in err[0], err


@pytest.mark.parametrize("data, says", [("hdfs://nn/corpora/c", "hdfs://"),
                                        ("corpora/c", "relative path")])
def test_a_corpus_path_the_storage_policy_refuses(capsys, storage, data, says):
    code, err = _main(capsys, storage, "--data", data)
    assert code == 2 and len(err) == 1 and says in err[0], err


def test_a_prepared_corpus_validates_on_its_own_shards(capsys, storage):
    make_corpus(pafs.LocalFileSystem(), str(storage / "corpora" / "c"), [BLOCK * 40],
                block=BLOCK)
    code, err = _main(capsys, storage, "--data", "c", "--val-data", "/x/val.txt")
    assert code == 2 and len(err) == 1 and "validation shard" in err[0], err


@pytest.mark.slow
def test_a_preempted_run_on_a_prepared_corpus_resumes_at_its_position(storage):
    """Real Ray, 2 workers, a prepared corpus: SIGTERM to a worker mid-epoch checkpoints at a
    step boundary with the data's position; the retried group starts its readers there (the
    restart says the position, and the steps go on from the next one: nothing replayed)."""
    import signal

    import ray

    from tests.training.test_ray import _events, _run, _signal_a_worker, _when

    # 640 sequences: 40 steps of 2 x 8; no validation split (checkpoints ranked by recency)
    make_corpus(pafs.LocalFileSystem(), str(storage / "corpora" / "c"), [64 * 400, 64 * 240],
                block=64)
    signalled: list[int] = []

    def mid_epoch(events: list[dict]) -> bool:
        return any(e["type"] == "progress" and e["step"] >= 12 for e in events)

    watcher = _when(storage, "pd", mid_epoch, _signal_a_worker(signal.SIGTERM, signalled))
    try:
        outcome = _run(["--name", "pd", "--storage-path", str(storage), "--model", "tiny",
                        "--data", "c", "--tokenizer", "byte", "--block-size", "64",
                        "--val-steps", "2", "--replicas", "2", "--epochs", "1",
                        "--max-failures", "2", "--progress-every", "1"])
    finally:
        ray.shutdown()
    watcher.join(timeout=1)
    assert signalled, "no worker got SIGTERM"
    assert outcome.ok, outcome.error
    events = _events(storage, "pd")
    started = events[0]
    assert started["data_path"] == "prepared" and started["steps_per_epoch"] == 40
    assert started["steps_per_epoch_estimated"] is False
    saved = [e for e in events if e["type"] == "checkpoint_saved" and e["reason"] == "preemption"]
    assert len(saved) == 1
    at = saved[0]["step"]
    restart = next(e for e in events if e["type"] == "worker_group_restarted")
    assert restart["step"] == at and restart["sequences_in_epoch"] == at * 16
    i = events.index(restart)
    assert next(e for e in events[i:] if e["type"] == "progress")["step"] == at + 1
    assert [e["steps"] for e in events if e["type"] == "epoch_finished"] == [40 - at]
    assert events[-1]["type"] == "run_finished" and events[-1]["step"] == 40
    # no validation: a second checkpoint without val_loss is ranked (not a TypeError in Ray's
    # controller), nothing is called best by val_loss
    assert [e["val_loss"] for e in events if e["type"] in ("epoch_finished", "checkpoint_saved")
            ] == [None, None, None]
    assert events[-1].get("val_loss") is None and not events[-1].get("best_checkpoint")


def test_the_resume_position_comes_from_the_checkpoint():
    from training.gpt2.loop import resume_position

    assert resume_position(None, 16) == 0
    mid = {"epoch": 1, "step": 30, "step_in_epoch": 5, "epoch_done": False}
    assert resume_position({**mid, "sequences_in_epoch": 96}, 16) == 96  # saved by another size
    assert resume_position(mid, 16) == 80  # a checkpoint from before positions: steps x G
    assert resume_position({**mid, "epoch_done": True, "sequences_in_epoch": 96}, 16) == 0


def test_a_resume_into_a_changed_order_is_refused_before_ray(capsys, storage):
    """The run's latest checkpoint is mid-epoch in an order this corpus no longer gives (it
    was prepared again): `python -m training` refuses in one line, exit 2, before Ray starts,
    naming the flag that starts the epoch afresh."""
    import ray

    from training.__main__ import main
    from training.data.reader import open_corpus, write_order_note

    root = storage / "corpora" / "c"
    make_corpus(pafs.LocalFileSystem(), str(root), [BLOCK * 40, BLOCK * 40], block=BLOCK)
    reader = open_corpus(str(root), BLOCK)
    pin = {**reader.pin(reader.order(0, 0)), "corpus": "prepared-before"}
    reader.close()
    checkpoint = storage / "j" / "checkpoint_epoch001_step0000003"
    checkpoint.mkdir(parents=True)
    write_order_note(str(checkpoint), {"epoch": 0, "epoch_done": False,
                                       "sequences_in_epoch": 48, "data_order": pin})
    code = main(["--name", "j", "--storage-path", str(storage), "--model", "tiny",
                 "--tokenizer", "byte", "--block-size", str(BLOCK), "--data", "c"])
    err = capsys.readouterr().err.strip().splitlines()
    assert not ray.is_initialized()
    assert code == 2 and len(err) == 1, err
    assert "48 sequences into epoch 1" in err[0] and "--restart-epoch" in err[0], err
    assert sorted(p.name for p in (storage / "j").iterdir()) == [checkpoint.name]


def test_a_mixture_renders_and_a_missing_or_bad_corpus_of_it_is_one_line(runner, capsys,
                                                                         storage):
    """`--data a:0.7,b:0.3`: render takes it as prepared corpora (the job document says the
    shares); a bad weight is refused by render, a missing corpus of the mixture by the
    program before Ray starts (exit 2, one line naming it)."""
    from submitter.cli import main as cli

    out = runner.invoke(cli, ["render", "--name", "j", "--data", "a:0.7,b:0.3", "-n", "ns"])
    assert out.exit_code == 0, out.output
    doc = next(json.loads(e["value"]) for e in _envs(out.output) if e["name"] == "SUBMITTER_JOB")
    assert doc["resolved"]["dataPath"]["kind"] == PREPARED
    assert "a 70%, b 30%" in doc["resolved"]["dataPath"]["why"]
    bad = runner.invoke(cli, ["render", "--name", "j", "--data", "a:0.7,b:-1", "-n", "ns"])
    assert bad.exit_code == 2 and "positive number" in bad.output, bad.output
    make_corpus(pafs.LocalFileSystem(), str(storage / "corpora" / "a"), [BLOCK * 40],
                block=BLOCK)
    code, err = _main(capsys, storage, "--data", "a:0.7,b:0.3")
    assert code == 2 and len(err) == 1 and "--data b (" in err[0], err
    assert "no manifest.json" in err[0], err


def test_status_says_what_the_run_trains_on(capsys):
    """run_started's `data` (a mixture's shares) is folded into the job's progress and
    `submitter status` prints it under the job's row."""
    from submitter.cli_cluster import _print_states
    from submitter.contract import events as ev
    from submitter.state import JobState

    line = "mixture of prepared corpora, every step fw 70%, stack 30%: fw 9, stack 3 sequences"
    progress = ev.fold([{"type": "run_started", "run_name": "j", "num_workers": 2,
                         "storage_path": "/x", "data": line},
                        {"type": "progress", "epoch": 1, "step": 3, "loss": 2.0,
                         "tokens_per_sec": 10.0, "lr": 1e-3}])
    assert progress.data == line
    _print_states([JobState("j", "ns", "RUNNING", progress=progress)], "table", single=True)
    assert f"data: {line}" in capsys.readouterr().out.splitlines()
