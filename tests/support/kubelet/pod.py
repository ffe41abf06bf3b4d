"""One pod on the process kubelet: its sandbox (network namespace, files), its containers as
processes (each PID 1 of a PID namespace of its own, in a private mount and UTS namespace), its
probes, restarts and status, and its end."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tests.support.kubelet.api import Api, ApiError
from tests.support.kubelet.env import ConfigError, Sources, container_env, expand
from tests.support.kubelet.volumes import NotReady, materialize

ENTER = Path(__file__).with_name("enter.py")
log = logging.getLogger("kubelet.pod")
#: What the project's Dockerfile puts in its image, here taken from the checkout and this
#: machine (every `image:` maps to it).
IMAGE_HOME = "/home/ray"


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeContext:
    """What every pod of the node shares."""
    api: Api
    name: str
    host_ip: str
    api_port: int
    bridge: str
    domain: str
    root: Path
    python_bin: Path
    capacity: dict[str, str]
    image_files: dict[str, Path] = field(default_factory=dict)
    image_env: dict[str, str] = field(default_factory=dict)
    _ips: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def allocate_ip(self) -> str:
        prefix = self.host_ip.rsplit(".", 1)[0]
        with self._lock:
            for last in range(2, 255):
                ip = f"{prefix}.{last}"
                if ip not in self._ips:
                    self._ips.add(ip)
                    return ip
        raise RuntimeError("the node's pod CIDR is full")

    def release_ip(self, ip: str) -> None:
        with self._lock:
            self._ips.discard(ip)


def sh(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")


class Probe:
    """One probe of a container, with its timing and thresholds."""

    def __init__(self, spec: dict, kind: str) -> None:
        self.spec, self.kind = spec, kind
        self.period = float(spec.get("periodSeconds", 10))
        self.timeout = float(spec.get("timeoutSeconds", 1))
        self.success_threshold = int(spec.get("successThreshold", 1))
        self.failure_threshold = int(spec.get("failureThreshold", 3))
        self.next_at = 0.0
        self.successes = self.failures = 0
        self.initial_delay = float(spec.get("initialDelaySeconds", 0))

    def due(self, started: float) -> bool:
        moment = time.monotonic()
        if moment < started + self.initial_delay or moment < self.next_at:
            return False
        self.next_at = moment + self.period
        return True

    def record(self, ok: bool) -> str | None:
        """'success' or 'failure' when a threshold is crossed, else None."""
        if ok:
            self.failures, self.successes = 0, self.successes + 1
            return "success" if self.successes >= self.success_threshold else None
        self.successes, self.failures = 0, self.failures + 1
        return "failure" if self.failures >= self.failure_threshold else None


class Container(threading.Thread):
    """A container: starts its process, runs its probes, restarts it as the policy says."""

    def __init__(self, pod: PodWorker, spec: dict, init: bool) -> None:
        super().__init__(daemon=True, name=f"{pod.name}/{spec['name']}")
        self.pod, self.spec, self.init = pod, spec, init
        self.name = spec["name"]
        self.proc: subprocess.Popen | None = None
        self.ns_pid: int | None = None
        self.env: dict[str, str] = {}
        self.restarts = 0
        self.ready = False
        self.started = False
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict = {}
        self.log_dir = pod.root / "logs" / self.name
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stopping = threading.Event()
        self.done = threading.Event()  # will not run again
        self.exit_code: int | None = None
        self._reader: threading.Thread | None = None
        self._end_lock = threading.Lock()
        self._ended: subprocess.Popen | None = None

    # --- status --------------------------------------------------------------------------
    def status(self) -> dict:
        out = {"name": self.name, "image": self.spec.get("image", ""), "imageID": "",
               "containerID": f"process://{self.ns_pid or 0}", "ready": self.ready,
               "restartCount": self.restarts, "started": self.started, "state": self.state}
        if self.last_state:
            out["lastState"] = self.last_state
        return out

    def log_path(self, previous: bool = False) -> Path:
        return self.log_dir / f"{self.restarts - (1 if previous else 0)}.log"

    # --- the process ---------------------------------------------------------------------
    def _mounts(self) -> list[dict]:
        pod, root = self.pod, self.pod.root
        own = root / "containers" / self.name
        for sub in ("tmp", "home"):
            (own / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(own / "tmp", 0o1777)
        mounts = [{"source": str(own / "tmp"), "target": "/tmp"},
                  {"source": str(own / "home"), "target": IMAGE_HOME},
                  {"source": str(root / "etc" / "hosts"), "target": "/etc/hosts"},
                  {"source": str(root / "etc" / "resolv.conf"), "target": "/etc/resolv.conf"},
                  {"source": str(root / "etc" / "hostname"), "target": "/etc/hostname"},
                  {"source": str(root / "etc" / "profile"), "target": "/etc/profile"}]
        mounts += [{"source": str(src), "target": target, "readOnly": True}
                   for target, src in pod.node.image_files.items()]
        targets = {m.get("mountPath") for m in self.spec.get("volumeMounts") or []}
        if "/dev/shm" not in targets:
            mounts.append({"source": "", "target": "/dev/shm", "tmpfs": True})
        for m in self.spec.get("volumeMounts") or []:
            source = pod.volumes[m["name"]]
            if m.get("subPath"):
                source = source / m["subPath"]
                if not source.exists():
                    source.mkdir(parents=True)
            mounts.append({"source": str(source), "target": m["mountPath"], "readOnly": bool(m.get("readOnly"))})
        return mounts

    def _argv(self) -> list[str]:
        command = [expand(c, self.env) for c in self.spec.get("command") or []]
        args = [expand(a, self.env) for a in self.spec.get("args") or []]
        argv = command + args if command else args
        return argv or ["bash"]

    def start_process(self) -> None:
        pod = self.pod
        base = {"PATH": f"{pod.node.python_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": IMAGE_HOME, "HOSTNAME": pod.hostname, "LANG": "C.UTF-8",
                **pod.node.image_env,
                "KUBERNETES_SERVICE_HOST": pod.node.host_ip,
                "KUBERNETES_SERVICE_PORT": str(pod.node.api_port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(pod.node.api_port),
                "KUBERNETES_PORT": f"tcp://{pod.node.host_ip}:{pod.node.api_port}",
                "KUBERNETES_PORT_443_TCP": f"tcp://{pod.node.host_ip}:{pod.node.api_port}",
                "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
                "KUBERNETES_PORT_443_TCP_ADDR": pod.node.host_ip,
                "KUBERNETES_PORT_443_TCP_PORT": str(pod.node.api_port)}
        seen = {**pod.pod, "status": {**(pod.pod.get("status") or {}), "podIP": pod.ip,
                                      "hostIP": pod.node.host_ip}}
        self.env = container_env(seen, self.spec, Sources(pod.node.api, pod.namespace), base,
                                 pod.node.capacity)
        spec = {"hostname": pod.hostname, "mounts": self._mounts(), "env": self.env,
                "cwd": self.spec.get("workingDir") or IMAGE_HOME, "argv": self._argv(),
                "created": str(pod.node.root / "created-mountpoints")}
        spec_path = pod.root / "containers" / self.name / "spec.json"
        spec_path.write_text(json.dumps(spec))
        argv = ["ip", "netns", "exec", pod.netns, "unshare", "--mount", "--uts", "--pid", "--fork",
                "--mount-proc", "--propagation", "private", "--kill-child",
                str(pod.node.python_bin / "python"), str(ENTER), str(spec_path)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.ns_pid = self._child_of(self.proc.pid)
        log = self.log_path()
        self._reader = threading.Thread(target=_copy_log, args=(self.proc.stdout, log), daemon=True)
        self._reader.start()

    @staticmethod
    def _child_of(pid: int, timeout: float = 10.0) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                return None
            if children:
                return int(children[0])
            time.sleep(0.01)
        return None

    def signal(self, sig: int) -> None:
        """To the container's PID 1 (which, as in a container, ignores what it has no handler
        for); SIGKILL to it ends its whole PID namespace."""
        target = self.ns_pid or (self.proc.pid if self.proc else None)
        if target:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, sig)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- probes and hooks ----------------------------------------------------------------
    def _in_container(self, command: list[str], timeout: float) -> bool:
        if not self.ns_pid:
            return False
        argv = ["nsenter", "-t", str(self.ns_pid), "-m", "-n", "-u", "-p", "--", "env", "-i",
                *[f"{k}={v}" for k, v in self.env.items()], *command]
        try:
            return subprocess.run(argv, capture_output=True, timeout=timeout,
                                  cwd="/").returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _port(self, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in self.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no port named {port}")

    def handler(self, spec: dict, timeout: float) -> bool:
        """An exec, httpGet or tcpSocket action (a probe's or a lifecycle hook's)."""
        try:
            if "exec" in spec:
                return self._in_container(spec["exec"]["command"], timeout)
            if "httpGet" in spec:
                h = spec["httpGet"]
                url = (f"{h.get('scheme', 'HTTP').lower()}://{h.get('host') or self.pod.ip}:"
                       f"{self._port(h['port'])}{h.get('path', '/')}")
                request = urllib.request.Request(url, headers={x["name"]: x["value"] for x in h.get("httpHeaders") or []})
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    return 200 <= response.status < 400
            if "tcpSocket" in spec:
                t = spec["tcpSocket"]
                with socket.create_connection((t.get("host") or self.pod.ip, self._port(t["port"])), timeout):
                    return True
            if "sleep" in spec:
                self.stopping.wait(float(spec["sleep"]["seconds"]))
                return True
        except (OSError, ValueError):
            return False
        return False

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        backoff = 10.0
        while not self.stopping.is_set():
            try:
                self.start_process()
            except (ConfigError, ApiError, OSError, RuntimeError) as e:
                reason = "CreateContainerConfigError" if isinstance(e, ConfigError) else "CreateContainerError"
                self.state = {"waiting": {"reason": reason, "message": str(e)}}
                self.pod.changed()
                self.stopping.wait(2.0)
                continue
            started_at, started = now(), time.monotonic()
            self.state = {"running": {"startedAt": started_at}}
            probes = {k: Probe(self.spec[f"{k}Probe"], k) for k in ("startup", "liveness", "readiness")
                      if self.spec.get(f"{k}Probe") and not self.init}
            self.started = "startup" not in probes
            self.ready = not self.init and "readiness" not in probes
            self.pod.changed()
            killed_for = ""
            while self.running() and not self.stopping.is_set():
                killed_for = self._probe(probes, started) or ""
                if killed_for:
                    self.stop(float(self.pod.pod["spec"].get("terminationGracePeriodSeconds", 30)), hook=False)
                    break
                self.stopping.wait(0.2)
            if self.stopping.is_set() and self.running():
                return  # stop() ends it, records the end and sets done
            self._record_end(started_at, killed_for)
            if self.stopping.is_set() or not self._restarts():
                self.done.set()
                self.pod.changed()
                return
            self.state = {"waiting": {"reason": "CrashLoopBackOff", "message":
                                      f"back-off {backoff:.0f}s restarting failed container={self.name}"}}
            self.pod.changed()
            if self.stopping.wait(backoff):
                break
            backoff = min(backoff * 2, 300.0)
            self.restarts += 1
        self.done.set()

    def _probe(self, probes: dict[str, Probe], started: float) -> str | None:
        """Run what is due; the reason to kill the container, if any."""
        for kind in ("startup", "liveness", "readiness"):
            probe = probes.get(kind)
            if probe is None or (kind != "startup" and not self.started) or (kind == "startup" and self.started):
                continue
            if not probe.due(started):
                continue
            verdict = probe.record(self.handler(probe.spec, probe.timeout))
            if kind == "startup":
                if verdict == "success":
                    self.started = True
                    self.ready = "readiness" not in probes
                    self.pod.changed()
                elif verdict == "failure":
                    return "startup probe failed"
            elif kind == "liveness" and verdict == "failure":
                return "liveness probe failed"
            elif kind == "readiness" and verdict is not None and self.ready != (verdict == "success"):
                self.ready = verdict == "success"
                self.pod.changed()
        return None

    def _record_end(self, started_at: str, why: str = "") -> None:
        assert self.proc is not None
        with self._end_lock:
            if self._ended is self.proc:
                return
            self._ended = self.proc
        code = self.proc.wait()
        if self._reader:
            self._reader.join(5)
        code = 128 - code if code < 0 else code
        self.exit_code = code
        self.ready = False
        self.state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                     "startedAt": started_at, "finishedAt": now(),
                                     "containerID": f"process://{self.ns_pid or 0}",
                                     **({"message": why} if why else {})}}
        self.last_state = {}
        self.pod.changed()

    def _restarts(self) -> bool:
        policy = self.pod.pod["spec"].get("restartPolicy", "Always")
        if self.init:
            return policy != "Never" and self.exit_code != 0
        return policy == "Always" or (policy == "OnFailure" and self.exit_code != 0)

    def stop(self, grace: float, hook: bool = True) -> None:
        """kubelet's killContainer: the preStop hook, SIGTERM, the rest of the grace period,
        SIGKILL."""
        self.stopping.set()
        if not self.running():
            self.done.set()
            return
        started_at = (self.state.get("running") or {}).get("startedAt", now())
        deadline = time.monotonic() + grace
        pre_stop = (self.spec.get("lifecycle") or {}).get("preStop")
        if hook and pre_stop:
            self.handler(pre_stop, max(deadline - time.monotonic(), 0.1))
        self.signal(signal.SIGTERM)
        assert self.proc is not None
        try:
            self.proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        self._record_end(started_at)
        self.done.set()
        self.pod.changed()


def _copy_log(stream: Any, path: Path) -> None:
    """The container's output, a line at a time, in the CRI log format kubelet keeps."""
    with open(path, "ab", buffering=0) as out:
        for line in iter(stream.readline, b""):
            stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
            full = line.endswith(b"\n")
            out.write(stamp + b" stdout " + (b"F " if full else b"P ") + line + (b"" if full else b"\n"))


class PodWorker(threading.Thread):
    """A pod from the moment it is bound here until its final delete."""

    def __init__(self, node: NodeContext, pod: dict) -> None:
        meta = pod["metadata"]
        super().__init__(daemon=True, name=f"pod {meta['namespace']}/{meta['name']}")
        self.node, self.pod = node, pod
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.hostname = (pod["spec"].get("hostname") or self.name)[:63]
        self.root = node.root / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.netns = f"{node.bridge}-{self.uid[:8]}"
        self.ip = ""
        self.volumes: dict[str, Path] = {}
        self.tmpfs: list[str] = []
        self.init_containers = [Container(self, c, True) for c in pod["spec"].get("initContainers") or []]
        self.containers = [Container(self, c, False) for c in pod["spec"]["containers"]]
        self.phase = "Pending"
        self.reason: dict = {}
        self.start_time = now()
        self.transitions: dict[str, tuple[str, str]] = {}
        self.delete_grace: float | None = None
        self.finished = threading.Event()  # the final delete is done
        self._torn_down = False
        self._dirty = threading.Event()
        self._pushed: dict | None = None
        self._wake = threading.Event()

    # --- called by the kubelet -----------------------------------------------------------
    def request_delete(self, grace: float) -> None:
        if self.delete_grace is None or grace < self.delete_grace:
            self.delete_grace = grace
        self._wake.set()

    def changed(self) -> None:
        self._dirty.set()
        self._wake.set()

    def container(self, name: str) -> Container | None:
        return next((c for c in self.containers + self.init_containers if c.name == name), None)

    # --- the pod's life ------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._live()
        except Exception as e:  # noqa: BLE001 - a pod's failure must not stop the node
            log.exception("pod %s/%s", self.namespace, self.name)
            self.reason = {"reason": "KubeletError", "message": f"{type(e).__name__}: {e}"}
            self.phase = "Failed"
            self._push()
            while self.delete_grace is None:
                self._wake.wait(1.0)
                self._wake.clear()
        finally:
            self._stop_all(self.delete_grace or 0)
            self._teardown()
            if self.delete_grace is not None:
                self._final_delete()
            self.finished.set()

    def _deleting(self) -> bool:
        return self.delete_grace is not None

    def _live(self) -> None:
        while not self._deleting():
            try:
                self._sandbox()
                break
            except (NotReady, ConfigError) as e:
                self.reason = {"reason": "ContainerCreating", "message": str(e)}
                self._push()
                self._wake.wait(2.0)
                self._wake.clear()
        self.reason = {}
        self._push()
        for init in self.init_containers:
            if self._deleting():
                return
            init.start()
            while not init.done.is_set() and not self._deleting():
                self._sync()
            if init.exit_code != 0:
                self.phase = "Failed"
                self._push()
                self._wait_for_delete()
                return
        for c in self.containers:
            c.start()
        self.phase = "Running"
        while not self._deleting():
            self._sync()
            if all(c.done.is_set() for c in self.containers):
                ok = all(c.exit_code == 0 for c in self.containers)
                self.phase = "Succeeded" if ok else "Failed"
                self._push()
                self._teardown()
                self._wait_for_delete()
                return

    def _sync(self) -> None:
        self._wake.wait(1.0)
        self._wake.clear()
        if self._dirty.is_set():
            self._dirty.clear()
            self._push()

    def _wait_for_delete(self) -> None:
        while not self._deleting():
            self._wake.wait(1.0)
            self._wake.clear()

    def _sandbox(self) -> None:
        """The pod's network namespace and files (once), then its volumes (until they can be)."""
        if not self.ip:
            self.ip = self.node.allocate_ip()
            host, peer = f"v{self.uid[:8]}", f"p{self.uid[:8]}"
            subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True)
            sh("ip", "netns", "add", self.netns)
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", self.netns)
            sh("ip", "-n", self.netns, "link", "set", peer, "name", "eth0")
            sh("ip", "-n", self.netns, "addr", "add", f"{self.ip}/24", "dev", "eth0")
            sh("ip", "-n", self.netns, "link", "set", "eth0", "up")
            sh("ip", "-n", self.netns, "link", "set", "lo", "up")
            sh("ip", "link", "set", host, "master", self.node.bridge)
            sh("ip", "link", "set", host, "up")
            etc = self.root / "etc"
            etc.mkdir(parents=True, exist_ok=True)
            sub = self.pod["spec"].get("subdomain")
            fqdn = f"{self.hostname}.{sub}.{self.namespace}.svc.{self.node.domain} " if sub else ""
            (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                                       f"{self.ip}\t{fqdn}{self.hostname}\n")
            d = self.node.domain
            (etc / "resolv.conf").write_text(f"nameserver {self.node.host_ip}\n"
                                             f"search {self.namespace}.svc.{d} svc.{d} {d}\noptions ndots:5\n")
            (etc / "hostname").write_text(self.hostname + "\n")
            (etc / "profile").write_text("# the image's /etc/profile: the environment is the container's\n")
            self._push()
        self.volumes = materialize(self.node.api, self.pod, self.root, self.tmpfs)

    # --- status --------------------------------------------------------------------------
    def _condition(self, kind: str, ok: bool) -> dict:
        value = "True" if ok else "False"
        if self.transitions.get(kind, ("", ""))[0] != value:
            self.transitions[kind] = (value, now())
        return {"type": kind, "status": value, "lastProbeTime": None,
                "lastTransitionTime": self.transitions[kind][1]}

    def status(self) -> dict:
        inits_done = all(c.done.is_set() and c.exit_code == 0 for c in self.init_containers)
        ready = self.phase == "Running" and all(c.ready for c in self.containers)
        status = {
            "phase": self.phase, "hostIP": self.node.host_ip, "hostIPs": [{"ip": self.node.host_ip}],
            "startTime": self.start_time,
            "conditions": [self._condition("PodReadyToStartContainers", bool(self.ip)),
                           self._condition("Initialized", inits_done),
                           self._condition("Ready", ready),
                           self._condition("ContainersReady", ready),
                           self._condition("PodScheduled", True)],
            "containerStatuses": [c.status() for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        if self.ip:
            status["podIP"], status["podIPs"] = self.ip, [{"ip": self.ip}]
        status.update(self.reason)
        return status

    def _push(self) -> None:
        status = self.status()
        if status == self._pushed:
            return
        try:
            self.node.api.patch(f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
                                {"metadata": {"uid": self.uid}, "status": status})
            self._pushed = status
        except ApiError as e:
            log.warning("status of %s/%s: %s", self.namespace, self.name, e)
            if e.status == 404:
                self.request_delete(0)  # gone from the API: stop what runs
            elif e.status == 409 and "UID" in str(e):
                self.request_delete(0)

    # --- the end -------------------------------------------------------------------------
    def _stop_all(self, grace: float) -> None:
        stoppers = [threading.Thread(target=c.stop, args=(grace,), daemon=True)
                    for c in self.containers + self.init_containers if c.running() or c.is_alive()]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(grace + 30)

    def _teardown(self) -> None:
        """Release the network namespace and the mounts (the logs stay until the final delete);
        once, whether the pod ended by itself or was deleted."""
        if self._torn_down:
            return
        self._torn_down = True
        if self.ip:
            subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True)
            subprocess.run(["ip", "link", "delete", f"v{self.uid[:8]}"], capture_output=True)
            self.node.release_ip(self.ip)
        for where in self.tmpfs:
            subprocess.run(["umount", "-l", where], capture_output=True)
        self.tmpfs.clear()
    def _final_delete(self) -> None:
        with contextlib.suppress(ApiError):
            self.node.api.delete(f"/api/v1/namespaces/{self.namespace}/pods/{self.name}", {
                "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": self.uid}})
        shutil.rmtree(self.root, ignore_errors=True)


def remove_created_mountpoints(node_root: Path) -> None:
    """The mountpoints the containers made on this machine's disk (a mountPath like
    /mnt/checkpoints), removed once no process anywhere still mounts something there.

    Not per pod: removing a directory that is a mountpoint in another mount namespace detaches
    that mount there (Linux >= 3.18), so one pod's teardown would take every other pod's volume
    at the same path away (seen: a finished job's teardown emptied a running job's checkpoint
    mount and its service-account token)."""
    created = node_root / "created-mountpoints"
    if not created.exists():
        return
    mounted = _mountpoints_anywhere()
    keep = []
    for path in sorted(set(created.read_text().split()), key=len, reverse=True):
        p = Path(path)
        if any(m == path or m.startswith(path.rstrip("/") + "/") for m in mounted):
            keep.append(path)
            continue
        with contextlib.suppress(OSError):
            if p.is_file() and p.stat().st_size == 0:
                p.unlink()
            elif p.is_dir():
                _remove_empty_tree(p)
    created.write_text("".join(f"{k}\n" for k in keep))


def _mountpoints_anywhere() -> set[str]:
    """Every mountpoint of every mount namespace on this machine (from /proc/*/mountinfo)."""
    out: set[str] = set()
    for info in Path("/proc").glob("[0-9]*/mountinfo"):
        with contextlib.suppress(OSError):
            out.update(line.split()[4] for line in info.read_text().splitlines())
    return out


def _remove_empty_tree(path: Path) -> None:
    """rmdir `path` and the empty directories under it, never a file."""
    for sub in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir() and not os.path.ismount(sub):
            with contextlib.suppress(OSError):
                sub.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()
