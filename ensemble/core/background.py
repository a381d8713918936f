"""A function run in a daemon thread beside the caller's work (prepare hashes its source so).

A daemon thread does not hold up the process's exit (on Ctrl-C, say), unlike a
`concurrent.futures` worker, whose pending work Python waits for at exit.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


def start(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Start `fn()` in a daemon thread (one that does not hold up the process's exit, on
    Ctrl-C say); returns a function that waits for its result (or raises its exception)."""
    out: dict[str, Any] = {}

    def work() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=work, name="ensemble-background", daemon=True)
    thread.start()

    def result() -> Any:
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["value"]

    return result
