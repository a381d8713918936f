"""Objects named by a spec string: `package.module:attribute` or `path/to/file.py:attribute`.

The way a run names code of the user's that every process of the run must find again (a
builder, a task): the spec is stored in the run's manifest, and a between-graph client imports
it by the same spec. A file spec's path is absolute (callers make relative ones absolute
against the config file's folder).
"""
from __future__ import annotations

import hashlib
import importlib.util
import pkgutil
import sys
from pathlib import Path
from typing import Any

from ensemble.core.errors import UsageError


def is_spec(text: str) -> bool:
    """`text` names an object by `module:attribute` or `file.py:attribute`."""
    return ":" in text and not text.startswith("<")


def import_file(path: Path, label: str, prefix: str = "ensemble_spec_"):
    """The module of Python file `path`, imported once per process under a name derived from
    its path (`prefix` + 12 hex digits of its sha256), so every caller gets the same module.

    Raises:
        UsageError: not a Python file, or its code raised (any `BaseException` but
            `KeyboardInterrupt`, `sys.exit()` included): one line naming `label` and `path`.
    """
    name = f"{prefix}{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    module = sys.modules.get(name)
    if module is None:
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None or loader.loader is None:
            raise UsageError(f"Cannot import {label.lower()} {path}: not a Python file.")
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        try:
            loader.loader.exec_module(module)
        except KeyboardInterrupt:
            del sys.modules[name]
            raise
        except BaseException as exc:  # sys.exit() in the user's module too
            del sys.modules[name]
            text = str(exc).strip()
            first = (text.splitlines()[0] if text else type(exc).__name__)[:300]
            raise UsageError(f"{label} {path} failed to import: {type(exc).__name__}: "
                             f"{first}") from None
    return module


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
            module = import_file(path, f"{what.capitalize()} file", f"ensemble_{what}_")
            return getattr(module, name)
        return pkgutil.resolve_name(spec)
    except UsageError:
        raise
    except (ImportError, AttributeError, ValueError) as exc:
        raise UsageError(f"Cannot load {what} {spec!r}: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
