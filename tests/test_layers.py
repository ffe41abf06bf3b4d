"""The walls between the parts, as declared in .importlinter, and what each install needs.

import-linter builds the import graph of `submitter` and `training` (every import statement,
inside functions too) and checks the contracts: the contract package is stdlib-only and imports
neither side; the CLI never imports the entrypoint or the training stack; the entrypoint imports
only the contract; only `submitter.kube` and `training.events.progress_configmap` import kubernetes;
both packages are layered.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_the_import_contracts_hold():
    proc = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import "
                           "lint_imports_command; sys.exit(lint_imports_command())"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "0 broken" in report and "11 kept" in report, report


def test_the_entrypoint_loads_heavy_libraries_only_where_it_trains():
    """Importing any entrypoint module stays cheap (the driver, the Ray workers and the data
    tasks import them); ray, torch and transformers load inside the functions that need them."""
    code = ("import sys, training.args, training.gpt2.config, training.events.emitter, training.run.mounts, "
            "training.gpt2.loop, training.driver, training.data.tokens, training.gpt2.model, training.data.pipeline, "
            "training.__main__, training.events.progress_configmap, training.script; print(sorted(m for m in "
            "('kubernetes', 'ray', 'torch', 'transformers', 'yaml', 'jinja2', 'click') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_cli_install_has_no_training_stack_and_the_extra_has_all_of_it():
    """`pip install submitter-gpt2` is the CLI; `submitter-gpt2[train]` adds what the entrypoint checks for."""
    import re
    import tomllib

    from submitter.contract.stack import TRAINING_MODULES

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for r in requirements}

    base, train = names(project["dependencies"]), names(project["optional-dependencies"]["train"])
    assert base == {"kubernetes", "pyyaml", "jinja2", "click", "rich"}
    assert set(TRAINING_MODULES) <= train and not base & train
