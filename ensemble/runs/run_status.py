"""A run's status in its manifest: recorded as the work goes (`set_status`,
`recording_outcome`, `finish`) and read back (`effective_status`: a dead driver's `running` is
`interrupted`; `require_completed` for the commands that use a finished run).
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ensemble.core import artifacts, runlock, staging
from ensemble.core.errors import UsageError
from ensemble.core.manifest import Manifest


def set_status(run_dir: Path, status: str, members: dict[int, str] | None = None) -> Manifest:
    """Record the run's `status` (and members' statuses `{index: status}`) by a
    read-modify-write of the manifest under its lock; returns the manifest."""
    def change(m: Manifest) -> None:
        m.status = status
        for i, st in (members or {}).items():
            m.member(i).status = st

    return Manifest.update(run_dir, change)


@contextmanager
def recording_outcome(run_dir: Path) -> Iterator[None]:
    """Record how the work inside leaves the run: `interrupted` on SIGINT/SIGTERM
    (`interrupt.Interrupted`, which then carries `run_dir` for its resume line), `failed` on
    any other exception; the exception goes on."""
    from ensemble.core import interrupt

    try:
        yield
    except interrupt.Interrupted as exc:
        _set_status_if_possible(run_dir, "interrupted")
        exc.run_dir = run_dir
        raise
    except BaseException:
        _set_status_if_possible(run_dir, "failed")
        raise


def _set_status_if_possible(run_dir: Path, status: str) -> None:
    """`set_status`, unless the manifest itself cannot be written (a full disk): then it is
    left as it was (`running` shows as `interrupted` once the lock is gone) and the original
    error is the one reported."""
    try:
        set_status(run_dir, status)
    except (OSError, RuntimeError):
        pass


def finish(run_dir: Path, manifest: Manifest, status: str, **timings: float) -> None:
    """Record the final status, timings (seconds) and every artifact's sha256."""
    manifest.status = status
    manifest.timings.update(timings)
    manifest.artifacts = artifacts.artifact_hashes(run_dir)
    manifest.save(run_dir)


def effective_status(manifest: Manifest, run_dir: str | Path | None = None) -> str:
    """The run status, with `running` turned into `interrupted` when no process holds the
    run's lock (`run_dir` given) or the recorded driver process (on this host) is gone."""
    status = manifest.status or "unknown"
    if status != "running":
        return status
    if run_dir is not None and not runlock.is_held(run_dir):
        return "interrupted"
    if manifest.host == socket.gethostname() and not staging.is_alive(int(_or(manifest.pid, -1))):
        return "interrupted"
    return status


def _or(value, default):
    return default if value is None else value


def require_completed(run_dir: Path, manifest: Manifest) -> None:
    """Raises UsageError unless the run is completed (names its status and the fix)."""
    status = effective_status(manifest, run_dir)
    if status != "completed":
        hint = ("resume it with `ensemble train --resume --run-dir "
                f"{run_dir}`" if status in ("interrupted", "failed", "prepared")
                else "wait for it")
        if status == "failed" and manifest.failed_by == "aggregate":  # its files half replaced
            hint = f"run `ensemble aggregate --run {run_dir}` again"
        raise UsageError(f"Run {run_dir} is {status}, not completed; {hint}.")
