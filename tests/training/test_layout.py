"""The training wing's layout keeps every name that pods, images, charts, docs and users call.

A rendered job (GPT-2 and `--script`) names the modules its pods run (the entrypoint, the preStop
hook, Ray's worker setup hooks); the docs and the Dockerfile name more. Each must resolve here,
and each `python -m` program must start. The wheel the image installs must hold every module.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

from submitter.contract.spec import JobSpec
from submitter.render import render

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROGRAM = re.compile(r"python3? -m (training(?:\.\w+)*)")
DOTTED = re.compile(r"(?<![\w./-])(training(?:\.\w+)+)")


def _walk(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        if value[:2] in (["python", "-m"], ["python3", "-m"]):
            yield " ".join(map(str, value))
        for v in value:
            yield from _walk(v)
    elif isinstance(value, str):
        yield value


def _rendered_strings(tmp_path) -> list[str]:
    (tmp_path / "train.py").write_text("import ray.train\n")
    jobs = [JobSpec.build(name="gpt", replicas=2), JobSpec.build(name="mine", script=str(tmp_path / "train.py"))]
    return [s for spec in jobs for obj in render(spec) for s in _walk(obj)]


def _resolves(dotted: str) -> bool:
    """A module, or an attribute of one (`training.script.worker_setup`)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        obj = module
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return False
        return True
    return False


def test_every_module_a_rendered_pod_runs_resolves_and_starts(tmp_path):
    strings = _rendered_strings(tmp_path)
    programs = {m for s in strings for m in PROGRAM.findall(s)}
    assert {"training", "training.run_script", "training.prestop"} <= programs, programs
    for program in sorted(programs):
        proc = subprocess.run([sys.executable, "-m", program, "--help"], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0 and "usage" in proc.stdout.lower(), (program, proc.stderr[-2000:])
    hooks = {"training.driver.worker_setup", "training.script.worker_setup"}
    for name in hooks:
        assert _resolves(name), name
    names = {m for s in strings for m in DOTTED.findall(s)}
    assert all(_resolves(n) for n in names), [n for n in names if not _resolves(n)]


def _named_in(paths) -> set[str]:
    names = set()
    for path in paths:
        text = path.read_text()
        names |= set(DOTTED.findall(text))
        names |= {f"training.{m}" for m in re.findall(r"from training\.([\w.]+) import", text)}
    return {n.rstrip(".") for n in names}


def test_every_training_name_the_docs_and_images_give_resolves():
    paths = [ROOT / "README.md", ROOT / "Dockerfile", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "charts").rglob("*.yaml")), *sorted((ROOT / "manifests").glob("*.j2")),
             *sorted((ROOT / "scripts").glob("*.sh"))]
    names = _named_in(paths)
    assert {"training.script", "training.gpu_smoke", "training.prestop"} <= names, names
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, missing
    files = {f for p in paths for f in re.findall(r"(?<![\w./-])(training/[\w/]+\.py)", p.read_text())}
    assert files, "the scan found no training/*.py path in the docs"  # it reads what it should
    assert not sorted(f for f in files if not (ROOT / f).is_file())


def test_the_gpu_smoke_command_and_the_public_script_module_keep_their_names():
    proc = subprocess.run([sys.executable, "-m", "training.gpu_smoke", "--help"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    from training.script import Preempted, should_stop  # what users' scripts import
    assert callable(should_stop) and issubclass(Preempted, RuntimeError)


@pytest.mark.parametrize("old, new", [("model", "gpt2.model"), ("compiling", "gpt2.compiling"),
                                      ("preempt", "run.preempt"), ("trackers", "events.trackers"),
                                      ("smoke_step", "smoke.step"),
                                      ("flops", "submitter.contract.flops")])
def test_the_old_flat_names_are_the_same_modules(old, new):
    """The shared GPU reference step imports `training.model` and `training.compiling`."""
    new = new if new.startswith("submitter.") else f"training.{new}"
    assert importlib.import_module(f"training.{old}") is importlib.import_module(new)
    exec(f"from training import {old} as m", ns := {})
    assert ns["m"] is importlib.import_module(new)


def test_the_old_names_cover_every_module_that_moved():
    from training import _moved

    for old in _moved.MOVED:
        assert not (ROOT / "training" / f"{old}.py").exists(), old  # a real module would win
        assert importlib.util.find_spec(_moved.home(old)) is not None, old


def test_each_room_opens_with_what_it_holds():
    rooms = [p.parent for p in (ROOT / "training").glob("*/__init__.py")]
    assert {r.name for r in rooms} >= {"gpt2", "data", "run", "events", "script", "smoke"}
    for room in rooms:
        doc = importlib.import_module(f"training.{room.name}").__doc__ or ""
        assert len(doc.split()) >= 20 and "import" in doc.lower(), room.name  # what, and what it may import


def test_the_wheel_holds_every_training_module(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("*.whl"))
    inside = set(zipfile.ZipFile(wheel).namelist())
    here = {p.relative_to(ROOT).as_posix() for d in ("training", "submitter")
            for p in (ROOT / d).rglob("*.py")}
    assert here - inside == set()
    assert any(n.startswith("manifests/") and n.endswith(".yaml.j2") for n in inside)
