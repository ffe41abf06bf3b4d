"""kind end to end: runs scripts/e2e-kind.sh (a real cluster, the image, the KubeRay operator).

Skipped with its reason where there is no Docker engine or no kind (as in this sandbox).
Run: pytest -m e2e tests/e2e
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _docker_ok() -> bool:
    if shutil.which("docker") is None or shutil.which("kind") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


SCRIPT = ROOT / "scripts" / "e2e-kind.sh"


@pytest.mark.e2e
@pytest.mark.timeout(3600)  # the suite's 600 s default would kill a kind run half way
@pytest.mark.skipif(not _docker_ok(), reason="no Docker engine/kind")
def test_kind_submit_kill_a_worker_watch_delete_keeps_checkpoints():
    result = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, timeout=3500)
    assert result.returncode == 0


def test_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "e2e-kind.sh")], check=True)


def test_the_e2e_job_file_renders_to_the_job_the_script_checks(runner):
    """What the script submits is valid here already: the tiny job on the script's PVC and image."""
    import json

    from submitter.cli import main

    result = runner.invoke(main, ["submit", "-f", str(Path(__file__).with_name("tiny-job.yaml")),
                                  "--dry-run=client", "-o", "json"])
    assert result.exit_code == 0, result.output
    items = {o["kind"]: o for o in json.loads(result.output)["items"]}
    assert "PersistentVolumeClaim" not in items  # the script's own RWX volume is used
    head = items["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "e2e-checkpoints"}} in head["volumes"]
    script = SCRIPT.read_text()
    image = head["containers"][0]["image"]
    assert f"IMAGE={image} " in script  # the image the script builds and loads
    assert head["containers"][0]["imagePullPolicy"] == "Never"  # kind load, never pulled
    assert items["RayJob"]["spec"]["entrypoint"] == "python -m training"
    from submitter.contract.spec import JobSpec

    job = JobSpec.from_document(next(e["value"] for e in head["containers"][0]["env"]
                                     if e["name"] == "SUBMITTER_JOB"))
    assert (job.model, job.dataset, job.dataset_config) == ("tiny", "python-stdlib", None)


def test_the_e2e_job_fits_a_four_cpu_runner_with_room_for_ray_data():
    import yaml

    from submitter.contract.spec import JobSpec, _ray_cpus

    job = JobSpec.build(yaml.safe_load(Path(__file__).with_name("tiny-job.yaml").read_text()))
    assert job.cpus_per_train_worker == 1 and _ray_cpus(job.cpu_per_pod) == 2  # 1 left for Ray Data
    # worker + head + submitter pod + kind's own ~1 CPU of requests + the operator's 100m
    millis = lambda q: int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)  # noqa: E731
    total = job.max_replicas * millis(job.cpu_per_pod) + millis(job.head_cpu) + 200 + 1000 + 100
    assert total <= 4000, total
    assert job.head_memory == "3Gi" and job.checkpoint_every > 0
    assert job.max_failures >= 1  # the script deletes a worker mid-run


@pytest.mark.parametrize("needle", [
    "docker save", "kind load image-archive", "kubectl wait --for=delete",
    "{.metadata.generation}", "kind export logs", "kubectl delete pod", "worker_group_restarted",
    "--target cpu"])
def test_the_script_does_what_a_github_runner_needs(needle):
    assert needle in SCRIPT.read_text()


def test_the_script_never_uses_what_breaks_on_a_runner():
    text = SCRIPT.read_text()
    assert "kind load docker-image" not in text  # kind#3795 with the containerd image store
    # "unchanged" by resourceVersion breaks on any operator write (status): generation only
    assert "unchanged\"" not in text and "| grep -q \"rayjob/" not in text


def test_the_workflow_runs_the_test_with_cpu_torch_and_uploads_logs_on_failure():
    import yaml

    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "e2e.yml").read_text())
    steps = flow["jobs"]["kind"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert runs.index("download.pytorch.org/whl/cpu") < runs.index('pip install -e ".[test]"')
    assert "pytest -m e2e" in runs and "df -h" in runs
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["if"] == "failure()" and "kind-logs" in upload["with"]["path"]
