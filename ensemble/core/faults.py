"""Resource faults on write paths (a full disk, a quota, a read-only or forbidden folder, a
file-size limit) told in one line that names the path and the cause.

A write can fail in Python (`OSError` with `errno` ENOSPC, EDQUOT, EROFS, EACCES, EPERM or
EFBIG, treated like ENOSPC) or inside TensorFlow (checkpoints, SavedModels, TensorBoard: a
`tf.errors.OpError` whose message carries the path and the C library's text for the errno).
`describe` recognises both, anywhere in an exception's chain, so the CLI can print
`error: cannot write PATH: No space left on device` and exit 1 instead of a traceback.
Every write of the project goes through a staging name (`ensemble.core.artifacts.atomic_path`,
`ensemble.core.staging`), so a fault leaves nothing partial under a final name.

No TensorFlow import here: TensorFlow errors are recognised by their module.
"""

from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}
CAUSES = tuple(os.strerror(e) for e in sorted(ERRNOS))  # "No space left on device", ...
_TF_PATH = re.compile(r"(?P<path>/[^\s;:'\"]+?)(?:\.tempstate\d+)?[;:,]?\s*(?P<cause>"
                      + "|".join(map(re.escape, CAUSES)) + ")")


class ResourceFault(RuntimeError):
    """A resource fault reported by another process (a between-graph client's line)."""


def is_fault_line(line: str) -> bool:
    """Whether a process's error line is the one `describe` gives for a resource fault."""
    return any(f"{verb} " in line for verb in ("cannot write", "cannot access")) \
        and any(cause in line for cause in CAUSES)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def describe(exc: BaseException) -> str | None:
    """`cannot write PATH: CAUSE` (`cannot access` for EACCES and EPERM) for a resource fault
    anywhere in `exc`'s chain, else None.

    Args:
        exc: any exception (an `OSError`, a TensorFlow `OpError`, or one raised while handling
            them).
    """
    for e in _chain(exc):
        if isinstance(e, ResourceFault):
            return str(e)
        if isinstance(e, OSError) and e.errno in ERRNOS:
            path = e.filename if e.filename is not None else "a file"
            verb = "cannot access" if e.errno in (errno.EACCES, errno.EPERM) else "cannot write"
            return f"{verb} {path}: {e.strerror or os.strerror(e.errno)}"
        if type(e).__module__.startswith("tensorflow"):
            m = _TF_PATH.search(str(e))
            if m:
                return f"cannot write {m['path']}: {m['cause']}"
            for cause in CAUSES:
                if cause in str(e):
                    return f"cannot write a file: {cause} ({str(e).splitlines()[0][:200]})"
    return None


def is_fault(exc: BaseException) -> bool:
    """Whether `exc` is a resource fault that `describe` names."""
    return describe(exc) is not None


@contextmanager
def failing_run_on_fault(run_dir: str | Path, by: str) -> Iterator[None]:
    """For a command `by` that rewrites files of an existing run (`aggregate`): on a resource
    fault or an interruption (Ctrl-C, SIGTERM: `KeyboardInterrupt`) after it replaced a file
    the manifest records, mark the run `failed` (`failed_by`: `by`, so that command may redo
    it) and record the sha256 of the files now in place (each is whole: writes are atomic),
    so nothing inconsistent passes as completed (nor as damaged) and nothing complete is
    lost. A run left intact keeps its status. The fault goes on; a manifest that cannot be
    written either is left as it was."""
    try:
        yield
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or is_fault(exc):
            _fail_if_changed(Path(run_dir), by)
        raise


def _fail_if_changed(run_dir: Path, by: str) -> None:
    from ensemble.core import artifacts
    from ensemble.core.manifest import Manifest

    def change(manifest: Manifest) -> None:
        changed = [rel for rel, digest in manifest.hashes().items() if (run_dir / rel).is_file()
                   and artifacts.sha256_file(run_dir / rel) != digest]
        if changed:
            manifest.status, manifest.failed_by = "failed", by
            manifest.record_hashes(run_dir, [run_dir / rel for rel in changed])

    try:
        Manifest.update(run_dir, change)
    except Exception:  # noqa: BLE001 (the fault being reported matters more)
        return
