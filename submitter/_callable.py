"""Modules that are also API functions: `submitter.render(spec)` and `submitter.watch(name)`.

Python binds a submodule to its package's attribute of the same name on import, so after
`import submitter.render` (which `submitter render` does) `submitter.render` is the module, not a
function. Making those modules callable keeps both meanings: code that imports the module (or
mocks something in it) is unaffected, and `submitter.render(spec)` calls the API.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class CallableModule(types.ModuleType):
    """A module whose call forwards to `__api__` ("module:function", resolved on call)."""

    __api__: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, _, function = self.__api__.partition(":")
        return getattr(importlib.import_module(module), function)(*args, **kwargs)


def make_callable(module_name: str, api: str) -> None:
    """Make the (already imported) module `module_name` call `api` ("module:function")."""
    module = sys.modules[module_name]
    module.__class__ = CallableModule
    module.__api__ = api  # type: ignore[attr-defined]
