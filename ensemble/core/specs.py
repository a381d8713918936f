"""Objects named by a spec string: `package.module:attribute` or `path/to/file.py:attribute`.

The way a run names code of the user's that every process of the run must find again (a
builder, a task): the spec is stored in the run's manifest, and a between-graph client imports
it by the same spec. A file spec's path is absolute (callers make relative ones absolute
against the config file's folder).
"""
from __future__ import annotations

import importlib.util
import pkgutil
import sys
from pathlib import Path
from typing import Any

from ensemble.core.errors import UsageError


def is_spec(text: str) -> bool:
    """`text` names an object by `module:attribute` or `file.py:attribute`."""
    return ":" in text and not text.startswith("<")


def load(spec: str, what: str = "object") -> Any:
    """The object `spec` names, imported (a file spec is imported once per process).

    Raises:
        UsageError: a missing module, file or attribute, or a module that fails to import
            (one line naming `spec`; `what` says what it should be, e.g. "task").
    """
    where, _, name = spec.rpartition(":")
    try:
        if where.endswith(".py"):
            path = Path(where).resolve()
            if not path.is_file():
                raise UsageError(f"Expected {what} {spec!r} to name a Python file; "
                                 f"{path} does not exist.")
            key = f"_ensemble_spec_{abs(hash(str(path))):x}"
            module = sys.modules.get(key)
            if module is None:
                loader = importlib.util.spec_from_file_location(key, path)
                module = importlib.util.module_from_spec(loader)
                sys.modules[key] = module
                try:
                    loader.loader.exec_module(module)
                except BaseException:
                    del sys.modules[key]
                    raise
            return getattr(module, name)
        return pkgutil.resolve_name(spec)
    except UsageError:
        raise
    except (ImportError, AttributeError, ValueError) as exc:
        raise UsageError(f"Cannot load {what} {spec!r}: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
