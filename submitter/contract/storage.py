"""Storage policy: refuse any Ray Train `storage_path` that would not outlive the job.

Why this module exists: KubeRay deletes the Ray pods (and their disks) after a job, so a
`storage_path` on a pod's own filesystem silently loses every checkpoint. Pure functions; each
refusal says what is wrong and how to fix it.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Literal, Optional
from urllib.parse import urlsplit

from submitter.contract.errors import StoragePolicyError

#: URI schemes of durable object stores that the image's pyarrow opens itself
#: (`pyarrow.fs.FileSystem.from_uri`, checked against pyarrow 2x: S3, GCS, Azure Data Lake Gen2).
#: Ray Train hands any other scheme to fsspec, whose backends (s3fs, adlfs, ossfs...) the image
#: does not install, so the job would fail only once training started.
OBJECT_STORE_SCHEMES = frozenset({"s3", "gs", "gcs", "abfs", "abfss"})
#: Schemes a user may reasonably write that the image cannot open: the fix for each.
SCHEME_FIXES = {
    "s3a": "use s3:// (s3a:// is Hadoop's name; pyarrow knows s3://)",
    "s3n": "use s3:// (s3n:// is Hadoop's name; pyarrow knows s3://)",
    "az": "use abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/... (az:// needs adlfs, "
          "which the image lacks)",
    "adl": "use Azure Data Lake Gen2, abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/...",
    "wasb": "use abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/...",
    "wasbs": "use abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/...",
    "hdfs": "the image has no Java or libhdfs; use s3://, gs:// or abfss://, or a path on the PVC",
    "viewfs": "the image has no Java or libhdfs; use s3://, gs:// or abfss://, or a path on the PVC",
}
#: Where Ray Train writes by default; it lives on the pod's (or laptop's scratch) disk.
RAY_DEFAULT_DIRS = ("~/ray_results", "/home/ray/ray_results", "/root/ray_results")
#: Mount points that are never a shared volume in a Ray pod.
_SYSTEM_DIRS = ("/", "/tmp", "/var/tmp", "/dev", "/dev/shm", "/proc", "/sys", "/etc", "/home",
                "/root", "/usr", "/bin", "/lib", "/opt", "/var", "/run")
#: Trees whose every subdirectory is scratch or virtual, never durable.
_SCRATCH_TREES = ("/tmp", "/var/tmp", "/dev", "/proc", "/sys")


@dataclass(frozen=True)
class StorageDecision:
    """What the plan must do for a storage path that passed the policy."""

    kind: Literal["object-store", "shared-mount"]
    path: str  # the normalized path/URI handed to Ray Train


def scheme_of(path: str) -> str:
    """The URI scheme of a storage path as written ('' for a plain path). Schemes are matched
    as written: the filesystems Ray Train uses know `s3://`, not `S3://`."""
    head = path.split("://", 1)[0] if "://" in path else ""
    return head if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", head) else ""


def local_path(path: str) -> str:
    """A plain path as it is, or the path part of a file:// URI."""
    return urlsplit(path).path if scheme_of(path) == "file" else path


def namespace_root(storage_path: str, namespace: str) -> str:
    """`<storage>/<namespace>`: where a cluster's runs of one namespace live (Ray Train's
    storage_path in the pod; a run is `<storage>/<namespace>/<name>`: same name, other
    namespace, other run)."""
    return storage_path.rstrip("/") + "/" + namespace


#: Prepared corpora live beside the runs: `<storage>/<namespace>/corpora/<name>` on a cluster,
#: `<storage>/corpora/<name>` locally (a job may not be named this: its run would share it).
CORPORA_DIR = "corpora"


def corpus_root(storage_path: str, namespace: Optional[str], name: str) -> str:
    """Where the prepared corpus `name` lives (`submitter data prepare --name`, `submit --data
    NAME`): under the namespace's root on a cluster (namespace given), under the storage path
    locally (None)."""
    base = namespace_root(storage_path, namespace) if namespace else storage_path.rstrip("/")
    return f"{base}/{CORPORA_DIR}/{name}"


def check_mount(mount: str) -> str:
    """Validate the PVC mount point; return it normalized."""
    if not mount.startswith("/"):
        raise StoragePolicyError(f"--storage-mount {mount!r} is not absolute; use e.g. /mnt/checkpoints")
    norm = posixpath.normpath(mount)
    if norm in _SYSTEM_DIRS or any(_is_under(norm, d) for d in _SCRATCH_TREES):
        raise StoragePolicyError(f"--storage-mount {mount!r} is a system or scratch directory; "
                                 "mount the PVC on a dedicated path such as /mnt/checkpoints")
    return norm


def check_access_mode(mode: str) -> None:
    if mode != "ReadWriteMany":
        raise StoragePolicyError(
            f"access mode {mode} lets only one node mount the volume, but the Ray head and every "
            "worker write checkpoints; use a ReadWriteMany StorageClass (NFS, EFS, Filestore, "
            "CephFS...) or an object-store --storage-path (s3://, gs://)")


def check_cluster_storage(path: str, mount: str) -> StorageDecision:
    """Accept object-store URIs and paths under the shared PVC mount; refuse all else."""
    mount = check_mount(mount)
    scheme = scheme_of(path)
    if scheme in OBJECT_STORE_SCHEMES:
        if not urlsplit(path).netloc:
            raise StoragePolicyError(f"--storage-path {path!r} names no bucket; use e.g. {scheme}://bucket/runs")
        return StorageDecision("object-store", path)
    if scheme == "file":
        local = local_path(path)
        if not _is_under(posixpath.normpath(local or "/"), mount) or urlsplit(path).netloc:
            raise StoragePolicyError(
                f"--storage-path {path!r} is a file:// path outside the shared mount {mount}: "
                f"it lives on the pod's own disk and is deleted with the pod; use {mount}/... or s3://...")
        return StorageDecision("shared-mount", posixpath.normpath(local))
    if scheme:
        raise StoragePolicyError(_unknown_scheme(path, scheme, mount))
    _refuse_ephemeral_text(path, f"use a path under the shared mount, e.g. {mount}/runs, or s3://bucket/runs")
    norm = posixpath.normpath(path)
    if not _is_under(norm, mount):
        raise StoragePolicyError(
            f"--storage-path {path!r} is outside the shared mount {mount}: it would live on the "
            f"pod's own disk, which KubeRay deletes after the job; use {mount}/... "
            "(or move the mount with --storage-mount), or s3://bucket/runs")
    return StorageDecision("shared-mount", norm)


def check_job_storage(path: str, mount: str, access_mode: str) -> StorageDecision:
    """The whole cluster policy for a job: the path, and a ReadWriteMany PVC when it is one.
    `submitter render` applies it, and the pod again (a chart-rendered job meets it there)."""
    decision = check_cluster_storage(path, mount)
    if decision.kind == "shared-mount":
        check_access_mode(access_mode)
    return decision


def storage_path_schema() -> dict:
    """The part of the policy JSON Schema can say (the Helm chart's values.schema.json): an
    object-store URI with a bucket, a file:// URI or an absolute path, and none of the scratch
    or Ray-default directories. 'Under the mount' needs the other value: the pod checks it."""
    schemes = "|".join(sorted(OBJECT_STORE_SCHEMES))
    scratch = "|".join(d.lstrip("/") for d in ("/tmp", "/var/tmp", "/dev/shm"))
    ray = "|".join(d.lstrip("/") for d in RAY_DEFAULT_DIRS if d.startswith("/"))
    return {"allOf": [
        {"pattern": f"^(/|file:///|({schemes})://[^/])"},
        {"not": {"pattern": f"^(file://)?/+({scratch})(/|$)"}},
        {"not": {"pattern": f"^(file://)?/+({ray})(/|$)"}},
    ]}


def check_local_storage(path: str) -> str:
    """Local runs (`submit --local`): an absolute, durable local directory. Returns it normalized."""
    scheme = scheme_of(path)
    if scheme in OBJECT_STORE_SCHEMES:
        return path
    if scheme == "file":
        path = local_path(path)
    elif scheme:
        raise StoragePolicyError(_unknown_scheme(path, scheme, None))
    _refuse_ephemeral_text(path, "use an absolute directory you keep, e.g. $PWD/runs")
    return posixpath.normpath(path)


def _refuse_ephemeral_text(path: str, fix: str) -> None:
    if path.startswith("~"):
        raise StoragePolicyError(f"--storage-path {path!r} starts with '~', which Ray and the pod do "
                                 f"not expand (and a home directory is not durable in a pod); {fix}")
    if not path.startswith("/"):
        raise StoragePolicyError(f"--storage-path {path!r} is relative; Ray Train fails on relative "
                                 f"paths deep inside a run; {fix}")
    norm = posixpath.normpath(path)
    for ray_default in RAY_DEFAULT_DIRS:
        if ray_default.startswith("/") and _is_under(norm, ray_default):
            raise StoragePolicyError(f"--storage-path {path!r} is Ray's default results directory on "
                                     f"the pod's ephemeral disk; {fix}")
    for scratch in ("/tmp", "/var/tmp", "/dev/shm"):  # ordinary local scratch
        if _is_under(norm, scratch):
            raise StoragePolicyError(f"--storage-path {path!r} is under {scratch}, which is scratch "
                                     f"space that does not survive a restart; {fix}")


def scheme_fix(scheme: str) -> str | None:
    """What to write instead of a scheme the image cannot open (None: no specific advice):
    an object-store scheme in the wrong case, or a name from SCHEME_FIXES."""
    if scheme.lower() in OBJECT_STORE_SCHEMES and scheme != scheme.lower():
        return (f"use the scheme in lower case, {scheme.lower()}://; the filesystems Ray Train "
                "uses know no other spelling")
    return SCHEME_FIXES.get(scheme.lower())


def _unknown_scheme(path: str, scheme: str, mount: str | None) -> str:
    if scheme == "local":
        where = f" use {mount}/... or s3://bucket/runs" if mount else " use an absolute directory"
        return (f"--storage-path {path!r}: local:// is each node's own disk, so workers' checkpoints "
                f"are scattered and deleted with the pods;{where}")
    fix = scheme_fix(scheme)
    if fix:
        return f"--storage-path {path!r}: the image cannot open {scheme}://; {fix}"
    known = ", ".join(sorted(s + "://" for s in OBJECT_STORE_SCHEMES))
    return f"--storage-path {path!r}: unsupported scheme {scheme}://; use one of {known} or a path"


def check_pod_file(flag: str, path: str, mount: str) -> None:
    """A file the pod reads (--data, --bpe-file): an object-store URI, or an absolute path (on
    the storage mount, or baked into the image). A laptop path means nothing in the pod."""
    scheme = scheme_of(path)
    fix = (f"copy it to the checkpoint volume ({mount}/...) or a bucket (s3://...) and pass "
           "that, or bake it into the image and pass its absolute path")
    if scheme:
        if scheme in OBJECT_STORE_SCHEMES:
            return
        what = ("write the absolute path itself, without file://" if scheme == "file"
                else scheme_fix(scheme) or "use s3://, gs:// or abfss://")
        raise StoragePolicyError(f"{flag} {path!r}: the image cannot open {scheme}://; {what}")
    if path.startswith("~"):
        raise StoragePolicyError(f"{flag} {path!r} is a path in your home directory, which the "
                                 f"pod does not have; {fix}")
    if not path.startswith("/"):
        raise StoragePolicyError(f"{flag} {path!r} is a relative path on this machine, which the "
                                 f"pod does not have; {fix}")


def pod_file_schema() -> dict:
    """check_pod_file as JSON Schema, for the chart: an absolute path or a readable URI."""
    schemes = "|".join(sorted(OBJECT_STORE_SCHEMES))
    return {"pattern": f"^(/|({schemes})://)"}


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
