"""Lazy re-exports of a package: its module `__getattr__` and `__dir__` (PEP 562).

A package re-exports names of its modules without importing them: the module that holds a
name is imported the first time the name is used (`ensemble.train` imports `ensemble.runs.api`
then, not at `import ensemble`), so importing the package stays lean.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Mapping, Sequence


def exports(package: str, modules: Mapping[str, Sequence[str]]
            ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` of `package` re-exporting, lazily, the names `modules` lists.

    Args:
        package: the package's `__name__`.
        modules: dotted module name -> the names it gives the package (imported on first use).

    Returns:
        the module-level `__getattr__(name)` (raises `AttributeError` for any other name, as
        a module does) and `__dir__()` (the package's globals and the re-exported names,
        sorted).
    """
    owner = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in owner:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(owner[name]), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *owner})

    return __getattr__, __dir__
