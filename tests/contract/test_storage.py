"""The storage policy table: every refusal of issue 2, and what is accepted."""

from __future__ import annotations

import pytest

from submitter.contract.errors import StoragePolicyError, UsageError
from submitter.contract.storage import (check_pod_file, check_access_mode, check_cluster_storage, check_local_storage,
                               check_mount)

MOUNT = "/mnt/checkpoints"


@pytest.mark.parametrize("path, kind, normalized", [
    ("s3://bucket/runs", "object-store", "s3://bucket/runs"),
    ("gs://bucket/runs", "object-store", "gs://bucket/runs"),
    ("abfss://container@account.dfs.core.windows.net/runs", "object-store",
     "abfss://container@account.dfs.core.windows.net/runs"),
    ("gcs://bucket/runs", "object-store", "gcs://bucket/runs"),
    ("abfs://container@account.dfs.core.windows.net/runs", "object-store",
     "abfs://container@account.dfs.core.windows.net/runs"),
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
    # #9 item 3: schemes the image's pyarrow cannot open, each with its fix
    ("S3://bucket/runs", ["lower case", "s3://"]),
    ("Gs://bucket/runs", ["lower case", "gs://"]),
    ("s3a://bucket/runs", ["cannot open", "s3://"]),
    ("s3n://bucket/runs", ["cannot open", "s3://"]),
    ("az://container/runs", ["cannot open", "abfss://"]),
    ("adl://store/runs", ["cannot open", "abfss://"]),
    ("wasbs://c@a.blob.core.windows.net/runs", ["cannot open", "abfss://"]),
    ("hdfs://namenode:8020/runs", ["cannot open", "libhdfs"]),
    ("viewfs://cluster/runs", ["cannot open", "libhdfs"]),
    ("oss://bucket/runs", ["unsupported scheme"]),
    ("cos://bucket/runs", ["unsupported scheme"]),
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


def test_every_accepted_object_store_scheme_is_one_pyarrow_opens():
    """OBJECT_STORE_SCHEMES is what the image's pyarrow resolves itself (no fsspec backend):
    from_uri may fail on credentials or a missing account, never on the scheme."""
    fs = pytest.importorskip("pyarrow.fs", reason="pyarrow is in the train extra")
    from submitter.contract.storage import OBJECT_STORE_SCHEMES

    for scheme in sorted(OBJECT_STORE_SCHEMES):
        try:
            fs.FileSystem.from_uri(f"{scheme}://container@account.dfs.core.windows.net/x"
                                   if scheme.startswith("abfs") else f"{scheme}://bucket/x")
        except Exception as e:  # noqa: BLE001  (network, credentials: not the scheme)
            assert "Unrecognized filesystem type" not in str(e), scheme
    for scheme in ("s3a", "az", "adl", "oss", "cos", "S3"):
        with pytest.raises(Exception, match="Unrecognized filesystem type"):
            fs.FileSystem.from_uri(f"{scheme}://bucket/x")


@pytest.mark.parametrize("path", ["s3://b/corpus/", "gs://b/x.parquet", "/mnt/checkpoints/d.txt",
                                  "/opt/data/corpus.txt"])
def test_pod_files_accepted(path):
    check_pod_file("--data", path, MOUNT)


@pytest.mark.parametrize("path, words", [
    ("corpus.txt", ["relative", "copy it", MOUNT, "s3://"]),
    ("./data/x.parquet", ["relative", "copy it"]),
    ("~/gpt2.tiktoken", ["home directory", "copy it"]),
    ("s3a://b/x", ["cannot open", "s3://"]),
    ("S3://b/x", ["lower case"]),
    ("file:///x", ["without file://"]),
])
def test_laptop_paths_refused_for_the_pod(path, words):
    with pytest.raises(StoragePolicyError) as info:
        check_pod_file("--bpe-file", path, MOUNT)
    message = str(info.value)
    assert "\n" not in message and message.startswith("--bpe-file")
    for word in words:
        assert word in message
