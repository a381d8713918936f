"""Test-only: hold an `ensemble` process at a named point so a test can kill it there.

`conftest.start_held` puts this folder first on the started process's `PYTHONPATH`, so Python
imports this module at start-up (and so does every client process the command starts). It
installs one `ensemble.core.hooks` hook, configured by the test through:

- `ENSEMBLE_TEST_HOLD_AT`: `"EPOCH:STEP"` (after the first traced call of 0-based epoch EPOCH
  that has done more than STEP steps, before the epoch's checkpoint), `"EPOCH:end"` (after
  that epoch's checkpoint), or a write kind (`"predict"`, `"export"`: written, not yet in place);
- `ENSEMBLE_TEST_HOLD_MEMBER`: only in the process that trains this member;
- `ENSEMBLE_TEST_HOLD_MARKER`: the file the held process writes its pid to; it waits while the
  file exists, so the test can kill it (or what it depends on) and release it.

Production code reads none of these: it only fires the hook points.
"""
import os
import time
from pathlib import Path

_SPEC = os.environ.get("ENSEMBLE_TEST_HOLD_AT")


def _install() -> None:
    from ensemble.core import hooks

    marker = Path(os.environ["ENSEMBLE_TEST_HOLD_MARKER"])
    member = os.environ.get("ENSEMBLE_TEST_HOLD_MEMBER")
    epoch, _, step = _SPEC.partition(":")
    done = []

    def due(point, info) -> bool:
        if member is not None and "members" in info and int(member) not in info["members"]:
            return False
        if not step:  # a write kind
            return point == "write" and info["kind"] == _SPEC
        if info.get("epoch") != int(epoch):
            return False
        if step == "end":
            return point == "epoch_end"
        return point == "call_end" and info["steps_done"] > int(step)

    def hold(point, **info) -> None:
        if done or not due(point, info):
            return
        done.append(point)
        tmp = marker.with_name(marker.name + ".tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, marker)  # the test never reads a half-written pid
        while marker.exists():
            time.sleep(0.1)

    hooks.install(hold)


if _SPEC:
    _install()
