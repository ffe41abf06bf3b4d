"""The in-container storage check: mountinfo parsing and the verdicts."""

from __future__ import annotations

import pytest

from submitter.contract.errors import StoragePolicyError
from training.run.mounts import (check_storage_in_container, check_storage_here, is_shared,
                             mount_for, parse_mountinfo)

# A Ray worker pod: overlay root, tmpfs, an NFS ReadWriteMany PVC and an ext4 RWO volume.
POD = """\
1279 1164 0:316 / / rw,relatime master:421 - overlay overlay rw,lowerdir=/var/lib/containerd/l1,upperdir=/u,workdir=/w
1280 1279 0:319 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1281 1279 0:320 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
1290 1279 0:45 /pvc-3a1b /mnt/checkpoints rw,relatime - nfs4 10.0.0.5:/export/pvc-3a1b rw,vers=4.1,rsize=1048576
1291 1279 8:16 / /mnt/scratch rw,relatime - ext4 /dev/sdb rw
1292 1279 0:77 / /dev/shm rw,nosuid,nodev - tmpfs shm rw,size=65536k
1293 1279 0:88 / /mnt/my\\040bucket rw - fuse.gcsfuse my-bucket rw,user_id=0
1294 1279 0:89 / /mnt/checkpoints/nested rw - tmpfs tmpfs rw
malformed line without separator
"""


def test_parse_mountinfo_fields_and_escapes():
    mounts = parse_mountinfo(POD)
    assert len(mounts) == 8
    nfs = mounts[3]
    assert (nfs.mount_point, nfs.fstype, nfs.source) == ("/mnt/checkpoints", "nfs4",
                                                         "10.0.0.5:/export/pvc-3a1b")
    assert mounts[6].mount_point == "/mnt/my bucket"


def test_mount_for_picks_the_deepest_mount():
    mounts = parse_mountinfo(POD)
    assert mount_for("/mnt/checkpoints/runs/job", mounts).fstype == "nfs4"
    assert mount_for("/mnt/checkpoints/nested/x", mounts).fstype == "tmpfs"
    assert mount_for("/mnt/checkpointsX", mounts).fstype == "overlay"
    assert mount_for("/mnt/checkpoints/../scratch/a", mounts).fstype == "ext4"


@pytest.mark.parametrize("fstype, shared", [
    ("nfs", True), ("nfs4", True), ("cephfs", True), ("fuse.s3fs", True), ("lustre", True),
    ("gpfs", True), ("overlay", False), ("tmpfs", False), ("ext4", False), ("xfs", False),
])
def test_shared_filesystem_types(fstype, shared):
    assert is_shared(fstype) is shared


MOUNT = "/mnt/checkpoints"


def test_in_kubernetes_a_pvc_path_is_accepted():
    path, verdict = check_storage_in_container("/mnt/checkpoints/runs/", MOUNT, POD, in_kubernetes=True)
    assert "nfs4" in verdict and "shared" in verdict and path == "/mnt/checkpoints/runs"


@pytest.mark.parametrize("path, mount, found", [
    ("/mnt/scratch/runs", "/mnt/scratch", "ext4"), ("/home/ray/runs", "/home/ray", "overlay"),
    ("/mnt/checkpoints/nested/runs", MOUNT, "tmpfs"),
])
def test_in_kubernetes_a_pod_disk_is_refused_with_the_fix(path, mount, found):
    with pytest.raises(StoragePolicyError) as e:
        check_storage_in_container(path, mount, POD, in_kubernetes=True)
    msg = str(e.value)
    assert found in msg and "--allow-ephemeral-storage" in msg and "\n" not in msg


@pytest.mark.parametrize("path, words", [
    ("/dev/shm/x", "scratch"), ("/data/runs", "outside the shared mount"), ("runs", "relative"),
    ("/home/ray/ray_results/x", "Ray's default"),
])
def test_in_kubernetes_the_render_policy_applies_first(path, words):
    """A job rendered by the Helm chart meets the storage policy here, with the fix."""
    with pytest.raises(StoragePolicyError, match=words):
        check_storage_in_container(path, MOUNT, POD, in_kubernetes=True)


def test_override_allows_it_but_says_so():
    _, verdict = check_storage_in_container("/mnt/scratch/runs", "/mnt/scratch", POD,
                                            in_kubernetes=True, allow_ephemeral=True)
    assert "NOT shared" in verdict


def test_object_stores_need_no_mount():
    path, verdict = check_storage_in_container("s3://bucket/runs", MOUNT, "", in_kubernetes=True)
    assert "object store" in verdict and path == "s3://bucket/runs"


def test_outside_kubernetes_the_local_policy_applies():
    assert "local directory" in check_storage_in_container("/data/runs", MOUNT, "",
                                                           in_kubernetes=False)[1]
    for bad in ("relative/x", "~/runs", "/tmp/runs"):
        with pytest.raises(StoragePolicyError):
            check_storage_in_container(bad, MOUNT, "", in_kubernetes=False)


def test_check_storage_here_reads_the_environment():
    assert "local directory" in check_storage_here("/data/runs", MOUNT, environ={})[1]


def test_this_machines_mountinfo_parses():
    with open("/proc/self/mountinfo") as f:
        mounts = parse_mountinfo(f.read())
    assert mount_for("/", mounts) is not None and mount_for("/", mounts).mount_point == "/"


# gVisor (9p root), Kata (virtiofs root), rootless (fuse-overlayfs root), and real volumes of
# the same types mounted at the PVC's path.
SANDBOX = """\
1 0 0:1 / / rw - {root} rootfs rw
2 1 0:2 / /proc rw - proc proc rw
3 1 0:3 / /mnt/checkpoints rw - {pvc} pvc-source rw
"""


@pytest.mark.parametrize("root", ["9p", "virtiofs", "fuse.fuse-overlayfs", "fuse"])
def test_a_sandbox_root_filesystem_is_not_shared_storage(root):
    info = SANDBOX.format(root=root, pvc="nfs4").replace(" /mnt/checkpoints ", " /mnt/other ")
    with pytest.raises(StoragePolicyError, match="container's root"):
        check_storage_in_container("/mnt/checkpoints/runs", MOUNT, info, in_kubernetes=True,
                                   resolve=lambda p: p)


@pytest.mark.parametrize("pvc", ["9p", "virtiofs", "fuse.juicefs"])
def test_9p_virtiofs_and_fuse_are_shared_when_they_are_the_mount_of_a_pvc(pvc):
    _, verdict = check_storage_in_container("/mnt/checkpoints/runs", MOUNT,
                                            SANDBOX.format(root="overlay", pvc=pvc),
                                            in_kubernetes=True, resolve=lambda p: p)
    assert "shared" in verdict and pvc in verdict


def test_a_symlink_under_the_mount_pointing_at_the_pods_disk_is_refused():
    """/mnt/checkpoints/runs -> /home/ray/runs: the policy sees the mount, the data lands on
    the overlay root."""
    resolve = {"/mnt/checkpoints/runs": "/home/ray/runs"}.get
    with pytest.raises(StoragePolicyError) as e:
        check_storage_in_container("/mnt/checkpoints/runs", MOUNT, POD, in_kubernetes=True,
                                   resolve=lambda p: resolve(p, p))
    assert "a symlink to /home/ray/runs" in str(e.value) and "overlay" in str(e.value)


def test_the_real_path_is_resolved_by_default(storage):
    real = storage / "real"
    real.mkdir()
    (storage / "link").symlink_to(real)
    info = f"1 0 0:1 / / rw - overlay overlay rw\n2 1 0:2 / {storage}/link rw - nfs4 srv:/x rw\n"
    with pytest.raises(StoragePolicyError, match="a symlink to"):
        check_storage_in_container(f"{storage}/link", f"{storage}/link", info,
                                   in_kubernetes=True)
