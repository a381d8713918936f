"""Ctrl-C and SIGTERM: stop training cleanly at the next call boundary.

`handling_signals()` installs handlers for SIGINT and SIGTERM in a command that trains (the
driver, the between-graph launcher, a client). Outside training a signal raises `Interrupted`
at once, as Python's own Ctrl-C does. Inside `deferred()` (the epoch loop of
`training.train_loop`, the launcher waiting for its clients) the handler only records the
signal (and calls the `on_signal` hooks, which the launcher uses to forward it to its clients);
`check()` raises `Interrupted` at the next point where stopping is clean: after a traced call
or after an epoch's checkpoint, never inside TensorFlow's runtime or a half-written file.

`Interrupted` derives from KeyboardInterrupt, so that `except Exception` blocks do not swallow
it and the code that lets Ctrl-C through while it wraps everything else (a user's builder
module raising, or calling `sys.exit()`, is one line of bad input) lets it through too. Its
exit status is the shell's `128 + signal number`: 130 for SIGINT, 143 for SIGTERM.

A signal whose `Interrupted` is raised inside a finalizer (TensorFlow frees a traced function
in its `__del__` as training ends), where Python ignores exceptions, is not lost: it is not
printed as an ignored exception, stays recorded, and is raised when the `handling_signals()`
block ends, if nothing raised it before.

Own code rather than a library: Python's `signal` module is the library; this module only
keeps the one flag and the deferral depth shared by the loop and the handlers.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_state = {"signal": None, "defer": 0}
_hooks: list[Callable[[int], None]] = []


class Interrupted(KeyboardInterrupt):
    """Training stopped on SIGINT or SIGTERM.

    Attributes:
        signum: the signal number.
        epoch: the 1-based epoch in progress when training stopped (None if not known).
        epochs: the run's epoch count (None if not known).
    """

    def __init__(self, signum: int, epoch: int | None = None, epochs: int | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.epoch, self.epochs = signum, epoch, epochs

    @property
    def exit_status(self) -> int:
        """`128 + signum` (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


def _handler(signum, frame) -> None:
    _state["signal"] = signum
    for hook in list(_hooks):
        hook(signum)
    if not _state["defer"]:
        raise Interrupted(signum)


def _unraisable(previous: Callable) -> Callable:
    """A `sys.unraisablehook` that drops an `Interrupted` raised inside a finalizer (its
    signal stays recorded, for `check()`) and hands everything else to `previous`."""
    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            previous(unraisable)
    return hook


@contextmanager
def handling_signals() -> Iterator[None]:
    """Install the SIGINT/SIGTERM handlers for the block (main thread only; elsewhere a
    no-op), restoring the previous ones after it. A signal recorded and never raised (its
    `Interrupted` lost in a finalizer) is raised when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _handler) for s in SIGNALS}
    old_hook, sys.unraisablehook = sys.unraisablehook, _unraisable(sys.unraisablehook)
    _state["signal"] = None
    try:
        yield
        check()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sys.unraisablehook = old_hook
        _state["signal"] = None


@contextmanager
def deferred() -> Iterator[None]:
    """Within the block a signal is only recorded; `check()` raises it at a clean point."""
    _state["defer"] += 1
    try:
        yield
    finally:
        _state["defer"] -= 1


@contextmanager
def on_signal(hook: Callable[[int], None]) -> Iterator[None]:
    """Call `hook(signum)` from the handler on every SIGINT/SIGTERM during the block."""
    _hooks.append(hook)
    try:
        yield
    finally:
        _hooks.remove(hook)


def requested() -> int | None:
    """The signal received and not yet raised, or None."""
    return _state["signal"]


def check(epoch: int | None = None, epochs: int | None = None) -> None:
    """Raise `Interrupted` if a signal was recorded (`epoch`: 1-based epoch in progress)."""
    if _state["signal"] is not None:
        raise Interrupted(_state["signal"], epoch, epochs)
