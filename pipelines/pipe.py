"""Standard streams never fail a run: closed, full, or a pipe whose reader left.

When the reader of stdout (or stderr) goes away, writes raise `BrokenPipeError` (Python ignores
SIGPIPE); on a full device they raise `ENOSPC`, on a hung terminal `EIO`. `guard_std_streams`
wraps both streams so that the first such error points the stream's file descriptor at
`os.devnull` (the recipe of the Python docs, "Note on SIGPIPE",
https://docs.python.org/3/library/signal.html#note-on-sigpipe), says so once on the other
stream when it can, and the run carries on: its files are the result, its progress is not.
A standard descriptor that is closed (`ensemble train >&-`) is first opened on `os.devnull`,
so that no file the command opens later takes its number (and receives the log lines meant for
it). Installed by the CLI's process entry only, never by `main()` that tests call in-process.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, TextIO


class PipeSafeStream:
    """A text stream that swallows EPIPE: on the first broken pipe its descriptor is
    redirected to /dev/null and every later write succeeds (and is dropped).

    Args:
        stream: the stream to wrap (`sys.stdout` or `sys.stderr`); every other attribute
            (`fileno`, `isatty`, `encoding`, ...) is the stream's.
    """

    def __init__(self, stream: TextIO, name: str = "stream"):
        self._stream = stream
        self._name = name
        self.closed_pipe = False

    def _drop(self) -> None:
        self.closed_pipe = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def _guard(self, call, *args) -> Any:
        try:
            return call(*args)
        except (OSError, ValueError) as exc:  # EPIPE, ENOSPC, EIO, EDQUOT; ValueError: closed
            if self.closed_pipe:
                return len(args[0]) if args else None
            self._drop()
            if getattr(exc, "errno", None) != errno.EPIPE:  # a reader that left wants no note
                _note(self, f"notice: cannot write to standard {self._name} "
                            f"({getattr(exc, 'strerror', None) or exc}); its output is dropped, "
                            "the command carries on")
            try:  # the buffered text now goes to /dev/null
                return call(*args)
            except (OSError, ValueError):
                return len(args[0]) if args else None

    def write(self, text: str) -> int:
        """Write `text`; on a closed pipe, drop it (returns its length)."""
        return self._guard(self._stream.write, text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Flush; on a closed pipe, drop what is buffered."""
        self._guard(self._stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _note(failed: PipeSafeStream, text: str) -> None:
    """Say `text` once on the standard stream other than `failed`, if it still works."""
    other = sys.stderr if failed is sys.stdout else sys.stdout
    if isinstance(other, PipeSafeStream) and not other.closed_pipe:
        other.write(text + "\n")
        other.flush()


def open_closed_std_fds() -> None:
    """Open `os.devnull` on each of descriptors 0, 1, 2 that is closed (in order, so that the
    lowest free number is the one being filled), and give Python a stream on it."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            new = os.open(os.devnull, os.O_RDWR)
            if new != fd:
                os.dup2(new, fd)
                os.close(new)
        except OSError:
            continue
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False, encoding="utf-8",
                                    errors="backslashreplace"))


def guard_std_streams() -> None:
    """Open closed standard descriptors on `os.devnull`, then wrap `sys.stdout` and
    `sys.stderr` in `PipeSafeStream` (idempotent)."""
    open_closed_std_fds()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, PipeSafeStream):
            try:  # a path of non-UTF-8 bytes (surrogate escapes) prints escaped, not a crash
                stream.reconfigure(errors="backslashreplace")
            except (AttributeError, ValueError, OSError):
                pass
            setattr(sys, name, PipeSafeStream(stream, {"stdout": "output"}.get(name, "error")))


def people_stream(out):
    """A context in which what people read goes to stderr when the output `out` is stdout
    (`--out /dev/stdout`: the table is stdout), else a no-op."""
    import contextlib

    from ensemble.core.outputs import is_stdout

    return (contextlib.redirect_stdout(sys.stderr) if is_stdout(out)
            else contextlib.nullcontext())
