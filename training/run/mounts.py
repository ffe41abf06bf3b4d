"""The storage re-check inside the container: is `storage_path` on a shared filesystem?

The submitter checked the path against the plan; here, in the pod, we check what is really
mounted there. A path on the pod's own overlay/tmpfs/ext4 disk loses every checkpoint when
KubeRay deletes the pod, so we refuse it unless the user overrides (`--allow-ephemeral-storage`).
Parsing is pure (tested with sample `/proc/self/mountinfo` text).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from submitter.contract.errors import StoragePolicyError
from submitter.contract.storage import (OBJECT_STORE_SCHEMES, check_job_storage,
                                        check_local_storage, scheme_of)

#: Filesystem types that every pod of the cluster can see (network / distributed).
SHARED_FSTYPES = frozenset({
    "nfs", "nfs4", "cephfs", "ceph", "lustre", "gpfs", "glusterfs", "beegfs", "cifs", "smb3",
    "smbfs", "efs", "9p", "virtiofs", "wekafs", "panfs", "orangefs", "pvfs2", "ocfs2", "gfs2",
    "alluxio", "juicefs", "moosefs",
})


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040...)."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse /proc/self/mountinfo; malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if "-" not in parts:
            continue
        sep = parts.index("-")
        if sep < 6 or len(parts) < sep + 3:
            continue
        mounts.append(Mount(_unescape(parts[4]), parts[sep + 1], _unescape(parts[sep + 2])))
    return mounts


def mount_for(path: str, mounts: list[Mount]) -> Optional[Mount]:
    """The mount a path lives on: the longest mount point above it (the last one wins on ties,
    as the kernel stacks later mounts on top)."""
    path = posixpath.normpath(path)
    best: Optional[Mount] = None
    for m in mounts:
        mp = m.mount_point
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mount_point):
                best = m
    return best


#: Filesystem types that are shared only when they are a volume's own mount: as the container's
#: root (`/`) they are the sandbox's disk (gVisor's 9p, Kata's virtiofs, rootless
#: fuse-overlayfs) and die with the pod.
ROOT_LOOKALIKES = frozenset({"9p", "virtiofs"})


def is_shared(fstype: str) -> bool:
    return fstype in SHARED_FSTYPES or fstype.startswith("fuse.") or fstype.startswith("nfs")


def is_shared_mount(m: Mount) -> bool:
    """A mount every pod can see: a network filesystem, or a 9p/virtiofs/fuse.* mount that is
    a volume's (a mount point other than `/`), never the container's root."""
    if m.fstype in ROOT_LOOKALIKES or m.fstype.startswith("fuse"):
        return m.mount_point != "/"
    return is_shared(m.fstype)


def check_storage_in_container(path: str, mount: str, mountinfo: str, *, in_kubernetes: bool,
                               allow_ephemeral: bool = False,
                               access_mode: str = "ReadWriteMany",
                               resolve: Callable[[str], str] = os.path.realpath) -> tuple[str, str]:
    """(the storage path to use, a one-line verdict for the output), or StoragePolicyError.

    In a pod the render-time policy runs again first (a chart-rendered job meets it here for
    the first time), then the filesystem really mounted at the path is checked."""
    if scheme_of(path) in OBJECT_STORE_SCHEMES:
        return path, f"storage: {path} (object store)"
    if not in_kubernetes:
        local = check_local_storage(path)
        return local, f"storage: {local} (local directory)"
    local = check_job_storage(path, mount, access_mode).path
    real = resolve(local)  # a symlink under the mount may point at the pod's own disk
    found = mount_for(real, parse_mountinfo(mountinfo))
    via = f" (a symlink to {real})" if real != local else ""
    if found is not None and is_shared_mount(found):
        return local, f"storage: {local}{via} on {found.fstype} {found.source} (shared)"
    where = f"{found.fstype} at {found.mount_point}" if found else "no mount"
    if found is not None and found.mount_point == "/" and (
            found.fstype in ROOT_LOOKALIKES or found.fstype.startswith("fuse")):
        where += " (the container's root, not a volume)"
    if allow_ephemeral:
        return local, (f"storage: {local}{via} is on {where}, which is NOT shared: checkpoints die "
                       "with the pod (allowed by --allow-ephemeral-storage)")
    raise StoragePolicyError(
        f"--storage-path {local}{via} is on {where}, the pod's own disk: KubeRay deletes it with the "
        "pod and every checkpoint with it; mount a ReadWriteMany PVC (NFS, CephFS, EFS...) there, "
        "use s3://..., or pass --allow-ephemeral-storage to train anyway")


def check_storage_here(path: str, mount: str, allow_ephemeral: bool = False,
                       environ: Mapping[str, str] = os.environ,
                       access_mode: str = "ReadWriteMany") -> tuple[str, str]:
    """`check_storage_in_container` for this process (reads /proc/self/mountinfo in a pod)."""
    in_k8s = bool(environ.get("KUBERNETES_SERVICE_HOST"))
    text = ""
    if in_k8s:
        try:
            with open("/proc/self/mountinfo") as f:
                text = f.read()
        except OSError:
            text = ""
    return check_storage_in_container(path, mount, text, in_kubernetes=in_k8s,
                                      allow_ephemeral=allow_ephemeral, access_mode=access_mode)


#: The probe file's name: hidden, and unique per host and process (pods share the volume).
PROBE_PREFIX = ".submitter-write-probe"


def _nearest_existing(path: str) -> str:
    """`path`, or its deepest ancestor that exists (where the run's directories will be made)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _write_probe(directory: str) -> None:
    name = os.path.join(directory, f"{PROBE_PREFIX}-{os.uname().nodename}-{os.getpid()}")
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"ok\n")
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass


def check_writable(path: str, *, probe: Callable[[str], None] = _write_probe,
                   stat: Callable[[str], os.stat_result] = os.stat,
                   uid: Optional[int] = None, gid: Optional[int] = None) -> None:
    """Write (and remove) a probe file where the run will write, as this process's user (the
    pod's runAsUser), before anything else starts; StoragePolicyError with one line otherwise.

    Why: `fsGroup` is not applied to NFS-style volumes (NFS, Filestore, EFS without an access
    point), so a root-owned 0755 export refuses uid 1000, and without this the run fails minutes
    later inside Ray Train's first checkpoint."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    directory = _nearest_existing(path)
    try:
        probe(directory)
        return
    except OSError as e:
        error = e
    import errno
    import stat as stat_module

    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if gid is None else gid
    where = directory if directory == os.path.abspath(path) else f"{directory} (where {path} would be made)"
    if error.errno == errno.EROFS:
        raise StoragePolicyError(
            f"--storage-path {path} is on a read-only filesystem ({where}): mount the PVC read-write "
            "(readOnly: false, a ReadWriteMany claim)") from None
    try:
        st = stat(directory)
        found = (f"{where} is owned by uid {st.st_uid} gid {st.st_gid} with mode "
                 f"{stat_module.S_IMODE(st.st_mode):04o} ({stat_module.filemode(st.st_mode)})")
    except OSError as e:
        found = f"{where} cannot even be looked at ({e.strerror}: a parent directory is closed to it)"
    reason = error.strerror or type(error).__name__
    raise StoragePolicyError(
        f"--storage-path {path} is not writable by the pod's user (uid {uid}, gid {gid}): {found}; "
        f"{reason}. fsGroup does not reach NFS-style volumes (NFS, Filestore, EFS). Fix: an EFS access "
        f"point with PosixUser {uid}:{gid}, an export owned by {uid}:{gid} (chown it once, or a "
        f"root-squash setting that maps writes to that uid, e.g. all_squash,anonuid={uid},"
        f"anongid={gid}), or --existing-pvc naming a volume owned by uid {uid}") from None


def checked_run_root(spec: Any, environ: Mapping[str, str]) -> tuple[str, str]:
    """The job's storage checked where it runs, as every driver must before Ray starts (the
    policy, the mounted filesystem in a pod, then a write probe as the pod's user unless it
    is an object store), and the root of its runs there (`<storage>/<namespace>` in a
    cluster: same name, other namespace, other run). Returns (root, a line saying where
    checkpoints go); StoragePolicyError with one line otherwise."""
    from training.run.identity import run_storage_path

    path, line = check_storage_here(spec.resolved_storage_path, spec.storage_mount,
                                    spec.allow_ephemeral_storage, environ,
                                    spec.storage_access_mode)
    if scheme_of(path) not in OBJECT_STORE_SCHEMES:
        check_writable(path)
    return run_storage_path(path, spec.namespace, environ), line
