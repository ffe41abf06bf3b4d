"""The real control plane of the `realcluster` tests (tests/realcluster): what can run it, the
CLI as its restricted user runs it, and the admin's view of the cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "control-plane"
TINY_JOB = ROOT / "tests" / "realcluster" / "tiny-job.yaml"
NAMESPACE = "ml-team"


def why_not() -> str | None:
    """Why the real control plane cannot run here (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "needs Linux network and mount namespaces"
    if os.geteuid() != 0:
        return "needs root: a bridge, network and mount namespaces"
    for tool in ("ip", "unshare", "nsenter", "mount", "openssl"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if shutil.which("go") is None and not os.environ.get("SUBMITTER_CONTROL_PLANE"):
        cache = Path(os.environ.get("SUBMITTER_CONTROL_PLANE_CACHE",
                                    Path.home() / ".cache" / "submitter" / "control-plane"))
        if len(list((cache / "bin").glob("*/.complete"))) < 3:
            return "needs Go to build the control plane (and none is built)"
    return None


def control_plane_cli(*args: str, env: dict | None = None, timeout: float = 3000) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "SUBMITTER_PYTHON": sys.executable, **(env or {})})


class ControlPlane:
    """One `scripts/control-plane` DIR: the CLI as its users, and the admin's view of it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.user_kubeconfig = root / "user.kubeconfig"
        self.admin_kubeconfig = root / "admin.kubeconfig"
        from kubernetes import client, config

        self.admin = config.new_client_from_config(str(self.admin_kubeconfig))
        self.core = client.CoreV1Api(self.admin)
        self.custom = client.CustomObjectsApi(self.admin)
        self.batch = client.BatchV1Api(self.admin)
        self.apiext = client.ApiextensionsV1Api(self.admin)

    # --- the CLI as the restricted user runs it -------------------------------------------
    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "SUBMITTER_JOB"))}
        env.update(KUBECONFIG=str(kubeconfig or self.user_kubeconfig), NO_COLOR="1", COLUMNS="200")
        return env

    def submitter(self, *args: str, timeout: float = 900, kubeconfig: Path | None = None,
                  cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "submitter", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env(kubeconfig), cwd=cwd or ROOT)

    def submitter_in_background(self, *args: str, log: Path) -> subprocess.Popen:
        out = open(log, "w")
        return subprocess.Popen([sys.executable, "-m", "submitter", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=self.env(), cwd=ROOT)

    # --- the admin's view -----------------------------------------------------------------
    def rayjob(self, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object("ray.io", "v1", NAMESPACE, "rayjobs", name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def events(self, job: str) -> list[dict]:
        """The run's events as the progress ConfigMap holds them."""
        from submitter.contract import events as ev
        from submitter.contract import naming
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self.core.read_namespaced_config_map(f"{job}-progress", NAMESPACE)
        except ApiException:
            return []
        return ev.parse_lines((cm.data or {}).get(naming.CONFIGMAP_EVENTS_KEY, ""))

    def pods(self, selector: str) -> list[Any]:
        return self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items

    def volume_dir(self, claim: str) -> Path:
        """Where the claim's PersistentVolume lives on this machine (the provisioner's directory)."""
        pvc = self.core.read_namespaced_persistent_volume_claim(claim, NAMESPACE)
        pv = self.core.read_persistent_volume(pvc.spec.volume_name)
        return Path(pv.spec.host_path.path)

    def story(self) -> str:
        """What the cluster looks like now, for a failing test's message."""
        out = subprocess.run(["kubectl", "get", "rayjobs,rayclusters,jobs,pods,pvc", "-A", "-o", "wide"],
                             capture_output=True, text=True, env={**os.environ, "KUBECONFIG": str(self.admin_kubeconfig)}) \
            if shutil.which("kubectl") else None
        logs = "\n".join(f"--- {p.name}\n" + (p.read_text(errors="replace")[-1500:])
                         for p in sorted((self.root / "logs").glob("*.log")))
        return (out.stdout + out.stderr if out else "") + "\n" + logs


def job_file(tmp_path: Path, **overrides: Any) -> Path:
    """The tiny job with `overrides`, as a job file."""
    import yaml

    job = {**yaml.safe_load(TINY_JOB.read_text()), **overrides}
    path = tmp_path / f"{job['name']}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def events_of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e.get("type") == kind]
