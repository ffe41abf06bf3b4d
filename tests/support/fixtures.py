"""Fixtures every test folder may use (loaded by tests/conftest.py as a pytest plugin).

- `api`: a fresh Kubernetes API emulator on 127.0.0.1 (real HTTP, the RayJob CRD, namespace
  `default`), with fast client retries; `kubeconfig` points at it; `kube` is a client for it.
- `operator(name)`: a fake KubeRay operator that moves RayJobs through KubeRay's real status values.
- `cluster(name)`: the job's pods, their events, claims and RayCluster, as the cluster writes them.
- `storage`: a fresh absolute directory the local storage policy accepts (it refuses /tmp).
- `runner`: click's CLI runner.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.kube_emulator import Running, running_emulator


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    monkeypatch.setenv("SUBMITTER_API_BACKOFF", "0.01")
    with running_emulator() as running:
        yield running


@pytest.fixture
def kubeconfig(api: Running, tmp_path: Any) -> str:
    return api.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kube(kubeconfig: str) -> Any:
    from submitter.kube import Kube

    return Kube(kubeconfig=kubeconfig)


@pytest.fixture
def cluster(api: Running) -> Any:
    """`cluster(name, namespace="default")`: the job's pods, events, claims and RayCluster."""
    from tests.support.fake_operator import FakeCluster

    return lambda name, namespace="default": FakeCluster(api.emulator, name, namespace)


@pytest.fixture
def operator(api: Running) -> Any:
    """`operator(name, namespace="default")`: a fake operator for that RayJob."""
    from tests.support.fake_operator import FakeOperator

    return lambda name, namespace="default": FakeOperator(api.emulator, name, namespace)


def durable_dir(tmp_path_factory: Any) -> Iterator[Path]:
    """A fresh absolute directory outside the scratch trees the local policy refuses."""
    import tempfile

    base = Path(os.environ.get("SUBMITTER_TEST_RUNS",
                               Path.home() / ".cache" / "submitter-test-runs"))
    base.mkdir(parents=True, exist_ok=True)
    # unique across pytest sessions too (tmp_path_factory's names restart at r0 in each one)
    path = Path(tempfile.mkdtemp(prefix=tmp_path_factory.mktemp("r").name + "-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def storage(tmp_path_factory: Any) -> Iterator[Path]:
    yield from durable_dir(tmp_path_factory)


@pytest.fixture
def runner() -> Any:
    from click.testing import CliRunner

    return CliRunner()
