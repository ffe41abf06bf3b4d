"""The storage policy table: every refusal of issue 2, and what is accepted."""

from __future__ import annotations

import pytest

from submitter.contract.errors import StoragePolicyError, UsageError
from submitter.contract.storage import (check_access_mode, check_cluster_storage, check_local_storage,
                               check_mount)

MOUNT = "/mnt/checkpoints"


@pytest.mark.parametrize("path, kind, normalized", [
    ("s3://bucket/runs", "object-store", "s3://bucket/runs"),
    ("gs://bucket/runs", "object-store", "gs://bucket/runs"),
    ("abfss://container@account.dfs.core.windows.net/runs", "object-store",
     "abfss://container@account.dfs.core.windows.net/runs"),
    ("hdfs://namenode:8020/runs", "object-store", "hdfs://namenode:8020/runs"),
    ("/mnt/checkpoints", "shared-mount", "/mnt/checkpoints"),
    ("/mnt/checkpoints/runs", "shared-mount", "/mnt/checkpoints/runs"),
    ("/mnt/checkpoints/a/../runs/", "shared-mount", "/mnt/checkpoints/runs"),
    ("file:///mnt/checkpoints/runs", "shared-mount", "/mnt/checkpoints/runs"),
])
def test_accepted(path, kind, normalized):
    decision = check_cluster_storage(path, MOUNT)
    assert (decision.kind, decision.path) == (kind, normalized)


@pytest.mark.parametrize("path, words", [
    ("runs", ["relative"]),
    ("./runs", ["relative"]),
    ("~/checkpoints", ["'~'"]),
    ("~", ["'~'"]),
    ("~/ray_results", ["'~'"]),
    ("/home/ray/ray_results", ["Ray's default"]),
    ("/home/ray/ray_results/gpt2", ["Ray's default"]),
    ("/tmp/ckpt", ["/tmp", "scratch"]),
    ("/tmp", ["/tmp"]),
    ("/data/runs", ["outside the shared mount", MOUNT]),
    ("/mnt/checkpoints-other/runs", ["outside the shared mount"]),
    ("/mnt/checkpoints/../etc", ["outside the shared mount"]),
    ("local:///mnt/checkpoints/runs", ["local://"]),
    ("file:///data/runs", ["file://", "outside the shared mount"]),
    ("file://host/mnt/checkpoints/runs", ["file://"]),
    ("ftp://server/runs", ["unsupported scheme"]),
    ("s3:///no-bucket", ["no bucket"]),
])
def test_refused_with_reason_and_fix(path, words):
    with pytest.raises(StoragePolicyError) as info:
        check_cluster_storage(path, MOUNT)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    # every refusal names a way out
    assert "use " in message
    assert info.value.exit_code == 2 and isinstance(info.value, UsageError)


@pytest.mark.parametrize("mode", ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteOncePod"])
def test_access_modes_other_than_rwx_refused(mode):
    with pytest.raises(StoragePolicyError, match="ReadWriteMany"):
        check_access_mode(mode)


def test_rwx_accepted():
    check_access_mode("ReadWriteMany")


@pytest.mark.parametrize("mount", ["relative", "/", "/tmp", "/tmp/x", "/dev/shm", "/home", "/proc/x"])
def test_bad_mounts_refused(mount):
    with pytest.raises(StoragePolicyError):
        check_mount(mount)


@pytest.mark.parametrize("path", ["runs", "~/runs", "/tmp/runs", "/home/ray/ray_results",
                                  "local:///x", "/var/tmp/x"])
def test_local_refusals_hold(path):
    with pytest.raises(StoragePolicyError):
        check_local_storage(path)


@pytest.mark.parametrize("path, expected", [
    ("/work/runs", "/work/runs"),
    ("/work/runs/", "/work/runs"),
    ("file:///work/runs", "/work/runs"),
    ("s3://bucket/x", "s3://bucket/x"),
])
def test_local_accepts_absolute_dirs(path, expected):
    assert check_local_storage(path) == expected


@pytest.mark.parametrize("path, scheme, local", [
    ("/mnt/x", "", "/mnt/x"), ("file:///mnt/x", "file", "/mnt/x"), ("FILE:///mnt/x", "FILE", "FILE:///mnt/x"),
    ("S3://b/x", "S3", "S3://b/x"), ("relative", "", "relative"), ("/mnt/a://b", "", "/mnt/a://b")])
def test_scheme_and_local_path_are_read_one_way_everywhere(path, scheme, local):
    from submitter.contract.storage import local_path, scheme_of

    assert (scheme_of(path), local_path(path)) == (scheme, local)


@pytest.mark.parametrize("path", ["S3://b/x", "GS://b/x", "FILE:///mnt/checkpoints/x"])
def test_an_upper_case_scheme_is_refused_with_the_spelling_that_works(path):
    with pytest.raises(StoragePolicyError) as e:
        check_cluster_storage(path, "/mnt/checkpoints")
    assert "lower case" in str(e.value) or "unsupported scheme" in str(e.value)
