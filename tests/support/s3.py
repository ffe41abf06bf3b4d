"""A real S3-protocol server on 127.0.0.1 for object-storage tests: moto's server mode.

moto pulls botocore, which pins `python-dateutil<3` while the kubernetes client wants `>=3`,
so moto cannot share the project's environment. The server runs as its own process, under the
first Python that has moto >= 5.2.5 (older servers answer pyarrow's CompleteMultipartUpload in a
way it rejects): $SUBMITTER_MOTO_PYTHON, this interpreter, or the one this virtual environment
was made from. `.ci/run` makes one in `.venv-moto`. Clients reach it the way they would reach
AWS: pyarrow (and so Ray Train) follow `AWS_ENDPOINT_URL`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import pytest

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}


MOTO_MIN = (5, 2, 5)
_VERSION_CHECK = ("import moto, moto.server; "
                  f"assert tuple(int(x) for x in moto.__version__.split('.')[:3]) >= {MOTO_MIN}")


def moto_python() -> Optional[str]:
    """A Python interpreter that can run `python -m moto.server`, or None."""
    candidates = [os.environ.get("SUBMITTER_MOTO_PYTHON"), sys.executable,
                  getattr(sys, "_base_executable", None)]
    for python in filter(None, candidates):
        try:
            ok = subprocess.run([python, "-c", _VERSION_CHECK], capture_output=True,
                                timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return python
    return None


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str]

    def make_bucket(self, bucket: str) -> None:
        self.filesystem(allow_bucket_creation=True).create_dir(bucket)

    def filesystem(self, **kwargs):
        from pyarrow import fs

        return fs.S3FileSystem(endpoint_override=self.endpoint, scheme="http",
                               access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                               secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                               region=CREDENTIALS["AWS_REGION"], **kwargs)

    def read_text(self, key: str) -> Optional[str]:
        """The object at `bucket/key` as text, or None when absent."""
        from pyarrow import fs

        s3 = self.filesystem()
        if s3.get_file_info(key).type != fs.FileType.File:
            return None
        with s3.open_input_stream(key) as f:
            return f.read().decode()

    def list(self, prefix: str) -> list[str]:
        from pyarrow import fs

        infos = self.filesystem().get_file_info(fs.FileSelector(prefix, recursive=True,
                                                                allow_not_found=True))
        return sorted(i.path for i in infos)


MOTO_MISSING = ("no Python with moto[server]>=5.2.5 here: python3 -m venv .venv-moto && "
                ".venv-moto/bin/pip install 'moto[server]>=5.2.5,<6', then set "
                "SUBMITTER_MOTO_PYTHON=$PWD/.venv-moto/bin/python (.ci/run does this)")


@contextlib.contextmanager
def running_s3(host: str = "127.0.0.1") -> Iterator[S3Server]:
    """moto's S3 server on a free port of `host` (loopback, or the address pods reach the
    machine at in the real-control-plane tests); skips the test where moto is missing."""
    python = moto_python()
    if python is None:
        pytest.skip(MOTO_MISSING)
    port = _free_port(host)
    proc = subprocess.Popen([python, "-m", "moto.server", "-H", host, "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("moto's S3 server did not start")
            time.sleep(0.2)
    endpoint = f"{host}:{port}"
    try:
        yield S3Server(endpoint, {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://{endpoint}"})
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port; AWS_* variables point every client at it."""
    with running_s3() as server:
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        yield server
