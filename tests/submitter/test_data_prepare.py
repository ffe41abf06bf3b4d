"""`submitter data prepare`: the prepare job rendered for a cluster (a RayJob of its own that
KubeRay's CRD accepts, running `python -m training.prepare` on CPU workers with the job's
ownership), bad input refused in one line (exit 2), and `--local` end to end: the program on an
embedded Ray, the corpus under `<storage>/corpora/<name>`, a second prepare that writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.fs as pafs
import pytest
import yaml

from submitter.cli import main as cli
from submitter.contract import naming
from tests.conftest import ROOT, shared_file
from tests.support.schemas import validate_plan

FINEWEB = ["data", "prepare", "--name", "fineweb-edu-10bt", "--dataset", "HuggingFaceFW/fineweb-edu",
           "--dataset-config", "sample-10BT", "--storage-path", "s3://corpora-bucket/runs",
           "-n", "team-a", "--replicas", "8", "--cpu-per-pod", "16"]


def test_a_rendered_prepare_job_is_a_rayjob_kuberay_accepts(runner):
    result = runner.invoke(cli, [*FINEWEB, "--dry-run=client", "-o", "yaml"])
    assert result.exit_code == 0, result.output
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    assert validate_plan(objects) == []
    rayjob = next(o for o in objects if o["kind"] == "RayJob")
    assert rayjob["spec"]["entrypoint"] == "python -m training.prepare"
    assert rayjob["metadata"]["labels"].items() >= naming.labels("fineweb-edu-10bt").items()
    workers = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert workers["replicas"] == 8
    container = workers["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["cpu"] == "16"
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    document = json.loads(next(e["value"] for e in head["env"] if e["name"] == naming.ENV_JOB))
    assert (document["dataset"], document["datasetConfig"], document["name"]) == \
        ("HuggingFaceFW/fineweb-edu", "sample-10BT", "fineweb-edu-10bt")
    again = runner.invoke(cli, [*FINEWEB, "--dry-run=client", "-o", "yaml"])
    assert again.stdout == result.stdout  # GitOps: the same input, the same bytes


def test_force_renders_a_prepare_that_makes_every_shard_again(runner):
    result = runner.invoke(cli, [*FINEWEB, "--force", "--dry-run=client", "-o", "yaml"])
    assert result.exit_code == 0, result.output
    rayjob = next(o for o in yaml.safe_load_all(result.stdout) if o and o["kind"] == "RayJob")
    assert rayjob["spec"]["entrypoint"] == "python -m training.prepare --force"


@pytest.mark.parametrize("args, says", [
    (["data", "prepare", "--dataset", "x"], "needs the corpus's name: --name NAME"),
    (["data", "prepare", "--name", "Bad_Name", "--dry-run=client"], "is not a valid name"),
    (["data", "prepare", "--name", "ok", "--storage-path", "/tmp/x", "--dry-run=client"], "/tmp"),
    (["data", "prepare", "--name", "ok", "--local", "-o", "yaml"], "use -o text or -o json"),
    (["data", "prepare", "--name", "ok", "--val-percent", "100", "--dry-run=client"], "val-percent"),
    (["render", "--name", "corpora"], "where prepared corpora live"),
    (["data", "prepare", "--name", "ok", "--data", "wiki", "--dry-run=client"], "names a prepared corpus"),
    (["data", "prepare", "--name", "ok", "--data", "/mnt/checkpoints/corpora/wiki", "--local"],
     "names a prepared corpus"),
])
def test_bad_input_is_one_line_and_exit_2(runner, args, says):
    result = runner.invoke(cli, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], result.stderr
    assert result.stdout == ""


@pytest.mark.slow
def test_prepare_local_writes_the_corpus_once(storage, tmp_path):
    """The real program on Ray Data: its shards are the bytes the in-process prepare writes; a
    second prepare says so and touches nothing."""
    from training.data import prepare as prep
    from training.data import shards as sh
    from training.data.tokens import TokenizerSpec

    text = shared_file("data", "wikitext-2", "valid.txt").read_text(encoding="utf-8")
    source_file = storage / "wiki-slice.txt"
    source_file.write_text("\n".join(text.splitlines()[:1500]) + "\n", encoding="utf-8")
    bpe = str(shared_file("data", "gpt2.tiktoken"))
    argv = [sys.executable, "-m", "submitter", "data", "prepare", "--local", "--name", "wiki",
            "--data", str(source_file), "--bpe-file", bpe, "--storage-path", str(storage / "runs")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    corpus = storage / "runs" / "corpora" / "wiki"
    assert "shard 1/1 written" in first.stdout and "corpus ready" in first.stdout
    # the closing hint works as printed: it carries the tokenizer the corpus was prepared with
    assert (f"train on it: submitter submit --local --data wiki --storage-path {storage / 'runs'} "
            f"--bpe-file {bpe}") in first.stdout
    assert f"corpus: {corpus}" in first.stdout
    assert sorted(p.name for p in storage.iterdir()) == ["runs", "wiki-slice.txt"]
    fs = pafs.LocalFileSystem()
    manifest = sh.read_manifest(fs, str(corpus))
    sh.check_files(fs, str(corpus), manifest)
    here = prep.prepare(prep.files_source(str(source_file), "auto", "text"), fs,
                        str(tmp_path / "here"), TokenizerSpec("bpe-file", bpe), name="wiki",
                        val_percent=5.0, use_ray=False)
    assert [s.file for s in here.manifest.shards] == [s.file for s in manifest.shards]
    assert all((corpus / s.file).read_bytes() == (tmp_path / "here" / s.file).read_bytes()
               for s in manifest.shards)
    before = {p.name: p.stat().st_mtime_ns for p in corpus.rglob("*")}
    second = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already prepared" in second.stdout
    assert {p.name: p.stat().st_mtime_ns for p in corpus.rglob("*")} == before
    # issue 37 item 5: a truncated shard is refused by training's check, and the advice works
    shard = corpus / manifest.split(sh.TRAIN)[0].file
    whole = shard.read_bytes()
    shard.write_bytes(whole[:-100])
    with pytest.raises(sh.CorpusError, match="submitter data prepare --name wiki "):
        sh.check_files(fs, str(corpus), manifest)
    third = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert third.returncode == 0, third.stdout + third.stderr
    assert f"repairing {corpus}: {shard}: " in third.stdout and "already" not in third.stdout
    assert shard.read_bytes() == whole
    sh.check_files(fs, str(corpus), sh.read_manifest(fs, str(corpus)))
    assert not (corpus / "prepare.lease").exists()  # each prepare released its lease


def test_prepare_help_says_what_prepare_reads_not_what_submit_trains_on(runner):
    from training.data.prepare import HOLD_OUT_TOKENS

    result = runner.invoke(cli, ["data", "prepare", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for copied in ("train on these files", "token blocks", "--gpu-per-pod"):
        assert copied not in text, copied
    assert "[default: Salesforce/wikitext; with --local: python-stdlib]" in text
    assert f"% of the documents held out for validation" in text
    assert f"at most ~{HOLD_OUT_TOKENS:,} tokens" in text
    assert "--force" in text


def test_status_says_how_much_is_held_out():
    from submitter.contract import events as ev
    from submitter.event_text import describe

    done = ev.make_event("run_finished", seq=3, corpus="s3://b/c/fw", shards=100,
                         tokens=9_900_000_000, val_tokens=99_000_000, already=False,
                         hold_out="hold-out 1% of documents, capped at ~100,000,000 tokens "
                                  "(--val-percent 5)")
    assert describe(done) == ("corpus ready: 100 training shard(s), 9,900,000,000 training and "
                              "99,000,000 validation tokens (hold-out 1% of documents, capped at "
                              "~100,000,000 tokens (--val-percent 5)) in s3://b/c/fw")


def test_watch_shows_a_prepare_job_s_progress():
    from submitter.contract import events as ev
    from submitter.event_text import describe

    stream = [ev.make_event("run_started", seq=1, run_name="fw", num_workers=64,
                            storage_path="s3://b/runs/team/corpora/fw", corpus="s3://b/runs/team/corpora/fw"),
              ev.make_event("prepare_progress", seq=2, shards_done=3, shards=101,
                            tokens=301_000_000, tokens_per_sec=4_200_000.0, documents=310_000),
              ev.make_event("run_finished", seq=3, corpus="s3://b/runs/team/corpora/fw", shards=100,
                            tokens=9_900_000_000, val_tokens=49_000_000, already=False)]
    lines = [describe(e) for e in stream]
    assert lines[0] == "prepare fw started: 64 CPU(s), corpus s3://b/runs/team/corpora/fw"
    assert lines[1] == "shard 3/101 written  301,000,000 tokens  4,200,000 tok/s"
    assert lines[2].startswith("corpus ready: 100 training shard(s), 9,900,000,000 training")
    state = ev.fold(stream[:2])
    assert (state.status, state.tokens_per_sec) == ("running", 4_200_000.0)
    assert ev.fold(stream).status == "finished"
