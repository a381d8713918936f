"""Owned staging names for writes in progress, and the sweep of those whose writer is dead.

A file or folder being written gets a name beside its destination that says what it is and who
writes it: `.<final name>.<host>-<pid>.<random>.partial<suffix>` (a dot name: never an artifact,
`artifacts.artifact_hashes` skips it). A process killed mid-write (SIGKILL, power loss) leaves
it behind; the next write into the same folder removes every staging entry whose writer is
provably dead: recorded on this host and its pid no longer running. An entry of another host,
or of a pid that runs (perhaps reused), is left alone: nothing is removed on a guess.

Writers fire `ensemble.core.hooks`' `"write"` point when a write is complete under its staging
name, so a test can kill the process there.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
from pathlib import Path

MARK = ".partial"


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries (renames, new and removed files) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname().split(".")[0]) or "host"


def _pattern(final_name: str | None) -> re.Pattern:
    name = re.escape(final_name) if final_name is not None else r".+"
    return re.compile(rf"^\.(?P<name>{name})\.(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)\."
                      rf"[0-9a-f]+{re.escape(MARK)}")


def staging_name(final_name: str, suffix: str = "") -> str:
    """A fresh staging name for `final_name`, owned by this process (host and pid)."""
    return f".{final_name}.{_host()}-{os.getpid()}.{secrets.token_hex(4)}{MARK}{suffix}"


def is_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def owner(name: str) -> tuple[str, int] | None:
    """`(host, pid)` of a staging name, or None for any other name."""
    m = _pattern(None).match(name)
    return (m["host"], int(m["pid"])) if m else None


def is_stale(name: str) -> bool:
    """A staging name whose writer is provably dead (this host, pid not running)."""
    who = owner(name)
    return who is not None and who[0] == _host() and who[1] != os.getpid() \
        and not is_alive(who[1])


def sweep(folder: str | Path, final_name: str | None = None) -> list[Path]:
    """Remove the stale staging entries (files or folders) in `folder`: those of `final_name`,
    or all of them when None. Entries that cannot be removed are left (never an error).

    Returns:
        The entries removed.
    """
    folder = Path(folder)
    pattern, removed = _pattern(final_name), []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(".") and pattern.match(n)]
    except OSError:
        return removed
    for name in names:
        if not is_stale(name):
            continue
        path = folder / name
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def new_path(destination: str | Path, suffix: str = "", folder: bool = False) -> Path:
    """Sweep the stale staging entries of `destination`, then create (exclusively) and return a
    fresh staging file, or folder with `folder`, beside it."""
    destination = Path(destination)
    sweep(destination.parent, destination.name)
    path = destination.parent / staging_name(destination.name, suffix)
    if folder:
        path.mkdir()
    else:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path
