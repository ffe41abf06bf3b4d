"""Where the shared data lives; the fixtures come from tests/support/fixtures.py."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

pytest_plugins = ["tests.support.fixtures", "tests.support.s3"]


def shared_file(*parts: str) -> Path:
    """A file from ../shared (real data, CRDs); skip the test with the reason when absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared data folder must sit beside the project")
    return path
