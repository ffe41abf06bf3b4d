"""The stack check asks only for what the job uses (#28 item 4): `datasets` for a Hugging Face
Hub data set alone; local files, a directory, an object-store URI or python-stdlib start
without it. The slow test hides `datasets` from every process and trains on a local file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from submitter.contract import stack
from submitter.contract.errors import UsageError


@pytest.fixture
def no_datasets(monkeypatch):
    real = stack.importlib.util.find_spec
    monkeypatch.setattr(stack.importlib.util, "find_spec",
                        lambda name: None if name == "datasets" else real(name))


@pytest.mark.parametrize("dataset, data", [
    ("python-stdlib", None), ("Salesforce/wikitext", "/data/corpus.txt"),
    ("Salesforce/wikitext", "/data/shards/"), ("Salesforce/wikitext", "s3://bucket/corpus/"),
    (None, None),  # export: no data at all
])
def test_no_hub_data_set_needs_no_datasets(no_datasets, dataset, data):
    assert "datasets" not in stack.modules_for(dataset, data)
    stack.require_training_stack("python -m training", dataset, data)  # no error


def test_a_hub_data_set_still_needs_it_and_says_why(no_datasets):
    assert stack.modules_for("Salesforce/wikitext", None)[-1] == "datasets"
    with pytest.raises(UsageError) as e:
        stack.require_training_stack("python -m training", "Salesforce/wikitext", None)
    assert "datasets is not installed (for the Hugging Face data set; --data FILE" in str(e.value)
    assert 'pip install "submitter-gpt2[train]"' in str(e.value) and e.value.exit_code == 2


def test_the_entrypoint_passes_the_jobs_data_to_the_check(no_datasets, monkeypatch, capsys, tmp_path):
    """`python -m training --data FILE` gets past the check without datasets (to the storage
    check, stubbed here); the Hub default does not."""
    import training.__main__ as entry
    import training.driver as driver

    reached = []

    def prepare_run(spec):
        reached.append(spec.data)
        raise UsageError("stop here")

    monkeypatch.setattr(driver, "prepare_run", prepare_run)
    assert entry.main(["--name", "x", "--data", str(tmp_path / "c.txt"), "--storage-path", str(tmp_path)]) == 2
    assert reached == [str(tmp_path / "c.txt")]
    assert entry.main(["--name", "x", "--storage-path", str(tmp_path)]) == 2
    assert "datasets is not installed" in capsys.readouterr().err and len(reached) == 1


#: Makes `datasets` unimportable (and invisible to find_spec) in every Python process that
#: starts with this directory on PYTHONPATH: the driver, Ray's workers, Ray Data's tasks.
HIDE_DATASETS = textwrap.dedent("""\
    import sys
    sys.modules["datasets"] = None
""")


@pytest.mark.slow
def test_a_local_data_run_trains_without_datasets(storage, tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_DATASETS)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a small local corpus, no hub needed.\n" for i in range(3000)))
    env = {**os.environ, "PYTHONPATH": f"{hide}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('datasets'))"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "None"  # hidden indeed
    proc = subprocess.run([sys.executable, "-m", "training", "--name", "no-datasets", "--data", str(corpus),
                           "--storage-path", str(storage), "--model", "tiny", "--tokenizer", "byte",
                           "--replicas", "1", "--epochs", "1", "--max-steps-per-epoch", "2",
                           "--val-steps", "1"],
                          env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run_finished" in proc.stdout


def test_every_install_hint_names_this_projects_distribution():
    """`submitter` on PyPI is another project (issue 33): pyproject's name is DISTRIBUTION, and
    no page, hint or comment says `pip install submitter` or `submitter[extra]`."""
    import re
    import tomllib

    from tests.conftest import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == stack.DISTRIBUTION
    assert f"{stack.DISTRIBUTION}[docs]" in " ".join(project["optional-dependencies"]["test"])
    wrong = re.compile(r"""pip install\s+(?:-U\s+)?['"]?submitter(?![-\w])|(?<![-\w/])submitter\[""")
    files = [ROOT / "README.md", ROOT / "pyproject.toml", *(ROOT / "docs").rglob("*.md"),
             *(ROOT / "charts").rglob("*.*"), *(ROOT / "submitter").rglob("*.py"),
             *(ROOT / "training").rglob("*.py")]
    found = [f"{f.relative_to(ROOT)}:{n}" for f in files
             for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1) if wrong.search(line)]
    assert found == [], "say pip install submitter-gpt2 (stack.DISTRIBUTION)"
