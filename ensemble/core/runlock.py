"""One writer per run: the run's lock, each member's lock, and manifest updates under a lock.

- The driver (`ensemble train`, in-graph or the between-graph launcher), `ensemble aggregate`
  and `ensemble evaluate` hold the run's exclusive lock (`RUN/.lock`) while they write;
  `--resume`, `aggregate`, `evaluate` and `predict` refuse a run whose lock another process
  holds, naming the holder (pid, host, command); readers may read at once (their probe of
  the lock waits out each other's, `PROBE_SECONDS`).
- A between-graph client holds its member's lock (`RUN/members/.member-<i>.lock`) while it
  trains that member, so two clients never write one member.
- Processes started by the holder (the launcher's clients and aggregator) work under its lock:
  the holder puts a random token in `$ENSEMBLE_RUN_LOCK` (inherited by its children) and in
  the holder record; a process whose token matches is the holder's delegate.
- Readers (`predict`, `export`, a between-graph predict's clients) hold the same lock
  *shared* (`reading`: `flock(LOCK_SH)`, compatible with `filelock`'s exclusive `flock`) while
  they read the manifest and the files it names, so a writer cannot rewrite the run between a
  reader's manifest and its files: a reader sees the old state or the new one, never a mix
  (a false "damaged artifact"). Readers never block each other; a writer waits
  `PROBE_SECONDS` for readers before it is refused.
- Manifest changes are read-modify-write under `RUN/.manifest.lock` (`update_manifest`), so a
  launcher's record of a member never overwrites a client's newer one (no lost update).

The locks are `filelock.FileLock`s (`flock` on Linux): the kernel releases them when the
holder dies, so a killed run never leaves a stale lock. Lock and holder files start with a
dot: they are not artifacts (`artifacts.artifact_hashes` skips them).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
import uuid
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

from filelock import FileLock, Timeout

from ensemble.core import artifacts
from ensemble.core.errors import UsageError

ENV = "ENSEMBLE_RUN_LOCK"
MANIFEST_LOCK_SECONDS = 60.0
# `require_free` probes by taking the lock for an instant: a reader waits this long before it
# calls the lock held, so that readers probing at once (a between-graph predict's clients, two
# `ensemble predict`s) never take each other's probe for a writer.
PROBE_SECONDS = 2.0
LOCK_FILES = (".lock", ".lock.json", ".manifest.lock")


def _paths(run_dir: Path, member: int | None) -> tuple[Path, Path]:
    base = Path(run_dir) if member is None else Path(run_dir) / "members"
    name = ".lock" if member is None else f".member-{member}.lock"
    return base / name, base / f"{name}.json"


def holder(run_dir: str | Path, member: int | None = None) -> dict[str, Any]:
    """The recorded holder of a lock: `{"pid", "host", "command", "token"}` (empty if none)."""
    try:
        return json.loads(_paths(Path(run_dir), member)[1].read_text())
    except (OSError, ValueError):
        return {}


def _who(h: dict[str, Any]) -> str:
    if not h:
        return "another process (a reader such as predict or export, or a writer starting)"
    return f"pid {h.get('pid')} on {h.get('host')} ({h.get('command')})"


class Lock:
    """The exclusive lock of a run (`member` None) or of one member; use as a context manager.

    Raises (on entering):
        UsageError: another process holds it (names the holder and the fix).
    """

    def __init__(self, run_dir: str | Path, member: int | None = None, command: str = ""):
        self.run_dir, self.member, self.command = Path(run_dir), member, command
        self.path, self.record = _paths(self.run_dir, member)
        self.token = uuid.uuid4().hex
        self._lock: FileLock | None = None
        self._old_env: str | None = None

    def __enter__(self) -> "Lock":
        lock = FileLock(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire(timeout=PROBE_SECONDS)  # readers hold it shared for short spells
        except Timeout:
            what = (f"Run {self.run_dir}" if self.member is None
                    else f"Member {self.member} of run {self.run_dir}")
            raise UsageError(f"{what} is in use by {_who(holder(self.run_dir, self.member))}; "
                             "wait for it to finish or stop it first.") from None
        except OSError as exc:
            raise UsageError(f"Cannot lock {self.path} to write run {self.run_dir}: "
                             f"{exc.strerror or exc}") from None
        self._lock = lock
        artifacts.write_text(self.record, json.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
             "token": self.token}))
        if self.member is None:  # children of the holder work under its lock
            self._old_env = os.environ.get(ENV)
            os.environ[ENV] = self.token
        return self

    def __exit__(self, *exc) -> None:
        if self.member is None:
            if self._old_env is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = self._old_env
        self.record.unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def delegated(run_dir: str | Path) -> bool:
    """True when this process works under the run lock of its parent (or of itself)."""
    token = os.environ.get(ENV)
    return bool(token) and holder(run_dir).get("token") == token


def writing(run_dir: str | Path, command: str):
    """The run lock for a writer (`command` names it for others): a no-op for the holder's
    delegates, else `Lock(run_dir)`."""
    return nullcontext() if delegated(run_dir) else Lock(run_dir, None, command)


def _shared(path: Path, what: str, run_dir) -> int | None:
    """Take `path`'s lock shared, waiting up to `PROBE_SECONDS` for a writer; returns the open
    descriptor holding it, or None when the run cannot be locked (a folder this process cannot
    write: no one writes it through this path either).

    Raises:
        UsageError: a writer holds the lock (names it).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
    deadline = time.monotonic() + PROBE_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise UsageError(f"{what} is in use by {_who(holder(run_dir))}; wait for it "
                                 "to finish (or stop it) first.") from None
            time.sleep(0.05)
        except OSError:
            os.close(fd)
            return None


def require_free(run_dir: str | Path, member: int | None = None) -> None:
    """Refuse to read a run (or member) another process is writing: a shared probe of its
    lock (readers never refuse each other).

    A run directory this process cannot write (read-only, shared) cannot be locked by anyone
    else either through this path; it passes.

    Raises:
        UsageError: the lock is held by a writer (names it).
    """
    if member is None and delegated(run_dir):
        return
    path = _paths(Path(run_dir), member)[0]
    if not path.parent.is_dir():
        return
    what = f"Run {run_dir}" if member is None else f"Member {member} of run {run_dir}"
    fd = _shared(path, what, run_dir)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases its flock


@contextmanager
def reading(run_dir: str | Path) -> Iterator[None]:
    """Hold the run's lock shared for the block (see the module docstring): no writer changes
    the run while this process reads its manifest and files. A no-op for the holder's
    delegates and for a folder that is not there or cannot be locked.

    Raises:
        UsageError: a writer holds the run (names it).
    """
    path = _paths(Path(run_dir), None)[0]
    fd = None
    if not delegated(run_dir) and path.parent.is_dir():
        fd = _shared(path, f"Run {run_dir}", run_dir)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def is_held(run_dir: str | Path) -> bool:
    """Whether another process holds the run lock (False when it cannot be told)."""
    try:
        require_free(run_dir)
    except UsageError:
        return True
    return False


def update_manifest(run_dir: str | Path, change: Callable[[dict], None],
                    known: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read the manifest, apply `change` (in place) and write it, all under the manifest lock.

    `known`: the manifest as this process last wrote it; used instead of reading the file when
    the file is still the one this process wrote (`artifacts.written_here`).

    Returns:
        The manifest as written.

    Raises:
        UsageError: not a run directory; RuntimeError: the manifest lock stayed busy for
        `MANIFEST_LOCK_SECONDS` seconds.
    """
    try:
        with FileLock(Path(run_dir) / ".manifest.lock", timeout=MANIFEST_LOCK_SECONDS):
            path = Path(run_dir) / artifacts.MANIFEST
            manifest = known if known is not None and artifacts.written_here(path) \
                else artifacts.read_manifest(run_dir)
            change(manifest)
            artifacts.write_manifest(run_dir, manifest)
    except Timeout:
        raise RuntimeError(f"The manifest of {run_dir} stayed locked for "
                           f"{MANIFEST_LOCK_SECONDS:.0f} s") from None
    return manifest


@contextmanager
def member_locks(run_dir: str | Path, indices) -> Iterator[None]:
    """Hold the locks of members `indices` (in order) for the block."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        for i in indices:
            stack.enter_context(Lock(run_dir, int(i), f"ensemble client {' '.join(sys.argv[1:])}"
                                     .strip()))
        yield
