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


@pytest.mark.e2e
@pytest.mark.skipif(not _docker_ok(), reason="no Docker engine/kind")
def test_kind_submit_watch_delete_keeps_checkpoints():
    result = subprocess.run(["bash", str(ROOT / "scripts" / "e2e-kind.sh")], cwd=ROOT, timeout=3600)
    assert result.returncode == 0


def test_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "e2e-kind.sh")], check=True)


def test_the_e2e_job_file_renders_to_the_job_the_script_checks(runner):
    """What the script submits is valid here already: the tiny job on the script's PVC and image."""
    import json

    from submitter.cli import main
    from submitter.contract.spec import DEFAULT_IMAGE

    result = runner.invoke(main, ["submit", "-f", str(Path(__file__).with_name("tiny-job.yaml")),
                                  "--dry-run=client", "-o", "json"])
    assert result.exit_code == 0, result.output
    items = {o["kind"]: o for o in json.loads(result.output)["items"]}
    assert "PersistentVolumeClaim" not in items  # the script's own RWX volume is used
    head = items["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "e2e-checkpoints"}} in head["volumes"]
    assert head["containers"][0]["image"] == DEFAULT_IMAGE
    assert head["containers"][0]["imagePullPolicy"] == "Never"  # kind load, never pulled
    assert items["RayJob"]["spec"]["entrypoint"] == "python -m training"
    from submitter.contract.spec import JobSpec

    job = JobSpec.from_document(next(e["value"] for e in head["containers"][0]["env"]
                                     if e["name"] == "SUBMITTER_JOB"))
    assert (job.model, job.dataset, job.dataset_config) == ("tiny", "python-stdlib", None)
