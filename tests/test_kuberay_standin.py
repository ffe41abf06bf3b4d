"""The rendered RayJob, run as KubeRay runs it: real `ray start` processes for its pods, the
K8sJobMode submitter's `ray job submit`, the Role enforced on the pods' token, a bucket for the
checkpoints (tests/support/kuberay_standin.py says what stands in for what).

Each scenario is one small real run (tiny model, one worker pod, a few dozen steps): slow, so
marked `slow`, and lean enough for CI.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from submitter.cli import main
from submitter.contract import events as ev
from submitter.contract import naming
from tests.support.kuberay_standin import KubeRayStandIn, running_rbac_emulator

pytestmark = pytest.mark.slow

NAME = "standin"
BUCKET = "bkt"
#: Guards against a hang only; a run takes about a minute on a quiet 2-core machine.
WATCH_TIMEOUT = "15m"


def job_file(tmp_path: Path, **overrides) -> str:
    job = {"name": NAME, "namespace": "default", "model": "tiny", "dataset": naming.OFFLINE_DATASET,
           "dataset_config": None, "epochs": 1, "max_steps_per_epoch": 24, "checkpoint_every": 8,
           "progress_every": 4, "val_steps": 2, "replicas": 1, "cpu_per_pod": "2",
           "memory_per_pod": "3Gi", "head_cpu": "500m", "head_memory": "3Gi",
           "storage_path": f"s3://{BUCKET}/runs", "env_from_secret": ["s3-creds"],
           "secret_env": {"AWS_SECRET_ACCESS_KEY": "s3-creds:AWS_SECRET_ACCESS_KEY"},
           "max_failures": 3, **overrides}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


class Cluster:
    """The emulator, the bucket and the stand-in of one test, with the CLI pointed at them."""

    def __init__(self, api, s3, runner, tmp_path: Path) -> None:
        self.api, self.s3, self.runner, self.tmp = api, s3, runner, tmp_path
        self.kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        self.standin = KubeRayStandIn(api.emulator, api.url, tmp_path)
        s3.make_bucket(BUCKET)
        data = {k: base64.b64encode(v.encode()).decode() for k, v in s3.env.items()}
        api.emulator.put("v1", "secrets", {"apiVersion": "v1", "kind": "Secret",
                                           "metadata": {"name": "s3-creds", "namespace": "default"},
                                           "data": data})

    def cli(self, *args: str):
        return self.runner.invoke(main, [*args, "--kubeconfig", self.kubeconfig])

    def submit(self, **overrides) -> None:
        result = self.cli("submit", "-f", job_file(self.tmp, **overrides))
        assert result.exit_code == 0, result.output

    def configmap_events(self) -> list[dict]:
        cm = self.api.emulator.get("v1/configmaps", "default", f"{NAME}-progress") or {}
        return ev.parse_lines((cm.get("data") or {}).get(naming.CONFIGMAP_EVENTS_KEY, ""))

    def bucket_events(self) -> list[dict]:
        text = self.s3.read_text(f"{BUCKET}/runs/default/{NAME}/{naming.EVENTS_FILE}")
        return ev.parse_lines(text) if text else []

    def job_log(self) -> str:
        return "\n".join(p.output() for p in self.standin.pods("submitter", alive=False))

    def explain(self) -> str:
        return (f"--- submitter pod ---\n{self.job_log()[-6000:]}\n--- head ---\n"
                + "".join(p.output()[-2000:] for p in self.standin.pods("head", alive=False)))


@pytest.fixture
def cluster(s3_server, runner, tmp_path):
    with running_rbac_emulator() as api:
        c = Cluster(api, s3_server, runner, tmp_path)
        try:
            yield c
        finally:
            c.standin.close()


def test_a_run_succeeds_watch_follows_it_and_the_bucket_has_it(cluster):
    cluster.submit()
    cluster.standin.run(NAME)
    watched = cluster.cli("watch", NAME, "--timeout", WATCH_TIMEOUT)
    assert watched.exit_code == 0, watched.output + cluster.explain()
    assert not cluster.standin.errors
    # watch showed the steps as they came, and the end
    assert "SUCCEEDED" in watched.output
    assert "step 24" in watched.output or "24/24" in watched.output, watched.output
    # progress reached the cluster: the ConfigMap holds the run from its start to its end
    held = [e["type"] for e in cluster.configmap_events()]
    assert held[0] == "run_started" and held[-1] == "run_finished" and "progress" in held, held
    assert not [d for d in cluster.api.emulator.denials() if "configmaps" in d[2]]
    # checkpoints and events are in the bucket, the same story as the ConfigMap's
    objects = cluster.s3.list(f"{BUCKET}/runs/default/{NAME}")
    assert any("/checkpoint_" in o for o in objects), objects
    assert [e["type"] for e in cluster.bucket_events()][-1] == "run_finished"
    status = json.loads(cluster.cli("status", NAME, "-o", "json").output)
    assert status["state"] == "SUCCEEDED" and status["step"] == 24 and not status["progressUnavailable"]
