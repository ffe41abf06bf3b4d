"""Which install a command needs: `pip install submitter-gpt2` is the CLI; training needs an extra.

The distribution is `submitter-gpt2` (`DISTRIBUTION`): `submitter` on PyPI is another project.
The import package and the command are `submitter`; every install hint names the distribution.

`submit --local` (on the laptop) and `python -m training` (anywhere) both check for the
training stack before they start, and say the exact pip command when it is missing. They ask
only for what the job uses: `datasets` serves Hugging Face Hub data sets alone, so a job that
reads local files, a directory, an object-store URI (`--data`) or the offline corpus
(`python-stdlib`) starts without it (a GPU image without `datasets` trains on its own data).
"""

from __future__ import annotations

import importlib.util
from typing import Optional

from submitter.contract.errors import UsageError
from submitter.contract.naming import OFFLINE_DATASET

#: This project's name on PyPI (pyproject.toml's [project] name).
DISTRIBUTION = "submitter-gpt2"


def pip_install(extra: str, note: str = "") -> str:
    """The command that installs one of the project's extras (quoted for any shell), and its
    form in a clone of the repository (the way to install before a release is on PyPI)."""
    return f'pip install "{DISTRIBUTION}[{extra}]" (in a checkout: pip install -e ".[{extra}]"{note})'


#: Top-level modules every training run imports.
CORE_MODULES = ("ray", "torch", "transformers", "tiktoken", "pyarrow")
#: ... and those only a Hugging Face Hub data set needs.
HUB_MODULES = ("datasets",)
#: Everything the `train` extra must install.
TRAINING_MODULES = CORE_MODULES + HUB_MODULES
INSTALL_TRAIN = pip_install("train", "; for CPU-only torch install torch==2.13.0 from "
                                     "https://download.pytorch.org/whl/cpu first")


def uses_hub_dataset(dataset: Optional[str], data: Optional[str]) -> bool:
    """Whether a job reads a Hugging Face Hub data set (no --data, and not the offline corpus).
    Unknown (both None, e.g. `submitter export`): no."""
    return not data and dataset is not None and dataset != OFFLINE_DATASET


def modules_for(dataset: Optional[str] = None, data: Optional[str] = None) -> tuple[str, ...]:
    """The modules a job with this data needs."""
    return CORE_MODULES + (HUB_MODULES if uses_hub_dataset(dataset, data) else ())


def missing_training_modules(modules: tuple[str, ...] = TRAINING_MODULES) -> list[str]:
    """The given modules that cannot be imported here (found without importing)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require_training_stack(what: str, dataset: Optional[str] = None,
                           data: Optional[str] = None) -> None:
    """UsageError (exit 2, the pip command) when what this job needs is not installed."""
    missing = missing_training_modules(modules_for(dataset, data))
    if missing:
        hub = " (for the Hugging Face data set; --data FILE or --dataset python-stdlib need none)" \
            if missing == list(HUB_MODULES) else ""
        raise UsageError(f"{what} needs the training stack, and {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not installed{hub}: {INSTALL_TRAIN}")
