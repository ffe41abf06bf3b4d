"""A KubeRay stand-in for tests: a rendered RayJob's pods run as local processes.

What KubeRay v1.7 does with a RayJob, and what this does instead (sources: ray-project/kuberay
ray-operator/controllers/ray/common/pod.go `setMissingRayStartParams` and
`generateRayStartCommand`, common/job.go `GetK8sJobCommand`, rayjob_controller.go; read through
the code search available to the session that wrote this):

- The head and each worker run `ray start [--head] <rayStartParams> --block`, with the flags
  KubeRay adds when absent: `--num-cpus` (the container's CPU limit, else its request, as an
  integer: Quantity.Value() rounds up), `--memory` (the memory limit in bytes),
  `--metrics-export-port=8080`, `--dashboard-agent-listen-port=52365`, and on workers
  `--address=<head service>:6379`, all joined into one bash command line (so a value's shell
  quoting applies, as for the documented `resources: '"{\\"name\\": 1}"'`). Here every node is one process group on 127.0.0.1, so the
  fixed ports become free ports, the head service is 127.0.0.1, and all nodes share one short
  `--temp-dir` (unix socket paths must stay under 108 bytes); a pod starts once the one before
  has its sockets (Ray names them "next free" in that shared directory). `--object-store-memory` is what
  Ray derives from the container's memory limit (30 %) when it reads the pod's cgroup.
- Each process gets its container's environment: `value`, `fieldRef` (metadata.name/namespace,
  status.podIP, spec.nodeName), `secretKeyRef`/`configMapKeyRef` and `envFrom` resolved from the
  emulator's Secrets and ConfigMaps; what KubeRay injects (`RAY_CLUSTER_NAME`, and with
  `authOptions.mode: token` `RAY_AUTH_MODE=token` plus `RAY_AUTH_TOKEN` from the Secret it
  creates, named after the RayCluster, key `auth_token`: pod.go `SetContainerTokenAuthEnvVars`);
  and what kubelet sets (`KUBERNETES_SERVICE_HOST`/`_PORT`, pointing at the emulator, and
  `HOSTNAME`). Nothing of the test process's environment leaks in but PATH, the locale and the
  checkout under test on PYTHONPATH (the image's code).
- Only a pod whose template mounts the service-account token (`automountServiceAccountToken`,
  the pod's or else the ServiceAccount's, default true) gets a token file; the token is bound
  to the pod's service account, and the emulator (`RbacEmulator`) allows that token only what
  the namespace's RoleBindings of that account grant (verbs, resources, resourceNames). The
  kubernetes client finds the file through tests/support/standin_pod/sitecustomize.py.
- Volumes: emptyDir is a directory under the pod's root; object storage is moto's S3 server
  (the job reaches it through the Secret its `envFrom` names). PVCs are not mounted: give the
  job an `s3://` storage path.
- The submitter pod runs K8sJobMode's command (job.go): `ray job submit --address
  http://$RAY_DASHBOARD_ADDRESS --submission-id $RAY_JOB_SUBMISSION_ID -- <entrypoint>`,
  preceded by `ray job status` so a restarted submitter follows the job it already submitted,
  then `ray job logs --follow`.
- The RayJob's status moves as rayjob_controller.go moves it: jobDeploymentStatus
  Initializing (rayClusterName, jobId, startTime) -> Running -> Complete | Failed, or Retrying
  and a new cluster while `status.failed` <= backoffLimit; jobStatus mirrors the dashboard's
  (PENDING/RUNNING/SUCCEEDED/FAILED/STOPPED), with rayJobInfo.startTime/endTime; the pods are
  put into the emulator as Running (KubeRay's labels) and removed when the cluster goes
  (shutdownAfterJobFinishes). A killed worker is replaced, as the RayCluster controller does,
  unless the test says the node is gone for good (`kill_pod(..., replace=False)`).
- With `enableInTreeAutoscaling` (an elastic group) the autoscaler is not run: the group starts
  at maxReplicas, what the autoscaler does for Ray Train's demand of its maximum.
- SIGTERM: `signal_pod` sends it to the pod's main process. In a real pod that is PID 1
  (KubeRay's `/bin/bash -lc -- "ulimit ...; ray start ..."`), which the kernel spares any
  signal it has no handler for; here it is `ray start --block`, which drains the node.
  `terminate_pod` ends a Ray pod as kubelet ends a KubeRay pod: the container's preStop exec
  hook (in the container's environment), then kubelet's SIGTERM, which bash as PID 1 never
  receives, so here it is not sent; the pod lives on for the rest of
  terminationGracePeriodSeconds (the template's, default 30), then SIGKILL. (Sending it to
  `ray start` here raced the controller: Ray 2.60's SIGTERM handler drains the node, and a
  drained raylet exits as soon as it is idle, i.e. once the job supervisor has recorded the
  driver's exit; the dashboard went with it, often before the controller's next poll (every
  second) saw the job's end, and the attempt then "failed" because the head was gone, with no
  exit code: a thing KubeRay never sees, and the head-SIGTERM scenario's intermittent failure.)
- A failed job is retried as rayjob_controller.go does while `status.failed` <= backoffLimit:
  the cluster goes, status Retrying, then a new RayCluster (new name, new token) and a new
  submitter with a new submission id; the driver resumes from the storage path's checkpoint.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import secrets
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import aiohttp.web
import kmock

from tests.support.kubelet.env import quantity
from tests.support.kube_emulator import (RAYJOBS, ApiEmulator, Route, _status, _verb,
                                         parse_route, running_emulator)

ADMIN_TOKEN = "test-token"  # Running.kubeconfig's user: the test's own client, not a pod
SITE = Path(__file__).with_name("standin_pod")
#: The checkout under test: the pods' image holds its code (a virtual environment installed
#: from another checkout must not hand the pods that one's `training`).
CHECKOUT = Path(__file__).resolve().parents[2]
ROLES, ROLEBINDINGS = "rbac.authorization.k8s.io/v1/roles", "rbac.authorization.k8s.io/v1/rolebindings"
#: KubeRay's defaults that become free ports here (pod.go, utils/constant.go).
DEFAULT_METRICS_PORT, DEFAULT_AGENT_LISTEN_PORT, GCS_PORT = 8080, 52365, 6379


# --- the API server's side: service-account tokens and the Role --------------------------------

class RbacEmulator(ApiEmulator):
    """ApiEmulator that knows service-account tokens and enforces Roles for them.

    A request with a pod's token is allowed what the namespace's RoleBindings of its service
    account grant through Roles (apiGroups, resources, verbs, resourceNames: with resourceNames
    a rule never covers list, watch or create, as in Kubernetes); anything else is 403 with the
    API server's wording. The test's own token is an admin's; an unknown token is 401."""

    def sa_token(self, namespace: str, account: str) -> str:
        token = f"sa-{namespace}-{account}-{secrets.token_hex(8)}"
        self.__dict__.setdefault("_sa_tokens", {})[token] = (namespace, account)
        return token

    def denials(self) -> list[tuple[str, str, str]]:
        """(user, verb, path) of every request refused so far."""
        return list(self.__dict__.setdefault("_denials", []))

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        token = raw.headers.get("Authorization", "").partition(" ")[2].strip()
        who = self.__dict__.setdefault("_sa_tokens", {}).get(token)
        if who is None and token != ADMIN_TOKEN:  # no token, or one nobody issued
            return _status(401, "Unauthorized", "Unauthorized")
        route = parse_route(raw.path)
        if who is not None and route is not None:
            verb = _verb(raw.method, route, dict(raw.query))
            if not self.allows(who, route, verb):
                user = f"system:serviceaccount:{who[0]}:{who[1]}"
                self.__dict__.setdefault("_denials", []).append((user, verb, raw.path))
                what = f'{route.plural} "{route.name}" is' if route.name else f"{route.plural} is"
                where = f' in the namespace "{route.namespace}"' if route.namespace else ""
                return _status(403, "Forbidden", f'{what} forbidden: User "{user}" cannot {verb} '
                               f'resource "{route.plural}" in API group "{route.group}"{where}')
        return await super()._handle(request)

    def allows(self, who: tuple[str, str], route: Route, verb: str) -> bool:
        namespace, account = who
        if route.namespace != namespace:
            return False  # a Role grants nothing outside its namespace
        with self._tlock:
            bindings = [o for (gvr, ns, _), o in self.store.items() if gvr == ROLEBINDINGS and ns == namespace]
            for binding in bindings:
                if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                           and s.get("namespace", namespace) == namespace
                           for s in binding.get("subjects") or []):
                    continue
                ref = binding.get("roleRef") or {}
                role = self.store.get((ROLES, namespace, ref.get("name"))) if ref.get("kind") == "Role" else None
                for rule in (role or {}).get("rules") or []:
                    if _rule_allows(rule, route, verb):
                        return True
        return False


def _rule_allows(rule: dict, route: Route, verb: str) -> bool:
    def has(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return "*" in values or value in values

    if not (has("apiGroups", route.group) and has("resources", route.plural) and has("verbs", verb)):
        return False
    names = rule.get("resourceNames") or []
    return not names or (route.name is not None and route.name in names)


@contextlib.contextmanager
def running_rbac_emulator(**kwargs: Any) -> Iterator[Any]:
    with running_emulator(emulator=RbacEmulator(), **kwargs) as running:
        yield running


# --- quantities, env, ports -------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_start_args(head: bool, params: dict[str, Any], resources: dict[str, Any],
                   head_address: str, ports: dict[str, int]) -> list[str]:
    """`ray start` as KubeRay builds it (pod.go setMissingRayStartParams, generateRayStartCommand),
    with the machine-wide ports replaced by `ports` (several nodes share this host)."""
    params = {k: str(v) for k, v in params.items()}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    if "num-cpus" not in params:
        cpu = limits.get("cpu") or requests.get("cpu")
        if cpu is not None and quantity(cpu) > 0:
            params["num-cpus"] = str(math.ceil(quantity(cpu)))
    if "memory" not in params and limits.get("memory"):
        params["memory"] = str(int(quantity(limits["memory"])))
    params.setdefault("metrics-export-port", str(DEFAULT_METRICS_PORT))
    params.setdefault("dashboard-agent-listen-port", str(DEFAULT_AGENT_LISTEN_PORT))
    if not head:
        params.setdefault("address", head_address)
    # here, not in KubeRay: the fixed ports would collide between nodes on one host
    params["metrics-export-port"] = str(ports["metrics"])
    params["dashboard-agent-listen-port"] = str(ports["agent"])
    params["dashboard-agent-grpc-port"] = str(ports["agent_grpc"])
    params["runtime-env-agent-port"] = str(ports["runtime_env"])
    params["node-ip-address"] = "127.0.0.1"
    if "memory" in params:  # what Ray derives from the pod's cgroup memory limit
        params.setdefault("object-store-memory", str(int(int(params["memory"]) * 0.3)))
    if head:
        params["port"] = str(ports["gcs"])
        params["dashboard-port"] = str(ports["dashboard"])
        params["ray-client-server-port"] = str(ports["client"])
        params["dashboard-host"] = "127.0.0.1"  # not 0.0.0.0 on a shared test machine
    args = ["ray", "start"] + (["--head"] if head else [])
    # KubeRay joins `--key=value` into the bash command line that starts Ray, so bash's quoting
    # applies: rayStartParams' `resources: '"{\\"slot\\": 1}"'` reaches Ray as {"slot": 1}
    args += [word for k, v in sorted(params.items()) for word in shlex.split(f"--{k}={v}")]
    return args + ["--block"]


def k8s_job_command(dashboard: str, submission_id: str, entrypoint: str) -> str:
    """K8sJobMode's submitter command (KubeRay common/job.go GetK8sJobCommand)."""
    address = f"http://{dashboard}"
    return (f"if ! ray job status --address {address} {submission_id} >/dev/null 2>&1; then "
            f"ray job submit --address {address} --no-wait --submission-id {submission_id} -- "
            f"{entrypoint}; fi; ray job logs --address {address} --follow {submission_id}")


# --- pods -------------------------------------------------------------------------------------

@dataclass
class Pod:
    name: str
    namespace: str
    kind: str  # head | worker | submitter
    group: str
    root: Path
    proc: subprocess.Popen
    log: Path
    replace: bool = True
    #: What kubelet needs to end the pod: the container's env (a preStop exec hook runs in
    #: it), its `lifecycle`, and the pod's terminationGracePeriodSeconds.
    env: dict[str, str] = field(default_factory=dict)
    lifecycle: dict = field(default_factory=dict)
    grace: float = 30.0
    #: `terminate_pod`'s record: the preStop hook's exit code and output.
    prestop: dict = field(default_factory=dict)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Attempt:
    cluster: str
    submission_id: str
    token: str
    ports: dict[str, int]
    pods: list[Pod] = field(default_factory=list)
    outcome: str = ""
    #: The dashboard's message for the job at its end (e.g. the driver's exit code).
    message: str = ""
    #: Ray's state API at the job's end: every actor (class_name, node_id, state) and node.
    actors: list[dict] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)

    def story(self) -> str:
        """What went on in this attempt (for a failing test's message)."""
        out = [f"attempt on {self.cluster}: {self.outcome or 'running'}"]
        for pod in self.pods:
            out.append(f"--- {pod.kind} {pod.name} (exit {pod.proc.poll()}) ---\n{pod.output()[-2500:]}")
        return "\n".join(out)

    def node_of(self, actor_class: str) -> list[dict]:
        """The nodes the actors of `actor_class` ran on."""
        ids = {a.get("node_id") for a in self.actors if a.get("class_name") == actor_class}
        return [n for n in self.nodes if n.get("node_id") in ids]


class KubeRayStandIn:
    """Runs RayJobs put into `emulator` (by `submitter submit`) as local processes.

    `run(name)` drives one RayJob in a thread, to the end; `kill_pod` and `signal_pod` act on
    its pods as a node failure or a preemption would. `close()` stops every process it started."""

    def __init__(self, emulator: RbacEmulator, api_url: str, workdir: Path) -> None:
        self.emu, self.api_port = emulator, int(api_url.rsplit(":", 1)[1])
        # unix sockets live under the temp dir: keep the path short
        self.root = Path(tempfile.mkdtemp(prefix="kr-", dir="/tmp"))
        self.workdir = workdir
        self.attempts: list[Attempt] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self._lock = threading.RLock()
        self._closing = threading.Event()

    # --- the test's handles ------------------------------------------------------------
    def run(self, name: str, namespace: str = "default") -> threading.Thread:
        thread = threading.Thread(target=self._guarded, args=(namespace, name), daemon=True,
                                  name=f"kuberay-{name}")
        thread.start()
        self.threads.append(thread)
        return thread

    def pods(self, kind: str | None = None, alive: bool = True) -> list[Pod]:
        with self._lock:
            current = self.attempts[-1].pods if self.attempts else []
            return [p for p in current if (kind is None or p.kind == kind) and (not alive or p.alive())]

    def kill_pod(self, pod: Pod, *, replace: bool = True) -> None:
        """The node under the pod is gone (SIGKILL to every process of the pod). KubeRay's
        RayCluster controller makes a new pod unless `replace` is False (no capacity left)."""
        pod.replace = replace
        _signal_group(pod.proc, signal.SIGKILL)

    def signal_pod(self, pod: Pod, sig: int = signal.SIGTERM) -> None:
        """kubelet's signal to the pod's container (its main process)."""
        pod.proc.send_signal(sig)

    def terminate_pod(self, pod: Pod) -> None:
        """End the pod as kubelet does (a preemption, a drain, a deleted pod; kubelet
        `killContainer`): run the container's preStop exec hook in the container's environment,
        then SIGTERM to its PID 1 (a Ray pod's is bash, which the kernel spares: nothing
        happens), wait what is left of terminationGracePeriodSeconds, then SIGKILL. Blocks
        until the pod is gone (at the deadline, or when the cluster is torn down before it).
        (kubelet gives a hook still running at the deadline 2 s more; here the hook is cut at
        the deadline.)"""
        deadline = time.monotonic() + pod.grace
        command = ((pod.lifecycle.get("preStop") or {}).get("exec") or {}).get("command")
        if command:
            try:
                done = subprocess.run(command, env=pod.env, cwd=pod.root / "home", capture_output=True,
                                      text=True, timeout=max(deadline - time.monotonic(), 0.1))
                pod.prestop = {"exit": done.returncode, "output": done.stdout + done.stderr}
            except subprocess.TimeoutExpired as e:
                pod.prestop = {"exit": None, "output": f"cut at the grace period: {e.stdout or ''}"}
        if pod.kind == "submitter":  # a Ray pod's PID 1 (bash) never gets kubelet's SIGTERM
            pod.proc.send_signal(signal.SIGTERM)
        try:
            pod.proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            _signal_group(pod.proc, signal.SIGKILL)
            pod.proc.wait(30)

    def close(self) -> None:
        self._closing.set()
        for thread in self.threads:
            thread.join(60)
        with self._lock:
            for attempt in self.attempts:
                self._teardown(attempt)
        _kill_leftovers(self.root)
        if not os.environ.get("STANDIN_KEEP"):  # set it to read the pods' output afterwards
            shutil.rmtree(self.root, ignore_errors=True)

    # --- the controller ----------------------------------------------------------------
    def _guarded(self, namespace: str, name: str) -> None:
        try:
            self._drive(namespace, name)
        except BaseException as e:  # noqa: BLE001 - the test asserts on errors
            self.errors.append(e)
            raise

    def _status(self, namespace: str, name: str, **status: Any) -> None:
        self.emu.patch_status(RAYJOBS, namespace, name, status)

    def _drive(self, namespace: str, name: str) -> None:
        rayjob = self.emu.get(RAYJOBS, namespace, name)
        assert rayjob is not None, f"no RayJob {namespace}/{name}"
        spec = rayjob["spec"]
        failed = 0
        while not self._closing.is_set():
            attempt = self._start_cluster(namespace, name, spec)
            outcome, info = self._follow(namespace, name, spec, attempt)
            attempt.outcome = outcome
            if spec.get("shutdownAfterJobFinishes", False) or outcome != "SUCCEEDED":
                self._teardown(attempt)
            end = {"endTime": _now(), "rayJobInfo": info}
            if outcome == "SUCCEEDED":
                self._status(namespace, name, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED",
                             succeeded=1, **end)
                return
            failed += 1
            if outcome == "closing":
                return
            if failed > int(spec.get("backoffLimit") or 0):
                self._status(namespace, name, jobDeploymentStatus="Failed", jobStatus=outcome,
                             failed=failed, reason="AppFailed",
                             message="Job entrypoint command failed", **end)
                return
            self._status(namespace, name, jobDeploymentStatus="Retrying", jobStatus=outcome,
                         failed=failed)

    def _start_cluster(self, namespace: str, name: str, spec: dict) -> Attempt:
        cluster_spec = spec["rayClusterSpec"]
        cluster = f"{name}-raycluster-{secrets.token_hex(3)[:5]}"
        ports = {k: free_port() for k in ("gcs", "dashboard", "client")}
        attempt = Attempt(cluster, f"{name}-{secrets.token_hex(4)}", secrets.token_hex(16), ports)
        with self._lock:
            self.attempts.append(attempt)
        auth = (cluster_spec.get("authOptions") or {}).get("mode") == "token"
        if auth:  # KubeRay's Secret, named after the RayCluster, key auth_token
            self.emu.put("v1", "secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {
                "name": cluster, "namespace": namespace},
                "data": {"auth_token": base64.b64encode(attempt.token.encode()).decode()}})
        self._status(namespace, name, jobDeploymentStatus="Initializing", jobStatus="",
                     rayClusterName=cluster, jobId=attempt.submission_id, startTime=_now(),
                     dashboardURL=f"127.0.0.1:{ports['dashboard']}")
        head = cluster_spec["headGroupSpec"]
        self._start_pod(namespace, attempt, "head", "headgroup", head["template"],
                        head.get("rayStartParams") or {}, auth)
        self._wait_dashboard(attempt)
        for group in cluster_spec.get("workerGroupSpecs") or []:
            count = int(group.get("replicas", 1))
            if cluster_spec.get("enableInTreeAutoscaling"):
                # the in-tree autoscaler, stood in: Ray Train's elastic group asks for its
                # maximum at once, and the autoscaler adds pods up to maxReplicas for it
                count = int(group.get("maxReplicas", count))
            for _ in range(count):
                self._start_pod(namespace, attempt, "worker", group["groupName"], group["template"],
                                group.get("rayStartParams") or {}, auth)
        return attempt

    def _follow(self, namespace: str, name: str, spec: dict, attempt: Attempt) -> tuple[str, dict]:
        """Start the submitter pod, mirror the dashboard's job status into the RayJob, replace
        lost workers; returns the job's terminal status and rayJobInfo."""
        self._status(namespace, name, jobDeploymentStatus="Running", jobStatus="")
        auth = (spec["rayClusterSpec"].get("authOptions") or {}).get("mode") == "token"
        submitter = self._start_submitter(namespace, name, attempt, spec, auth)
        last, info, unknown_since = "", {}, None
        while True:
            if self._closing.is_set():
                return "closing", info
            job = self._job_info(attempt)
            # a busy dashboard may not answer for a while: KubeRay keeps asking
            unknown_since = None if job is not None else (unknown_since or time.monotonic())
            status = (job or {}).get("status", "")
            if job and job.get("start_time"):
                info = {"startTime": _ms(job["start_time"])}
                if job.get("end_time"):
                    info["endTime"] = _ms(job["end_time"])
            if status and status != last:
                self._status(namespace, name, jobStatus=status, rayJobInfo=info)
                last = status
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                attempt.message = str((job or {}).get("message") or "")
                submitter.proc.wait(60)
                attempt.actors, attempt.nodes = self._state(attempt, "actors"), self._state(attempt, "nodes")
                return status, info
            if not submitter.alive() and submitter.proc.returncode != 0 and unknown_since is not None \
                    and time.monotonic() - unknown_since > 120:
                return "FAILED", info  # the submitter failed and the dashboard knows no job
            if not attempt.pods[0].alive():  # the head is gone: the job with it
                attempt.message = "(the head pod was gone before the job's end was seen)"
                return "FAILED", info
            self._replace_lost_workers(namespace, spec, attempt, auth)
            time.sleep(1.0)

    def _replace_lost_workers(self, namespace: str, spec: dict, attempt: Attempt, auth: bool) -> None:
        for group in spec["rayClusterSpec"].get("workerGroupSpecs") or []:
            for pod in [p for p in attempt.pods if p.kind == "worker" and p.group == group["groupName"]]:
                if not pod.alive() and pod.replace:
                    pod.replace = False  # replaced once
                    self.emu.remove("v1/pods", namespace, pod.name)
                    self._start_pod(namespace, attempt, "worker", group["groupName"], group["template"],
                                    group.get("rayStartParams") or {}, auth)
                elif not pod.alive() and self.emu.get("v1/pods", namespace, pod.name) is not None:
                    self.emu.remove("v1/pods", namespace, pod.name)

    def _job_info(self, attempt: Attempt) -> dict | None:
        url = f"http://127.0.0.1:{attempt.ports['dashboard']}/api/jobs/{attempt.submission_id}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {attempt.token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _state(self, attempt: Attempt, what: str) -> list[dict]:
        """Ray's state API (`ray list actors|nodes`) on the head's dashboard, before teardown."""
        url = f"http://127.0.0.1:{attempt.ports['dashboard']}/api/v0/{what}?limit=1000&detail=1"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {attempt.token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())["data"]["result"]["result"]
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return []

    def _wait_dashboard(self, attempt: Attempt, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{attempt.ports['dashboard']}/api/version"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {attempt.token}"})
        while time.monotonic() < deadline:
            if not attempt.pods[0].alive():
                raise RuntimeError(f"the head pod exited:\n{attempt.pods[0].output()[-3000:]}")
            try:
                with urllib.request.urlopen(request, timeout=5):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(1.0)
        raise TimeoutError(f"the head's dashboard did not answer in {timeout:.0f}s:\n"
                           f"{attempt.pods[0].output()[-3000:]}")

    # --- one pod ----------------------------------------------------------------------
    def _start_pod(self, namespace: str, attempt: Attempt, kind: str, group: str, template: dict,
                   params: dict, auth: bool) -> Pod:
        suffix = secrets.token_hex(3)[:5]
        name = f"{attempt.cluster}-head-{suffix}" if kind == "head" else f"{attempt.cluster}-{group}-worker-{suffix}"
        pod_spec = template.get("spec") or {}
        container = pod_spec["containers"][0]
        injected = {"RAY_CLUSTER_NAME": attempt.cluster, "RAY_USAGE_STATS_KUBERAY_IN_USE": "1"}
        if kind == "head":
            injected["RAY_ADDRESS"] = f"127.0.0.1:{attempt.ports['gcs']}"
        if auth:
            injected.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=attempt.token)
        if kind == "worker":
            ports = {"metrics": free_port(), "agent": free_port(), "agent_grpc": free_port(),
                     "runtime_env": free_port()}
        else:
            ports = {**attempt.ports, "metrics": free_port(), "agent": free_port(),
                     "agent_grpc": free_port(), "runtime_env": free_port()}
        args = ray_start_args(kind == "head", params, container.get("resources") or {},
                              f"127.0.0.1:{attempt.ports['gcs']}", ports)
        args.insert(-1, f"--temp-dir={self.root / 'ray'}")
        sockets = self._sockets()
        pod = self._spawn(namespace, attempt, name, kind, group, template, container, injected, args)
        # here, not in KubeRay: nodes sharing one temp dir each pick "the next free" socket
        # name (Ray's node.py _make_inc_temp, no lock), so two pods starting at once took the
        # same one ("bind: Address already in use") and one node never came up. Until its
        # raylet has both its sockets, the next pod waits (on a host of its own, a pod never races).
        deadline = time.monotonic() + 120
        while pod.alive() and len(self._sockets() - sockets) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        return pod

    def _sockets(self) -> set[str]:
        """The raylet and plasma sockets of every node started so far (one shared session)."""
        return {os.path.realpath(p) for pattern in ("plasma_store*", "raylet*")
                for p in (self.root / "ray").glob(f"session_*/sockets/{pattern}")}

    def _start_submitter(self, namespace: str, job: str, attempt: Attempt, spec: dict, auth: bool) -> Pod:
        template = spec.get("submitterPodTemplate") or {"spec": {"containers": [{"name": "ray-job-submitter"}]}}
        container = template["spec"]["containers"][0]
        injected = {"RAY_DASHBOARD_ADDRESS": f"127.0.0.1:{attempt.ports['dashboard']}",
                    "RAY_JOB_SUBMISSION_ID": attempt.submission_id, "PYTHONUNBUFFERED": "1"}
        if auth:
            injected.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=attempt.token)
        command = k8s_job_command(injected["RAY_DASHBOARD_ADDRESS"], attempt.submission_id, spec["entrypoint"])
        name = f"{job}-{secrets.token_hex(3)[:5]}"  # the submitter Job is named after the RayJob
        return self._spawn(namespace, attempt, name, "submitter", "submitter", template, container, injected,
                           ["bash", "-c", command])

    def _spawn(self, namespace: str, attempt: Attempt, name: str, kind: str, group: str, template: dict,
               container: dict, injected: dict[str, str], args: list[str]) -> Pod:
        root = self.root / "pods" / name
        (root / "home").mkdir(parents=True)
        pod_spec = template.get("spec") or {}
        account = pod_spec.get("serviceAccountName") or "default"
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
               "LANG": os.environ.get("LANG", "C.UTF-8"), "HOME": str(root / "home"),
               "HOSTNAME": name, "PYTHONPATH": os.pathsep.join([str(SITE), str(CHECKOUT)]),
               "STANDIN_POD_ROOT": str(root),
               "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.api_port),
               "KUBERNETES_SERVICE_PORT_HTTPS": str(self.api_port)}
        env.update(injected)
        env.update(self._container_env(namespace, name, container))
        if self._mounts_token(namespace, pod_spec, account):
            mount = root / "var/run/secrets/kubernetes.io/serviceaccount"
            mount.mkdir(parents=True)
            (mount / "token").write_text(self.emu.sa_token(namespace, account))
            (mount / "ca.crt").write_text("not used: the emulator speaks http\n")
            (mount / "namespace").write_text(namespace)
        for volume in pod_spec.get("volumes") or []:
            if "emptyDir" in volume:
                (root / "volumes" / volume["name"]).mkdir(parents=True)
        log = root / "output.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, env=env, cwd=root / "home", stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        pod = Pod(name, namespace, kind, group, root, proc, log, env=env,
                  lifecycle=container.get("lifecycle") or {},
                  grace=float(pod_spec.get("terminationGracePeriodSeconds", 30)))
        with self._lock:
            attempt.pods.append(pod)
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        if kind == "submitter":
            job = name.rsplit("-", 1)[0]
            labels.update({"batch.kubernetes.io/job-name": job, "job-name": job})
        else:
            labels.update({"ray.io/cluster": attempt.cluster, "ray.io/node-type": kind,
                           "ray.io/group": group, "ray.io/is-ray-node": "yes"})
        self.emu.put("v1", "pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": namespace, "labels": labels},
            "spec": {"serviceAccountName": account, "containers": [
                {"name": container.get("name", kind), "image": container.get("image") or "local"}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": container.get("name", kind), "ready": True, "restartCount": 0,
                                       "image": container.get("image") or "local",
                                       "state": {"running": {"startedAt": _now()}}}]}})
        return pod

    def _mounts_token(self, namespace: str, pod_spec: dict, account: str) -> bool:
        if "automountServiceAccountToken" in pod_spec:
            return bool(pod_spec["automountServiceAccountToken"])
        sa = self.emu.get("v1/serviceaccounts", namespace, account) or {}
        return bool(sa.get("automountServiceAccountToken", True))

    def _container_env(self, namespace: str, pod_name: str, container: dict) -> dict[str, str]:
        """The container's env and envFrom, resolved as kubelet resolves them."""
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "secretRef" in source:
                env.update({prefix + k: v for k, v in self._secret(namespace, source["secretRef"]["name"]).items()})
            if "configMapRef" in source:
                cm = self.emu.get("v1/configmaps", namespace, source["configMapRef"]["name"]) or {}
                env.update({prefix + k: v for k, v in (cm.get("data") or {}).items()})
        fields = {"metadata.name": pod_name, "metadata.namespace": namespace, "status.podIP": "127.0.0.1",
                  "spec.nodeName": "standin-node", "status.hostIP": "127.0.0.1"}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            ref = item.get("valueFrom") or {}
            if "fieldRef" in ref:
                env[item["name"]] = fields[ref["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in ref:
                key = ref["secretKeyRef"]
                env[item["name"]] = self._secret(namespace, key["name"])[key["key"]]
            elif "configMapKeyRef" in ref:
                key = ref["configMapKeyRef"]
                cm = self.emu.get("v1/configmaps", namespace, key["name"]) or {}
                env[item["name"]] = (cm.get("data") or {})[key["key"]]
        return env

    def _secret(self, namespace: str, name: str) -> dict[str, str]:
        secret = self.emu.get("v1/secrets", namespace, name)
        if secret is None:  # kubelet: CreateContainerConfigError
            raise RuntimeError(f'secret "{name}" not found (the pod could not start)')
        out = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        out.update(secret.get("stringData") or {})
        return out

    def _teardown(self, attempt: Attempt) -> None:
        for pod in reversed(attempt.pods):
            if pod.alive():
                _signal_group(pod.proc, signal.SIGTERM)
        for pod in attempt.pods:
            try:
                pod.proc.wait(15)
            except subprocess.TimeoutExpired:
                _signal_group(pod.proc, signal.SIGKILL)
                pod.proc.wait(10)
            if self.emu.get("v1/pods", pod.namespace, pod.name) is not None:
                self.emu.remove("v1/pods", pod.namespace, pod.name)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _kill_leftovers(root: Path) -> None:
    """Every process that still carries this stand-in's pod root in its environment (a Ray
    worker that left its pod's process group): ours, found by id, killed one by one."""
    mark = f"STANDIN_POD_ROOT={root}/".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if mark in environ:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ms(value: Any) -> str:
    return datetime.fromtimestamp(int(value) / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
