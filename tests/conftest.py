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


# --- `.ci/run` fails when the real-cluster tests did not run -----------------------------------
# (SUBMITTER_REQUIRE_REALCLUSTER=1): where Go or namespaces are missing they skip with the
# reason, which is right on a laptop and wrong in CI.
_realcluster = {"passed": 0, "skipped": []}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "realcluster" not in report.keywords:
        return
    if report.skipped:
        _realcluster["skipped"].append(report.nodeid)
    elif report.when == "call" and report.passed:
        _realcluster["passed"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import os

    if os.environ.get("SUBMITTER_REQUIRE_REALCLUSTER") != "1" or session.config.option.collectonly:
        return
    if _realcluster["skipped"] or not _realcluster["passed"]:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        why = f"{len(_realcluster['skipped'])} skipped" if _realcluster["skipped"] else "none ran"
        if reporter is not None:
            reporter.write_line(f"SUBMITTER_REQUIRE_REALCLUSTER=1: the realcluster tests must run ({why})",
                                red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
