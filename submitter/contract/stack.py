"""Which install a command needs: `pip install submitter` is the CLI; training needs an extra.

`submit --local` (on the laptop) and `python -m training` (anywhere) both check for the
training stack before they start, and say the exact pip command when it is missing.
"""

from __future__ import annotations

import importlib.util

from submitter.contract.errors import UsageError

#: Top-level modules of the `train` extra the entrypoint cannot start without.
TRAINING_MODULES = ("ray", "torch", "transformers", "tiktoken", "datasets", "pyarrow")
INSTALL_TRAIN = ('pip install "submitter[train]" (in a checkout: pip install -e ".[train]"; '
                 "for CPU-only torch install torch==2.13.0 from https://download.pytorch.org/whl/cpu first)")


def missing_training_modules() -> list[str]:
    """The training stack's modules that cannot be imported here (found without importing)."""
    return [m for m in TRAINING_MODULES if importlib.util.find_spec(m) is None]


def require_training_stack(what: str) -> None:
    missing = missing_training_modules()
    if missing:
        raise UsageError(f"{what} needs the training stack, and {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL_TRAIN}")
