"""`submitter report --storage-path s3://...`: the run's events.jsonl read from an object store
where the pod's sink writes it (training.run.object_store, under training.run.identity's layout),
against moto's S3 server; pyarrow is imported only for a URI."""

from __future__ import annotations

import subprocess
import sys

from submitter.cli import main
from submitter.contract import events as ev
from tests.submitter.test_report import NAME, a_run, check_outputs

BUCKET = "ckpt"


def write_run_as_the_pod_does(namespace: str | None) -> str:
    """The events as the ObjectStoreSink of a pod (or of a local run) leaves them; the URI."""
    from training.run.object_store import ObjectStoreSink
    from training.run.identity import join, run_storage_path

    environ = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"} if namespace else {}
    run_dir = join(run_storage_path(f"s3://{BUCKET}/runs", namespace or "default", environ), NAME)
    sink = ObjectStoreSink(join(run_dir, "events.jsonl"))
    state = ev.ProgressState()
    for event in a_run():
        sink.write(event, state)
    sink.flush()
    return join(run_dir, "events.jsonl")


def test_report_of_a_cluster_run_in_s3(s3_server, runner, tmp_path):
    s3_server.make_bucket(BUCKET)
    uri = write_run_as_the_pod_does("team-a")
    assert uri == f"s3://{BUCKET}/runs/team-a/{NAME}/events.jsonl"
    out = tmp_path / "out"
    result = runner.invoke(main, ["report", NAME, "-n", "team-a", "--storage-path", f"s3://{BUCKET}/runs",
                                  "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    check_outputs(out, "val_loss", "1.7", "tiny", "restarts", "finished", uri)
    # without -n: found one level down, as for a local storage path
    again = runner.invoke(main, ["report", NAME, "--storage-path", f"s3://{BUCKET}/runs/",
                                 "--output-dir", str(tmp_path / "again")])
    assert again.exit_code == 0, again.output
    # what the run took (usage.json, written as the pod's UsageSink does) beside the events:
    # report shows it, and an estimate on this storage finds it (issue 38)
    from submitter.contract.usage import measure, read_usages
    from submitter.report import usage_texts
    from training.run.usage_file import write_text

    usage = measure(a_run(), storage_kind="object-store")
    write_text(uri.rsplit("/", 1)[0] + "/usage.json", usage.to_json())
    took = runner.invoke(main, ["report", NAME, "-n", "team-a", "--storage-path",
                                f"s3://{BUCKET}/runs", "--output-dir", str(tmp_path / "took")])
    assert took.exit_code == 0 and "took: " in took.output, took.output
    assert read_usages(f"s3://{BUCKET}/runs", usage_texts) == [usage]
    assert read_usages(f"s3://{BUCKET}/runs") == []  # the contract alone reads no bucket


def test_report_of_a_local_run_in_s3(s3_server, runner, tmp_path):
    s3_server.make_bucket(BUCKET)
    write_run_as_the_pod_does(None)
    result = runner.invoke(main, ["report", NAME, "--storage-path", f"s3://{BUCKET}/runs",
                                  "--output-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output


def test_a_run_missing_from_the_bucket_is_one_line(s3_server, runner, tmp_path):
    s3_server.make_bucket(BUCKET)
    result = runner.invoke(main, ["report", NAME, "--storage-path", f"s3://{BUCKET}/runs",
                                  "--output-dir", str(tmp_path)])
    assert result.exit_code == 6
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert f"no events.jsonl for run {NAME} under s3://{BUCKET}/runs" in result.stderr


def test_without_pyarrow_an_object_store_report_exits_2_with_the_pip_command(runner, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.fs", None)
    result = runner.invoke(main, ["report", NAME, "--storage-path", "gs://bucket/runs"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: submitter report --storage-path s3://|gs://|abfss://... "
                                     'needs pyarrow: pip install "submitter-gpt2[report]" (in a checkout: '
                                     'pip install -e ".[report]")')


def test_the_cli_and_a_local_report_never_import_pyarrow(tmp_path):
    code = ("import sys; from submitter import cli, report; "
            "from submitter.report import from_run_dir\n"
            "try:\n    from_run_dir(sys.argv[1], 'x')\nexcept Exception:\n    pass\n"
            "assert 'pyarrow' not in sys.modules, 'pyarrow imported'")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
