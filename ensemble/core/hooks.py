"""Fault-injection hooks: callbacks that tests install, points that production code fires.

As Keras callbacks are to `fit`, these are to a whole process: a test (or a tool) installs a
callable with `install`, and the training loop and the writers call `fire(point, **info)` at a
few named points. Nothing is installed in production, so `fire` is one loop over an empty list:
no environment variable is read and no step is changed for a hook. Tests that need a hook in a
process they start (an `ensemble` command, a between-graph client) put a `sitecustomize.py` of
their own on that process's `PYTHONPATH` which installs it (`tests/hold_site/`).

Points and their keyword arguments:

- `"call_end"`: after a traced training call, before the epoch's checkpoint;
  `epoch` (0-based), `steps_done` (steps of the epoch done), `members` (indices trained here).
- `"epoch_end"`: after an epoch is validated and its checkpoint (when due) saved;
  `epoch`, `members`.
- `"write"`: a file or folder is complete under its staging name, not yet renamed into place;
  `kind` (`"predict"`, `"export"`), `path`.
"""
from __future__ import annotations

from typing import Any, Callable

Hook = Callable[..., None]
_installed: list[Hook] = []


def install(hook: Hook) -> Callable[[], None]:
    """Install `hook(point: str, **info)`; returns a function that removes it again."""
    _installed.append(hook)
    return lambda: _installed.remove(hook)


def fire(point: str, **info: Any) -> None:
    """Call every installed hook with `point` and `info` (see the module docstring)."""
    for hook in tuple(_installed):
        hook(point, **info)
