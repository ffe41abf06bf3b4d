"""A pod's volumes as directories on this machine, ready to be bind-mounted into its containers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.kubelet.api import Api
from tests.support.kubelet.env import ConfigError, Sources, field_value, quantity, resource_value


class NotReady(Exception):
    """A volume cannot be set up yet (an unbound claim): the pod waits, as kubelet's does."""


def _write(directory: Path, files: dict[str, str], mode: int) -> None:
    for rel, text in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chmod(path, mode)


def _keyed(data: dict[str, str], items: list[dict] | None) -> dict[str, str]:
    if not items:
        return dict(data)
    missing = [i["key"] for i in items if i["key"] not in data]
    if missing:
        raise ConfigError(f"keys {missing} not found")
    return {i["path"]: data[i["key"]] for i in items}


def _downward(pod: dict, items: list[dict], container_of: dict) -> dict[str, str]:
    out = {}
    for item in items:
        if "fieldRef" in item:
            out[item["path"]] = field_value(pod, item["fieldRef"]["fieldPath"])
        else:
            ref = item["resourceFieldRef"]
            out[item["path"]] = resource_value(container_of.get(ref.get("containerName"), {}), ref, {})
    return out


def token(api: Api, pod: dict, audience: str | None, seconds: int) -> str:
    meta = pod["metadata"]
    review = api.post(f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/"
                      f"{pod['spec'].get('serviceAccountName') or 'default'}/token", {
                          "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                          "spec": {"audiences": [audience] if audience else [],
                                   "expirationSeconds": seconds,
                                   "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                                      "name": meta["name"], "uid": meta["uid"]}}})
    return review["status"]["token"]


def materialize(api: Api, pod: dict, root: Path, tmpfs_mounts: list[str]) -> dict[str, Path]:
    """Volume name -> the directory (or file) its mounts bind. `tmpfs_mounts` collects what
    must be unmounted at teardown (memory-backed emptyDirs)."""
    namespace = pod["metadata"]["namespace"]
    sources = Sources(api, namespace)
    containers = {c["name"]: c for c in (pod["spec"].get("containers") or [])}
    out: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        name, where = volume["name"], root / "volumes" / volume["name"]
        if "persistentVolumeClaim" in volume:
            out[name] = claim_path(api, namespace, volume["persistentVolumeClaim"]["claimName"])
            continue
        if "hostPath" in volume:
            out[name] = Path(volume["hostPath"]["path"])
            continue
        where.mkdir(parents=True, exist_ok=True)
        out[name] = where
        if "emptyDir" in volume:
            spec = volume["emptyDir"] or {}
            if spec.get("medium") == "Memory" and not os.path.ismount(where):
                size = f",size={int(quantity(spec['sizeLimit']))}" if spec.get("sizeLimit") else ""
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode=1777{size}", "tmpfs", str(where)],
                               check=True)
                tmpfs_mounts.append(str(where))
        elif "configMap" in volume or "secret" in volume:
            kind, spec = ("configmaps", volume["configMap"]) if "configMap" in volume else ("secrets", volume["secret"])
            data = sources.data(kind, spec.get("name") or spec.get("secretName"), spec.get("optional", False))
            _write(where, _keyed(data or {}, spec.get("items")), spec.get("defaultMode", 0o644))
        elif "downwardAPI" in volume:
            spec = volume["downwardAPI"]
            _write(where, _downward(pod, spec.get("items") or [], containers), spec.get("defaultMode", 0o644))
        elif "projected" in volume:
            spec = volume["projected"]
            files: dict[str, str] = {}
            for source in spec.get("sources") or []:
                if "serviceAccountToken" in source:
                    t = source["serviceAccountToken"]
                    files[t["path"]] = token(api, pod, t.get("audience"), int(t.get("expirationSeconds", 3607)))
                elif "configMap" in source or "secret" in source:
                    kind, s = ("configmaps", source["configMap"]) if "configMap" in source else ("secrets", source["secret"])
                    files.update(_keyed(sources.data(kind, s["name"], s.get("optional", False)) or {}, s.get("items")))
                elif "downwardAPI" in source:
                    files.update(_downward(pod, source["downwardAPI"].get("items") or [], containers))
            _write(where, files, spec.get("defaultMode", 0o644))
        else:
            raise ConfigError(f"volume {name}: this kubelet does not support {sorted(set(volume) - {'name'})}")
    return out


def claim_path(api: Api, namespace: str, claim: str) -> Path:
    pvc = api.find(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
    if pvc is None:
        raise NotReady(f'persistentvolumeclaim "{claim}" not found')
    volume = (pvc.get("spec") or {}).get("volumeName")
    if not volume or (pvc.get("status") or {}).get("phase") != "Bound":
        raise NotReady(f'pod has unbound immediate PersistentVolumeClaims ("{claim}")')
    pv = api.get(f"/api/v1/persistentvolumes/{volume}")
    spec = pv["spec"]
    path = (spec.get("hostPath") or spec.get("local") or {}).get("path")
    if not path:
        raise ConfigError(f"PersistentVolume {volume} is neither hostPath nor local: not mountable here")
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)
