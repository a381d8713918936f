"""Output paths that are not regular files: a FIFO, a character device, `/dev/stdout`.

Such an output is written through (opened and written in place), never replaced by a staged
file renamed onto its name: a rename would swap a reader's FIFO for a regular file (the reader
waits for ever) or replace `/dev/stdout`'s link. Every other output is staged and renamed
(`ensemble.core.artifacts.atomic_path`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SPECIAL_ROOTS = ("/dev/", "/proc/")


def writes_through(path: str | Path) -> bool:
    """True when `path` names an existing FIFO, character device or socket, or lies under
    `/dev` or `/proc` (`/dev/stdout`, `/proc/self/fd/1`): it is written in place."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode):
        return True
    return os.path.abspath(path).startswith(SPECIAL_ROOTS)


def table_format(path: str | Path) -> str:
    """`csv` or `parquet` for an output `path`: its suffix; a written-through output without
    one (`/dev/stdout`, a FIFO) is CSV, which a reader of a stream can read as it comes."""
    suffix = Path(path).suffix.lower()
    if suffix in (".csv", ".parquet"):
        return suffix[1:]
    return "csv" if writes_through(path) else "parquet"


def is_stdout(path: str | Path) -> bool:
    """True when `path` is this process's standard output (same device and inode)."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(1))
    except (OSError, ValueError):
        return False


class ForwardSink:
    """A write-only binary file for a written-through output, counting its position so that
    pyarrow's writers (which ask `tell()`, and `lseek` a path they open themselves) can write
    Parquet or CSV to a FIFO or a pipe. Close it after the writer.

    Args:
        path: the FIFO or device to open for writing.
    """

    def __init__(self, path: str | Path):
        self._file = open(path, "wb")
        self.pos, self.closed = 0, False

    def write(self, data) -> int:
        self._file.write(data)
        self.pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._file.close()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False
