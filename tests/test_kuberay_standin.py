"""The rendered RayJob, run as KubeRay runs it: real `ray start` processes for its pods, the
K8sJobMode submitter's `ray job submit`, the Role enforced on the pods' token, a bucket for the
checkpoints (tests/support/kuberay_standin.py says what stands in for what).

Each scenario is one small real run (tiny model, one worker pod, a few dozen steps): slow, so
marked `slow`, and lean enough for CI.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from submitter.cli import main
from submitter.contract import events as ev
from submitter.contract import naming
from tests.support.kube_emulator import RAYJOBS
from tests.support.kuberay_standin import KubeRayStandIn, running_rbac_emulator
from tests.support.polling import wait_for

pytestmark = pytest.mark.slow

NAME = "standin"
BUCKET = "bkt"
#: Guards against a hang only; a run takes about a minute on a quiet 2-core machine. Under
#: pytest's 600 s limit, so that a hang fails with the attempt's story (every pod's output)
#: rather than a bare timeout.
WATCH_TIMEOUT = "8m"


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
        return "\n".join(p.output() for a in self.standin.attempts for p in a.pods if p.kind == "submitter")

    def explain(self) -> str:
        return "\n".join(a.story() for a in self.standin.attempts)


@pytest.fixture
def cluster(s3_server, runner, tmp_path):
    with running_rbac_emulator() as api:
        c = Cluster(api, s3_server, runner, tmp_path)
        try:
            yield c
        finally:
            c.standin.close()


def rayjob_status(cluster) -> dict:
    return (cluster.api.emulator.get(RAYJOBS, "default", NAME) or {}).get("status") or {}


def http(url: str, token: str | None = None, method: str = "GET", body: dict | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/merge-patch+json"
    request = urllib.request.Request(url, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def check_the_tokens(cluster) -> None:
    """While the job runs: Ray's dashboard refuses a client without the token that authOptions
    made KubeRay inject; the API server gives the head's service-account token what the Role
    says and nothing more, and refuses a client with no token at all."""
    attempt = cluster.standin.attempts[-1]
    dashboard = f"http://127.0.0.1:{attempt.ports['dashboard']}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")  # the venv's, activated or not
    refused = subprocess.run([ray_cli, "job", "list", "--address", dashboard], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0, refused.stdout
    assert "401" in refused.stdout + refused.stderr or "auth" in (refused.stdout + refused.stderr).lower()
    assert http(f"{dashboard}/api/jobs/", attempt.token) == 200
    assert http(f"{dashboard}/api/jobs/") == 401
    head = cluster.standin.pods("head")[0]
    token = (head.root / "var/run/secrets/kubernetes.io/serviceaccount/token").read_text()
    api = f"{cluster.api.url}/api/v1/namespaces/default"
    assert http(f"{api}/configmaps/{NAME}-progress", token) == 200
    assert http(f"{api}/configmaps/{NAME}-progress", token, "PATCH", {"metadata": {"labels": {"x": "y"}}}) == 200
    assert http(f"{api}/secrets/s3-creds", token) == 403           # not in the Role
    assert http(f"{api}/configmaps", token) == 403                  # resourceNames: no list
    assert http(f"{api}/configmaps/other", token) == 403            # another object
    assert http(f"{cluster.api.url}/apis/ray.io/v1/namespaces/default/rayjobs/{NAME}", token) == 403
    assert http(f"{api}/configmaps/{NAME}-progress") == 401         # no token at all
    for worker in cluster.standin.pods("worker"):                   # the template mounts none
        assert not (worker.root / "var/run/secrets").exists()


def test_a_run_succeeds_watch_follows_it_and_the_bucket_has_it(cluster):
    """Also: the dashboard and the API server refuse clients without the token, and the
    progress sink ran on the head, the one pod with the service-account token."""
    cluster.submit()
    cluster.standin.run(NAME)
    wait_for("the job running", lambda: rayjob_status(cluster).get("jobStatus") == "RUNNING")
    check_the_tokens(cluster)
    watched = cluster.cli("watch", NAME, "--timeout", WATCH_TIMEOUT)
    assert watched.exit_code == 0, watched.output + cluster.explain()
    assert not cluster.standin.errors
    # watch showed the steps as they came, and the end
    assert "SUCCEEDED" in watched.output
    assert "step 24" in watched.output or "24/24" in watched.output, watched.output
    # progress reached the cluster: the ConfigMap holds the run from its start to its end
    held = [e["type"] for e in cluster.configmap_events()]
    assert held[0] == "run_started" and held[-1] == "run_finished" and "progress" in held, held
    assert not [d for d in cluster.api.emulator.denials() if d[2].endswith(f"/configmaps/{NAME}-progress")]
    # checkpoints and events are in the bucket, the same story as the ConfigMap's
    objects = cluster.s3.list(f"{BUCKET}/runs/default/{NAME}")
    assert any("/checkpoint_" in o for o in objects), objects
    assert [e["type"] for e in cluster.bucket_events()][-1] == "run_finished"
    # TensorBoard's event files are in the bucket too, up to the last step (#20)
    from training.events.trackers import event_file_steps, read_event_files

    files = read_event_files(f"s3://{BUCKET}/runs/default/{NAME}/tensorboard")
    last: dict[str, int] = {}
    for data in files:
        for tag, step in event_file_steps(data).items():
            last[tag] = max(step, last.get(tag, step))
    assert files and last.get("train/loss") == 24 and "val/loss" in last, (last, objects)
    status = json.loads(cluster.cli("status", NAME, "-o", "json").output)
    assert status["state"] == "SUCCEEDED" and status["step"] == 24 and not status["progressUnavailable"]
    assert_sink_on_the_head(cluster)


def assert_sink_on_the_head(cluster) -> None:
    """Where the ConfigMap writer ran, from Ray's own state API: the head, every attempt."""
    for attempt in cluster.standin.attempts:
        nodes = attempt.node_of("RunEmitter")
        assert nodes and all(n.get("is_head_node") for n in nodes), (attempt.actors, attempt.nodes)
    assert "progress unavailable:" not in cluster.job_log()


def test_a_head_without_the_token_says_so_once_and_status_says_why(cluster, monkeypatch):
    """The negative of the above, so the checks cannot pass vacuously: the head's template does
    not mount the token. The sink says so once in the job's log, the run still trains and
    succeeds, and `status` says that progress is unavailable and why."""
    from submitter import state

    monkeypatch.setattr(state, "PROGRESS_GRACE", 0.0)
    cluster.submit(max_steps_per_epoch=8, checkpoint_every=4)
    job = cluster.api.emulator.get(RAYJOBS, "default", NAME)
    cluster.api.emulator.merge(RAYJOBS, "default", NAME, {"spec": {"rayClusterSpec": {"headGroupSpec": {
        "template": {**job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"],
                     "spec": {**job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"],
                              "automountServiceAccountToken": False}}}}}})
    cluster.standin.run(NAME)
    wait_for("the job running", lambda: rayjob_status(cluster).get("rayJobInfo", {}).get("startTime")
             and rayjob_status(cluster).get("jobStatus") == "RUNNING")
    said = wait_for("the sink's line in the job's log",
                    lambda: [line for line in cluster.job_log().splitlines() if "progress unavailable:" in line])
    running = cluster.cli("status", NAME)
    assert "warning: progress unavailable: running for" in running.output, running.output
    watched = cluster.cli("watch", NAME, "--timeout", WATCH_TIMEOUT)
    assert watched.exit_code == 0, watched.output + cluster.explain()
    lines = [line for line in cluster.job_log().splitlines() if "progress unavailable:" in line]
    assert len(lines) == 1 and lines == said[:1], lines
    assert "no service-account token in this pod" in lines[0]
    assert cluster.configmap_events() == []  # nothing reached the cluster...
    assert [e["type"] for e in cluster.bucket_events()][-1] == "run_finished"  # ...the bucket has it


def in_background(fn) -> tuple[threading.Thread, list]:
    errors: list = []

    def guarded():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    thread = threading.Thread(target=guarded, daemon=True)
    thread.start()
    return thread, errors


def watch_while(cluster, action, join_s: float = 60):
    """`submitter watch` the job while `action` (a pod's loss, a preemption) runs beside it:
    the action must not raise and watch must end with exit 0."""
    thread, errors = in_background(action)
    watched = cluster.cli("watch", NAME, "--timeout", WATCH_TIMEOUT)
    thread.join(join_s)
    assert not errors, errors
    assert watched.exit_code == 0, watched.output + cluster.explain()
    return watched


def first_checkpoint(cluster) -> dict | None:
    saved = [e for e in cluster.configmap_events() if e["type"] == "checkpoint_saved"]
    return saved[0] if saved else None


def configmap_state(cluster) -> dict:
    """The folded progress state the sink keeps in the ConfigMap (world_size: workers training now)."""
    cm = cluster.api.emulator.get("v1/configmaps", "default", f"{NAME}-progress") or {}
    return json.loads((cm.get("data") or {}).get(naming.CONFIGMAP_STATE_KEY) or "{}")


def pods_hosting(cluster, *titles: str) -> set[str]:
    """The stand-in pods whose processes include a Ray process titled with one of `titles`
    (each pod is one process group, as each real pod is one node)."""
    groups = {_pgid(pid) for pid in os.listdir("/proc") if pid.isdigit()
              and _cmdline(pid).startswith(titles)}
    return {p.name for p in cluster.standin.pods() if p.proc.pid in groups}


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # gone meanwhile
        return ""


def _pgid(pid: str) -> int:
    try:
        return os.getpgid(int(pid))
    except OSError:  # gone meanwhile
        return -1


def test_an_elastic_group_loses_a_pod_shrinks_and_watch_shows_the_resize(cluster):
    """--replicas 1:2 (the stand-in's autoscaler starts both pods): one worker pod is lost for
    good after a checkpoint of the two workers, the group restarts with the one pod left and one worker
    (its one train slot: before the slots, two workers packed onto it took Ray Data's CPU and
    the run hung), training goes on from the checkpoint, and `watch` shows the resize."""
    cluster.submit(replicas="1:2", max_steps_per_epoch=120, checkpoint_every=15, progress_every=5)
    cluster.standin.run(NAME)
    lost: list = []

    def checkpoints() -> list[dict]:
        return [e for e in cluster.configmap_events() if e["type"] == "checkpoint_saved"]

    def lose_a_pod_after_a_checkpoint_of_two_workers():
        # a pod slow to join (this machine is shared) can make the group start with one
        # worker: wait until two train, then for a checkpoint they made
        wait_for("two workers training", lambda: configmap_state(cluster).get("world_size") == 2)
        made = len(checkpoints())
        wait_for("a checkpoint of two workers", lambda: len(checkpoints()) > made)
        workers = wait_for("two worker pods", lambda: len(cluster.standin.pods("worker")) == 2
                           and cluster.standin.pods("worker"))
        # in a RayJob the driver's actors live on the head; here Ray may put the zero-CPU
        # controller on a worker pod: lose one without it (the group's loss is what is tested)
        keep = pods_hosting(cluster, "ray::TrainController", "ray::RunEmitter")
        victim = next(p for p in reversed(workers) if p.name not in keep)
        cluster.standin.kill_pod(victim, replace=False)  # no node left to replace it
        lost.append(victim.name)

    watched = watch_while(cluster, lose_a_pod_after_a_checkpoint_of_two_workers)
    assert lost
    events = cluster.configmap_events()
    types = [e["type"] for e in events]
    # (a group that started with one worker because a pod joined late grew first: 1 -> 2)
    shrunk = [e for e in events if e["type"] == "worker_group_resized" and (e["from"], e["to"]) == (2, 1)]
    assert shrunk, types
    saved = [e for e in events if e["type"] == "checkpoint_saved" and e["seq"] < shrunk[0]["seq"]]
    assert saved and shrunk[0]["resumed_from"] == saved[-1]["path"], (shrunk[0], saved)
    after = [e for e in events if e["type"] == "progress" and e["seq"] > shrunk[0]["seq"]]
    assert after and saved[-1]["step"] < after[0]["step"], (saved[-1], after[:1])  # not from 0
    assert "worker group resized: 2 -> 1 worker(s)" in watched.output, watched.output
    assert types[-1] == "run_finished" and "SUCCEEDED" in watched.output
    status = json.loads(cluster.cli("status", NAME, "-o", "json").output)
    assert status["state"] == "SUCCEEDED" and status["step"] == 120, status
    assert len(cluster.standin.attempts) == 1, cluster.explain()  # Ray Train shrank: no RayJob retry
    assert_sink_on_the_head(cluster)


def preempt_while_training(cluster, kind: str, join_s: float):
    """Watch the job while its first `kind` pod, once the run trains (step 5), is ended as
    kubelet ends a pod (preStop, SIGTERM to PID 1, grace, SIGKILL). Returns (watch, the pod)."""
    ended: list = []

    def preempt():
        wait_for("training", lambda: [e for e in cluster.configmap_events()
                                      if e["type"] == "progress" and e["step"] >= 5])
        pod = cluster.standin.pods(kind)[0]
        cluster.standin.terminate_pod(pod)
        ended.append(pod)

    watched = watch_while(cluster, preempt, join_s=join_s)
    assert ended
    return watched, ended[0]


def test_sigterm_to_the_head_pod_checkpoints_and_the_rayjob_retry_resumes_there(cluster):
    """A preemption of the head pod, ended as kubelet ends a pod: the rendered preStop hook
    SIGTERMs the driver, the workers write a preemption checkpoint, the driver exits 143, the
    RayJob's retry (backoffLimit 1) starts a new cluster and resumes at that step."""
    cluster.submit(max_steps_per_epoch=100, checkpoint_every=40, progress_every=5)
    cluster.standin.run(NAME)
    _, head = preempt_while_training(cluster, "head", join_s=300)
    first, second = cluster.standin.attempts[0], cluster.standin.attempts[-1]
    assert len(cluster.standin.attempts) == 2 and first.outcome == "FAILED", cluster.explain()
    assert "143" in first.message, first.message  # the driver's "preempted, retry me"
    events = cluster.bucket_events()
    preempted = [e for e in events if e["type"] == "checkpoint_saved" and e.get("reason") == "preemption"]
    assert len(preempted) == 1, [(e["type"], e.get("reason"), e.get("step")) for e in events]
    failed = [e for e in events if e["type"] == "run_failed"]
    assert failed and failed[0].get("reason") == "preemption", failed
    resumed = [e for e in events if e["type"] == "run_resumed"]
    assert resumed and resumed[-1]["resumed_from"] == preempted[0]["path"], (resumed, preempted)
    assert resumed[-1]["step"] == preempted[0]["step"]  # nothing redone but the step in flight
    assert [e["type"] for e in events][-1] == "run_finished"
    status = rayjob_status(cluster)
    assert (status["jobDeploymentStatus"], status["failed"]) == ("Complete", 1)
    assert second.cluster != first.cluster
    # the rendered preStop hook did it: it found the driver in the head pod (and only there),
    # and left the head's node undrained
    assert "SIGTERM to 1 training process" in head.prestop.get("output", ""), head.prestop
    assert "Ray node not drained (the head pod" in head.prestop.get("output", ""), head.prestop
    # the driver's output outlives both clusters: each session's, from the bucket (#26)
    kept = cluster.cli("logs", NAME)
    assert kept.exit_code == 0 and "the run's stored logs at s3://" in kept.stderr, kept.output
    assert kept.stdout.count("=== driver session ") == 2 and "SUBMITTER_EVENT" in kept.stdout


def test_sigterm_to_a_worker_pod_checkpoints_and_ray_train_resumes_there(cluster):
    """A worker pod's preemption, ended as kubelet ends a KubeRay pod: the preStop hook drains
    the pod's Ray node and SIGTERMs its Ray Train worker (not the driver: it runs on the head),
    the workers write a preemption checkpoint and leave retryably, and Ray Train restarts the
    group from that step once, on the replacement pod (the pod, whose bash PID 1 never gets
    kubelet's SIGTERM, is SIGKILLed at the grace period's end), not on the drained node; the
    job succeeds without a RayJob retry. Before the drain the group restarted on the dying
    pod first and was SIGKILLed there: a second restart, and once in five runs a hang."""
    # no interval checkpoints: a preemption at one's step would be saved as that one
    cluster.submit(max_steps_per_epoch=100, checkpoint_every=0, progress_every=5,
                   termination_grace_period=30)
    cluster.standin.run(NAME)
    watched, worker = preempt_while_training(cluster, "worker", join_s=120)
    # the rendered preStop hook drained the pod's node, and found its Ray Train worker, only it
    assert "Ray node drained" in worker.prestop.get("output", ""), worker.prestop
    assert "SIGTERM to 1 training process" in worker.prestop.get("output", ""), worker.prestop
    events = cluster.bucket_events()
    types = [e["type"] for e in events]
    preempted = [e for e in events if e["type"] == "checkpoint_saved" and e.get("reason") == "preemption"]
    assert len(preempted) == 1, [(e["type"], e.get("reason"), e.get("step")) for e in events]
    restarts = [e for e in events if e["type"] == "worker_group_restarted" and e["seq"] > preempted[0]["seq"]]
    assert len(restarts) == 1 and restarts[0]["resumed_from"] == preempted[0]["path"], (restarts, preempted)
    after = [e for e in events if e["type"] == "progress" and e["seq"] > restarts[0]["seq"]]
    assert after and preempted[0]["step"] < after[0]["step"] <= preempted[0]["step"] + 5, after[:1]
    assert "run_failed" not in types and types[-1] == "run_finished", types  # the driver went on
    assert "worker group restarted" in watched.output and "SUCCEEDED" in watched.output
    assert len(cluster.standin.attempts) == 1, cluster.explain()  # Ray Train recovered: no RayJob retry
    # the worker's error outlives the cluster, in the run's stored logs (#26)
    kept = cluster.cli("logs", NAME)
    assert "--- worker-0.err.log ---" in kept.stdout and "preempted (SIGTERM) at step" in kept.stdout, kept.output


def test_your_own_script_ships_in_a_configmap_or_the_bucket_and_resumes_after_a_worker_pod_loss(
        cluster, tmp_path):
    """`--script`: the code travels as a cluster gets it. A TorchTrainer script in the job's
    code ConfigMap (read by the head with the Role's `get`): its reports are the run's events,
    with its own metric names; a lost worker pod resumes it from its last checkpoint. Then a
    Ray Data script whose working directory is too large for a ConfigMap: the bundle goes to
    the run's bucket, and the pods take it from there."""
    from submitter.contract import code

    scripts = Path(__file__).parent / "scripts"
    cluster.submit(script=str(scripts / "torch_regression.py"), working_dir=str(scripts),
                   script_args=["--epochs", "12", "--sleep", "1"])
    assert cluster.api.emulator.get("v1/configmaps", "default", f"{NAME}-code") is not None
    cluster.standin.run(NAME)
    killed: list = []

    def kill_after_the_first_checkpoint():
        wait_for("a checkpoint", lambda: first_checkpoint(cluster))
        worker = cluster.standin.pods("worker")[0]
        cluster.standin.kill_pod(worker)
        killed.append(worker.name)

    watched = watch_while(cluster, kill_after_the_first_checkpoint)
    assert killed and "mse" in watched.output  # the script's own metrics, in watch
    events = cluster.configmap_events()
    restarts = [e for e in events if e["type"] == "worker_group_restarted"]
    assert restarts, [e["type"] for e in events]
    saved = [e for e in events if e["type"] == "checkpoint_saved" and e["seq"] < restarts[0]["seq"]]
    assert saved and restarts[0]["resumed_from"] == saved[-1]["path"]
    after = [e for e in events if e["type"] == "progress" and e["seq"] > restarts[0]["seq"]]
    assert after and after[0]["epoch"] > 0 and not after[0].get("from_scratch")  # not from 0
    assert [e["type"] for e in cluster.bucket_events()][-1] == "run_finished"
    record = json.loads(cluster.s3.read_text(f"{BUCKET}/runs/default/{NAME}/run.json"))
    assert record["code"]["entry"] == "torch_regression.py"
    for attempt in cluster.standin.attempts:  # the hub (ConfigMap writer) ran on the head
        nodes = attempt.node_of("ScriptHub")
        assert nodes and all(n.get("is_head_node") for n in nodes), attempt.actors
    # the script's driver output and the lost workers' errors outlive the pods, in the bucket,
    # as the GPT-2 job's do (#33)
    kept = cluster.cli("logs", NAME)
    assert kept.exit_code == 0 and "the run's stored logs at s3://" in kept.stderr, kept.output
    assert kept.stdout.count("=== driver session ") == len(cluster.standin.attempts)
    assert "script: torch_regression.py" in kept.stdout and "final loss" in kept.stdout
    assert "worker error log(s)" in kept.stderr and ".err.log ---" in kept.stdout, kept.output

    big = tmp_path / "project"
    big.mkdir()
    (big / "ray_data_mean.py").write_text((scripts / "ray_data_mean.py").read_text())
    (big / "weights.bin").write_bytes(os.urandom(code.CONFIGMAP_LIMIT + 1024))
    job = yaml.safe_load(Path(job_file(tmp_path)).read_text())
    job.update(name="standin-big", script=str(big / "ray_data_mean.py"), script_args=["2"])
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(job))
    submitted = cluster.cli("submit", "-f", str(tmp_path / "big.yaml"))
    assert submitted.exit_code == 0 and "uploaded to s3://" in submitted.output, submitted.output
    assert cluster.api.emulator.get("v1/configmaps", "default", "standin-big-code") is None
    cluster.standin.run("standin-big")
    watched = cluster.cli("watch", "standin-big", "--timeout", WATCH_TIMEOUT)
    assert watched.exit_code == 0, watched.output + cluster.explain()
    text = cluster.s3.read_text(f"{BUCKET}/runs/default/standin-big/{naming.EVENTS_FILE}")
    progress = [e for e in ev.parse_lines(text or "") if e["type"] == "progress"]
    assert [e["epoch"] for e in progress] == [0, 1] and "estimate" in progress[-1]["metrics"]
    kept = cluster.cli("logs", "standin-big")
    assert "1 driver session(s), 0 worker error log(s)" in kept.stderr, kept.output
    assert "script: ray_data_mean.py" in kept.stdout and "run_finished" in kept.stdout
    assert any(o.endswith(".zip") for o in cluster.s3.list(f"{BUCKET}/runs/default/standin-big/code"))
