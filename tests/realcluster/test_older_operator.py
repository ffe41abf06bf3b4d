"""KubeRay v1.4.0 (the oldest the Go module proxy serves) in place of v1.5.0, its own CRDs with
it: what the rendered RayJob uses that the older CRD lacks is refused in one line naming the
field and the KubeRay version it needs, or left out on request; and the RayJob CRD missing
altogether exits 9."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.polling import wait_for
from tests.support.real_cluster import ControlPlane, control_plane_cli, job_file

OLDER = "v1.4.0"


@pytest.fixture(scope="module")
def older_operator(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    swapped = control_plane_cli("up", str(control_plane.root), env={"KUBERAY_VERSION": OLDER})
    assert swapped.returncode == 0, swapped.stdout + swapped.stderr
    assert f"KubeRay {OLDER} CRDs" in swapped.stdout, swapped.stdout
    try:
        yield control_plane
    finally:
        back = control_plane_cli("up", str(control_plane.root))
        assert back.returncode == 0, back.stdout + back.stderr


def test_token_auth_is_refused_naming_the_field_and_the_version(older_operator, tmp_path):
    result = older_operator.submitter("submit", "-f", str(job_file(tmp_path, name="rc-old", ray_auth="token")))
    assert result.returncode == 10, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "authOptions" in lines[0] and "1.5.1" in lines[0], lines
    assert older_operator.rayjob("rc-old") is None


def test_without_token_auth_the_job_is_accepted(older_operator, tmp_path):
    result = older_operator.submitter("submit", "-f", str(job_file(tmp_path, name="rc-old")), "--dry-run=server")
    assert result.returncode == 0, result.stdout + result.stderr
    assert older_operator.rayjob("rc-old") is None  # a dry run


def test_no_rayjob_crd_exits_9_and_says_how_to_install_it(older_operator, tmp_path):
    older_operator.apiext.delete_custom_resource_definition("rayjobs.ray.io")
    try:
        def gone() -> bool:
            return "rayjobs.ray.io" not in [c.metadata.name for c in
                                            older_operator.apiext.list_custom_resource_definition().items]
        wait_for("the CRD gone", gone, 120)
        result = older_operator.submitter("submit", "-f", str(job_file(tmp_path, name="rc-nocrd")))
        assert result.returncode == 9, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "KubeRay" in lines[0] and "install" in lines[0], lines
    finally:
        again = control_plane_cli("up", str(older_operator.root), env={"KUBERAY_VERSION": OLDER})
        assert again.returncode == 0, again.stdout + again.stderr
