"""submitter: distributed GPT-2 pre-training from a laptop to KubeRay, with durable checkpoints.

The Python API (see `submitter.api` and docs/reference/api.md):

    import submitter
    spec = submitter.JobSpec.build(name="gpt2-demo", replicas=8, gpu_per_pod=1)
    plan = submitter.render(spec)
    submitter.submit(spec)
    for state in submitter.watch("gpt2-demo"): ...
    submitter.status(name), submitter.stop(name), submitter.resume(name), submitter.delete(name)

Kept import-light on purpose: `submitter --help` and `submitter render` must start fast, so
nothing here (or in spec/storage/render/plan) imports kubernetes, ray, torch or transformers;
every name below is imported on first use (PEP 562 module `__getattr__`).

`submitter.render` and `submitter.watch` are also the names of modules (the renderer, the
watch loop); those two modules are callable (`submitter._callable`), so `submitter.render(spec)`
and `submitter.watch(name)` are the API functions whichever was imported first.
"""

from __future__ import annotations

__version__ = "0.1.0"

#: Public name -> module that defines it.
_EXPORTS = {
    "JobSpec": "submitter.contract.spec",
    "Plan": "submitter.plan",
    "Submitted": "submitter.api",
    "submit": "submitter.api",
    "status": "submitter.api",
    "delete": "submitter.api",
    "stop": "submitter.api",
    "resume": "submitter.api",
    "SubmitterError": "submitter.contract.errors",
    "UsageError": "submitter.contract.errors",
    "SpecError": "submitter.contract.errors",
    "ClusterError": "submitter.contract.errors",
    "NotFound": "submitter.contract.errors",
    "JobFailed": "submitter.contract.errors",
    "WatchTimeout": "submitter.contract.errors",
}
#: API functions that share their name with a module of the package (the module is callable).
_CALLABLE_MODULES = ("render", "watch")

__all__ = ["__version__", *_EXPORTS, *_CALLABLE_MODULES]


def __getattr__(name: str) -> object:
    import importlib  # here, not at the top: `submitter render` never needs it

    if name in _CALLABLE_MODULES:
        return importlib.import_module(f"submitter.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'submitter' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
