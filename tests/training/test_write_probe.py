"""The in-pod write probe: the storage path must take a file from the pod's user before
training starts; a refusal names the owner and mode found and the fixes, in one line."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from submitter.contract.errors import StoragePolicyError
from training.run.mounts import PROBE_PREFIX, check_writable

NOBODY = 65534


def _denied(directory: str) -> None:
    raise PermissionError(errno.EACCES, "Permission denied")


def test_a_writable_path_passes_and_leaves_nothing_behind(storage):
    check_writable(str(storage))
    check_writable(str(storage / "not" / "made" / "yet"))  # probed where it would be made
    assert os.listdir(storage) == []


def test_a_refusal_names_owner_mode_and_the_fixes_in_one_line(storage):
    os.chmod(storage, 0o755)
    with pytest.raises(StoragePolicyError) as e:
        check_writable(str(storage / "runs"), probe=_denied, uid=1000, gid=100)
    text = str(e.value)
    assert "\n" not in text
    st = os.stat(storage)
    assert f"owned by uid {st.st_uid} gid {st.st_gid} with mode 0755 (drwxr-xr-x)" in text
    assert "not writable by the pod's user (uid 1000, gid 100)" in text
    assert "EFS access point with PosixUser 1000:100" in text
    assert "all_squash,anonuid=1000" in text and "--existing-pvc" in text
    assert "Permission denied" in text and f"{storage} (where {storage / 'runs'} would be made)" in text


def test_a_read_only_volume_says_so():
    def read_only(directory: str) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    with pytest.raises(StoragePolicyError, match="read-only filesystem.*read-write"):
        check_writable("/mnt/checkpoints", probe=read_only)


PROBE_AS = """
import errno, json, os, stat, sys
from submitter.contract.errors import StoragePolicyError
from training.run.mounts import check_writable
os.setgroups([]); os.setgid(%d); os.setuid(%d)  # imports first: the venv may be root's alone
try:
    check_writable(sys.argv[1])
    print(json.dumps({"ok": True}))
except StoragePolicyError as e:
    print(json.dumps({"ok": False, "error": str(e)}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the probe as another uid (setuid)")
def test_the_probe_really_runs_as_the_pods_user(tmp_path_factory):
    """A root-owned 0755 export (Filestore's default) refuses uid 65534; 0777 admits it."""
    import shutil
    import tempfile
    from pathlib import Path

    storage = Path(tempfile.mkdtemp(prefix="probe-", dir="/tmp"))  # every parent open to others
    try:
        _probe_as_nobody(storage)
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def _probe_as_nobody(storage) -> None:
    os.chown(storage, 0, 0)
    os.chmod(storage, 0o755)

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", PROBE_AS % (NOBODY, NOBODY), str(storage)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    refused = run()
    assert refused["ok"] is False
    assert f"uid {NOBODY}, gid {NOBODY}" in refused["error"]
    assert "owned by uid 0 gid 0 with mode 0755" in refused["error"]
    os.chmod(storage, 0o777)
    assert run() == {"ok": True}
    assert not [n for n in os.listdir(storage) if n.startswith(PROBE_PREFIX)]


def test_the_entrypoint_fails_before_ray_starts(storage, monkeypatch, capsys):
    """`python -m training` refuses the run at its first step: exit 2, one line, Ray never
    started (prepare_run comes before the run)."""
    from training import __main__ as entry, driver
    from training.run import mounts

    real = mounts.check_writable
    monkeypatch.setattr(mounts, "check_writable", lambda path: real(path, probe=_denied, uid=1000, gid=100))
    monkeypatch.setattr(driver, "run", lambda *a, **k: pytest.fail("training started"))
    code = entry.main(["--name", "probe", "--storage-path", str(storage)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: --storage-path") and err.count("\n") == 1
    assert "not writable by the pod's user (uid 1000, gid 100)" in err


@pytest.mark.parametrize("ok,status,code", [(True, "finished", 0), (False, "stopped", 0),
                                            (False, "failed", 1)])
def test_the_entrypoints_exit_code_says_whether_kuberay_should_retry(storage, monkeypatch,
                                                                     ok, status, code):
    """A run stopped by its --deadline or --max-cost saved its checkpoint and ended as asked:
    exit 0, so KubeRay's backoffLimit does not start a new cluster only to be refused; a
    failure exits 1 (retried)."""
    from types import SimpleNamespace

    from training import __main__ as entry, driver

    outcome = SimpleNamespace(ok=ok, state=SimpleNamespace(status=status))
    monkeypatch.setattr(driver, "run", lambda *a, **k: outcome)
    assert entry.main(["--name", "limits", "--storage-path", str(storage)]) == code
