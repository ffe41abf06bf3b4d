"""The modules' old flat names (`training.model`, `training.trackers`, ...) as aliases of their
new homes, for code written against the flat layout: the shared GPU reference step
(`from training.model import ...`), users' notebooks, pickles that name a class by module.

An import of an old name loads the new module and binds the same module object under both
names (one module, one state: `training.preempt.requested` is `training.run.preempt.requested`).
New code imports the new names; the job itself never goes through here. Stdlib only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
from importlib.machinery import ModuleSpec
from typing import Optional, Sequence

#: old flat name -> where the module lives now (under `training.`, or a full name).
MOVED = {
    "flops": "submitter.contract.flops",  # the FLOPs and peak table: render uses it too
    "model": "gpt2.model", "loss": "gpt2.loss", "compiling": "gpt2.compiling",
    "precision": "gpt2.precision", "parallel": "gpt2.parallel", "comm": "gpt2.comm",
    "schedule": "gpt2.schedule", "microbatch": "gpt2.microbatch", "input_path": "gpt2.input_path",
    "loop": "gpt2.loop", "config": "gpt2.config", "export": "gpt2.export",
    "elastic": "gpt2.elastic",
    "tokens": "data.tokens",
    "run_identity": "run.identity", "mounts": "run.mounts", "object_store": "run.object_store",
    "checkpoint_io": "run.checkpoint_io", "checkpoint_events": "run.checkpoint_events",
    "upload_slot": "run.upload_slot", "run_logs": "run.logs", "preempt": "run.preempt",
    "emitter": "events.emitter", "event_poller": "events.poller", "trackers": "events.trackers",
    "progress_configmap": "events.progress_configmap",
    "script_hooks": "script.hooks",
    "smoke_plan": "smoke.plan", "smoke_step": "smoke.step", "reference_gpt": "smoke.reference_gpt",
    "toolchain": "smoke.toolchain",
}
# `training.data` and `training.script` kept their names as packages (the old `training.data`'s
# functions are `training.data.pipeline`'s; `training.script` still exports should_stop, Preempted).


def home(old: str) -> str:
    """The full module name an old flat name now stands for."""
    new = MOVED[old]
    return new if new.startswith("submitter.") else f"training.{new}"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `training.<old>` and hands back the module that lives at its new name."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[ModuleSpec]:
        package, _, leaf = fullname.rpartition(".")
        if package != "training" or leaf not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> types.ModuleType:
        return importlib.import_module(home(spec.name.rpartition(".")[2]))

    def exec_module(self, module: types.ModuleType) -> None:
        """The new module already ran when it was imported: nothing to run again."""


def install() -> None:
    """Add the alias finder once (after the path finders: a real module always wins)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
