"""The real control plane for the `realcluster` tests: `scripts/control-plane up` once a session
(or the one SUBMITTER_CONTROL_PLANE names, already up; it is then left running)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.real_cluster import ControlPlane, control_plane_cli, why_not


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/realcluster/" in item.nodeid:
            item.add_marker(pytest.mark.realcluster)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    why = why_not()
    if why:
        pytest.skip(f"real control plane: {why}")
    existing = os.environ.get("SUBMITTER_CONTROL_PLANE")
    root = Path(existing) if existing else tmp_path_factory.mktemp("control-plane")
    up = control_plane_cli("up", str(root))
    if up.returncode:
        pytest.fail(f"scripts/control-plane up failed:\n{up.stdout}\n{up.stderr}")
    try:
        yield ControlPlane(root)
    finally:
        if not existing:
            down = control_plane_cli("down", str(root), timeout=600)
            assert down.returncode == 0, down.stdout + down.stderr
