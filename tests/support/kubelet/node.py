"""The node: registration and heartbeats, binding, the pod workers, DNS records, the volume
provisioner and the log endpoint the API server calls for `pods/log`."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import re
import signal
import ssl
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from tests.support.kubelet.api import Api, ApiError
from tests.support.kubelet.dns import DnsServer, service_records
from tests.support.kubelet.env import quantity
from tests.support.kubelet.pod import NodeContext, PodWorker, now, remove_created_mountpoints

log = logging.getLogger("kubelet")
PROVISIONER = "submitter.test/local-dir"
KUBELET_PORT = 10250
#: Enough for the tests' pods; nothing is enforced (no cgroups), so this only keeps binding honest
#: about resources the machine does not have at all (GPUs).
CAPACITY = {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "100Gi"}


class Kubelet:
    def __init__(self, root: Path, state: dict, python_bin: Path, image_files: dict[str, Path],
                 image_env: dict[str, str]) -> None:
        certs = root / "certs"
        api = Api(f"https://{state['host_ip']}:{state['api_port']}", state["admin_token"], certs / "ca.crt")
        self.api, self.root, self.state = api, root, state
        self.node = NodeContext(api=api, name=state["node"], host_ip=state["host_ip"],
                                api_port=state["api_port"], bridge=state["bridge"], domain="cluster.local",
                                root=root / "node", python_bin=python_bin, capacity=dict(CAPACITY),
                                image_files=image_files, image_env=image_env)
        self.workers: dict[str, PodWorker] = {}  # by uid
        self.records: dict[str, list[str]] = {}
        self.stopping = threading.Event()
        self.version = state["versions"]["kubernetes"]

    # --- the Node --------------------------------------------------------------------------
    def node_status(self) -> dict:
        stamp = now()
        conditions = [{"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": stamp,
                       "lastTransitionTime": self.state.get("started", stamp)} for t, s, r, m in (
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("Ready", "True", "KubeletReady", "process kubelet is posting ready status"))]
        return {"capacity": CAPACITY, "allocatable": CAPACITY, "conditions": conditions,
                "addresses": [{"type": "InternalIP", "address": self.node.host_ip},
                              {"type": "Hostname", "address": self.node.name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
                "nodeInfo": {"kubeletVersion": self.version, "kubeProxyVersion": "", "osImage": "process kubelet",
                             "containerRuntimeVersion": "process://1", "kernelVersion": "", "machineID": "",
                             "systemUUID": "", "bootID": "", "operatingSystem": "linux", "architecture": "amd64"}}

    def register(self) -> None:
        self.state["started"] = now()
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node.name, "labels": {
            "kubernetes.io/hostname": self.node.name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "process"}},
            "spec": {"podCIDR": self.state["pod_cidr"], "podCIDRs": [self.state["pod_cidr"]]}}
        with contextlib.suppress(ApiError):
            self.api.post("/api/v1/nodes", body)
        self.api.patch(f"/api/v1/nodes/{self.node.name}/status", {"status": self.node_status()})

    def heartbeat(self) -> None:
        lease = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node.name}"
        while not self.stopping.wait(10.0):
            with contextlib.suppress(ApiError):
                self.api.patch(f"/api/v1/nodes/{self.node.name}/status", {"status": self.node_status()})
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
                if self.api.find(lease) is None:
                    self.api.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.node.name, "namespace": "kube-node-lease"},
                        "spec": {"holderIdentity": self.node.name, "leaseDurationSeconds": 40,
                                 "renewTime": stamp}})
                else:
                    self.api.patch(lease, {"spec": {"renewTime": stamp}})

    # --- binding (there is no scheduler) ------------------------------------------------
    def unfit(self, pod: dict) -> str | None:
        """Why this node cannot take the pod (the scheduler's words), None when it can."""
        spec = pod["spec"]
        labels = {"kubernetes.io/hostname": self.node.name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "process"}
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
        for c in spec.get("containers") or []:
            for name, value in ((c.get("resources") or {}).get("requests") or {}).items():
                if quantity(value) > 0 and name not in CAPACITY:
                    return f"0/1 nodes are available: 1 Insufficient {name}."
        return None

    def bind(self, pod: dict) -> None:
        meta = pod["metadata"]
        why = self.unfit(pod)
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        try:
            if why:
                conditions = (pod.get("status") or {}).get("conditions") or []
                if not any(c.get("type") == "PodScheduled" and c.get("message") == why for c in conditions):
                    self.api.patch(path + "/status", {"status": {"conditions": [{
                        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": why, "lastTransitionTime": now(), "lastProbeTime": None}]}})
                return
            self.api.post(path + "/binding", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"], "uid": meta["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node.name}})
        except ApiError as e:
            log.warning("binding %s/%s: %s", meta["namespace"], meta["name"], e)

    # --- the loop --------------------------------------------------------------------------
    def sync_pods(self) -> None:
        pods = self.api.items("/api/v1/pods")
        seen = set()
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            status = pod.get("status") or {}
            if not spec.get("nodeName"):
                if not meta.get("deletionTimestamp") and not spec.get("schedulingGates"):
                    self.bind(pod)
                continue
            if spec["nodeName"] != self.node.name:
                continue
            uid = meta["uid"]
            seen.add(uid)
            worker = self.workers.get(uid)
            if meta.get("deletionTimestamp"):
                grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                if worker is None:
                    with contextlib.suppress(ApiError):
                        self.api.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", {
                            "gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
                else:
                    worker.request_delete(grace)
                continue
            if worker is None and status.get("phase") not in ("Succeeded", "Failed"):
                worker = PodWorker(self.node, pod)
                self.workers[uid] = worker
                worker.start()
            elif worker is not None:
                worker.pod = pod  # the latest labels/annotations for the downward API
        for uid, worker in list(self.workers.items()):
            if uid not in seen:
                worker.request_delete(0)  # force-deleted: nothing to wait for
            if worker.finished.is_set():
                del self.workers[uid]

    def sync_dns(self) -> None:
        services = self.api.items("/api/v1/services")
        slices = self.api.items("/apis/discovery.k8s.io/v1/endpointslices")
        self.records = service_records(services, slices, self.node.domain)

    def lookup(self, name: str) -> list[str] | None:
        name = name.rstrip(".")
        if name in self.records:
            return self.records[name]
        return None

    def provision(self) -> None:
        """The default StorageClass's provisioner: a directory per claim, a hostPath PV bound to it."""
        for pvc in self.api.items("/api/v1/persistentvolumeclaims"):
            meta, spec = pvc["metadata"], pvc["spec"]
            annotations = meta.get("annotations") or {}
            wanted = annotations.get("volume.kubernetes.io/storage-provisioner") or \
                annotations.get("volume.beta.kubernetes.io/storage-provisioner")
            if wanted != PROVISIONER or spec.get("volumeName") or (pvc.get("status") or {}).get("phase") != "Pending":
                continue
            name = f"pvc-{meta['uid']}"
            directory = self.root / "volumes" / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}"
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o777)
            with contextlib.suppress(ApiError):
                self.api.post("/api/v1/persistentvolumes", {
                    "apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
                    "spec": {"capacity": {"storage": spec["resources"]["requests"]["storage"]},
                             "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                             "persistentVolumeReclaimPolicy": "Retain",
                             "storageClassName": spec.get("storageClassName"),
                             "volumeMode": spec.get("volumeMode", "Filesystem"),
                             "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
                             "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                          "namespace": meta["namespace"], "name": meta["name"],
                                          "uid": meta["uid"]}}})
                log.info("provisioned %s for %s/%s at %s", name, meta["namespace"], meta["name"], directory)

    def loop(self) -> None:
        while not self.stopping.is_set():
            for step in (self.sync_pods, self.sync_dns, self.provision):
                try:
                    step()
                except ApiError as e:
                    log.warning("%s: %s", step.__name__, e)
                except Exception:  # noqa: BLE001 - the node keeps going
                    log.exception("%s", step.__name__)
            self.stopping.wait(0.5)

    def drain(self) -> None:
        """Stop: every pod ends as on a node shutdown (its grace period), then the workers go."""
        for worker in list(self.workers.values()):
            worker.request_delete(float(worker.pod["spec"].get("terminationGracePeriodSeconds", 30)))
        for worker in list(self.workers.values()):
            worker.finished.wait(120)
        remove_created_mountpoints(self.node.root)

    # --- logs ----------------------------------------------------------------------------
    def serve_logs(self) -> http.server.ThreadingHTTPServer:
        kubelet = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urllib.parse.urlsplit(self.path)
                match = re.fullmatch(r"/containerLogs/([^/]+)/([^/]+)/([^/]+)", url.path)
                if not match:
                    self.send_error(404)
                    return
                query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
                worker = next((w for w in kubelet.workers.values()
                               if (w.namespace, w.name) == match.group(1, 2)), None)
                container = worker.container(match.group(3)) if worker else None
                if container is None:
                    self.send_error(404, "container not found")
                    return
                previous = query.get("previous") == "true"
                path = container.log_path(previous)
                if previous and container.restarts == 0:
                    self.send_error(400, f'previous terminated container "{container.name}" not found')
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                stamps = query.get("timestamps") == "true"
                lines = _log_lines(path)
                if "tailLines" in query:
                    lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) else []
                try:
                    for line in lines:
                        self.wfile.write(_shown(line, stamps))
                    self.wfile.flush()
                    if query.get("follow") == "true" and not previous:
                        _follow(path, len(b"".join(lines)), container, self.wfile, stamps)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        server = http.server.ThreadingHTTPServer((self.node.host_ip, KUBELET_PORT), Handler)
        server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.root / "certs" / "kubelet.crt", self.root / "certs" / "kubelet.key")
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True, name="logs").start()
        return server


def _log_lines(path: Path) -> list[bytes]:
    try:
        return path.read_bytes().splitlines(keepends=True)
    except OSError:
        return []


def _shown(line: bytes, stamps: bool) -> bytes:
    """A CRI log line as the API hands it out: the content, with its time when asked."""
    stamp, _, rest = line.partition(b" ")
    _, _, rest = rest.partition(b" ")  # the stream
    tag, _, content = rest.partition(b" ")
    if tag == b"P":
        content = content[:-1] if content.endswith(b"\n") else content
    return (stamp + b" " + content) if stamps else content


def _follow(path: Path, offset: int, container, out, stamps: bool) -> None:
    instance = container.restarts
    pending = b""
    while True:
        with contextlib.suppress(OSError):
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                out.write(_shown(line + b"\n", stamps))
            if complete:
                out.flush()
        if (not container.running() and container.proc is not None and container.proc.poll() is not None
                and not chunk) or container.restarts != instance:
            return
        time.sleep(0.3)


def main(root: Path) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    state = json.loads((root / "state.json").read_text())
    python_bin = Path(sys.executable).parent
    shared_bpe = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "gpt2.tiktoken"
    image_files = {"/opt/submitter/gpt2.tiktoken": shared_bpe} if shared_bpe.exists() else {}
    image_env = {"PYTHONUNBUFFERED": "1"}
    if image_files:
        image_env["SUBMITTER_GPT2_BPE"] = "/opt/submitter/gpt2.tiktoken"
    kubelet = Kubelet(root, state, python_bin, image_files, image_env)
    kubelet.register()
    kubelet.sync_dns()
    dns = DnsServer(state["host_ip"], kubelet.lookup)
    kubelet.serve_logs()
    threading.Thread(target=kubelet.heartbeat, daemon=True, name="heartbeat").start()
    signal.signal(signal.SIGTERM, lambda *_: kubelet.stopping.set())
    log.info("node %s ready: pods on %s, DNS and logs on %s", kubelet.node.name, state["pod_cidr"], state["host_ip"])
    kubelet.loop()
    kubelet.drain()
    dns.close()
