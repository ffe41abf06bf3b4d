"""#10 item 1: where the images come from. The Dockerfile's two targets, the release workflow and
the defaults a job uses must name the same images, pinned to the project's version."""

from __future__ import annotations

import re
import tomllib

import yaml

from submitter import __version__
from submitter.contract import naming
from submitter.contract.spec import (DEFAULT_GPU_IMAGE, DEFAULT_IMAGE, IMAGE_REPOSITORY,
                                     RAY_VERSION, VERSION, JobSpec)
from tests.conftest import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _stages() -> dict[str, str]:
    """Each build stage's text, by its name."""
    parts = re.split(r"^FROM ", DOCKERFILE, flags=re.M)[1:]
    return {re.match(r"\S+ AS (\S+)", p)[1]: "FROM " + p for p in parts}


def test_one_version_everywhere():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts" / "submitter" / "Chart.yaml").read_text())["appVersion"]
    assert VERSION == __version__ == pyproject == chart


def test_default_images_are_fully_qualified_and_pinned():
    assert DEFAULT_IMAGE == f"{IMAGE_REPOSITORY}:{VERSION}"
    assert DEFAULT_GPU_IMAGE == f"{IMAGE_REPOSITORY}:{VERSION}-gpu"
    assert IMAGE_REPOSITORY.startswith("ghcr.io/")
    assert JobSpec.build(name="c").resolved_image == DEFAULT_IMAGE
    assert JobSpec.build(name="g", gpu_per_pod=1).resolved_image == DEFAULT_GPU_IMAGE


def test_dockerfile_has_a_cpu_and_a_gpu_target_on_the_ray_version():
    stages = _stages()
    assert {"cpu", "gpu"} <= set(stages)
    assert list(stages)[-1] == "cpu"  # `docker build .` gives the CPU image
    assert f"ARG RAY_VERSION={RAY_VERSION}" in DOCKERFILE
    assert stages["gpu"].startswith("FROM rayproject/ray:${RAY_VERSION}-py311-gpu AS gpu")
    assert stages["cpu"].startswith("FROM rayproject/ray:${RAY_VERSION}-py311-cpu AS cpu")
    assert "whl/cpu" in stages["cpu"] and "whl/cpu" not in stages["gpu"]
    assert "whl/${TORCH_CUDA}" in stages["gpu"]
    for target in ("cpu", "gpu"):
        text = stages[target]
        assert "USER 1000:100" in text  # the RayJob's runAsUser/runAsGroup
        assert f"{naming.ENV_GPT2_BPE}={naming.IMAGE_GPT2_BPE}" in text
        assert f"COPY --from=bpe /out/gpt2.tiktoken {naming.IMAGE_GPT2_BPE}" in text


def test_the_bpe_file_is_checksummed_at_build_time():
    bpe = _stages()["bpe"]
    assert "openai-whisper==${WHISPER_VERSION}" in bpe and "sha256sum -c" in bpe
    assert re.search(r"ARG BPE_SHA256=[0-9a-f]{64}\n", bpe)


def test_release_workflow_pushes_both_targets_with_the_version():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "images.yml").read_text())
    triggers = flow[True]  # YAML 1.1 reads the key `on` as true
    assert triggers["push"]["tags"] == ["v*"]
    assert flow["permissions"]["packages"] == "write"
    job = flow["jobs"]["image"]
    assert {(m["target"], m["suffix"]) for m in job["strategy"]["matrix"]["include"]} == {
        ("cpu", ""), ("gpu", "-gpu")}
    build = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("docker/build-push-action"))
    assert build["with"]["target"] == "${{ matrix.target }}"
    assert build["with"]["tags"].endswith(":${{ steps.version.outputs.version }}${{ matrix.suffix }}")
    version_step = next(s for s in job["steps"] if s.get("id") == "version")
    assert "submitter-gpt2" in version_step["run"] and IMAGE_REPOSITORY.endswith("/submitter-gpt2")


def test_the_pinned_checksum_is_the_gpt2_ranks_file(tmp_path):
    """The project's shared copy of whisper's gpt2.tiktoken has the checksum the build checks."""
    import hashlib

    from tests.conftest import shared_file

    digest = hashlib.sha256(shared_file("data", "gpt2.tiktoken").read_bytes()).hexdigest()
    assert f"ARG BPE_SHA256={digest}\n" in DOCKERFILE


def test_the_build_context_keeps_what_the_wheel_needs():
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    needed = {"pyproject.toml", "README.md", "submitter", "training", "manifests"}
    assert not ignored & needed
    for path in needed:
        assert f"COPY {path} " in DOCKERFILE or f"COPY pyproject.toml README.md" in DOCKERFILE
