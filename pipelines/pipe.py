"""Output to a closed pipe never fails a run: `ensemble train ... | head -3` completes the run.

When the reader of stdout (or stderr) goes away, writes raise `BrokenPipeError` (Python ignores
SIGPIPE). `guard_std_streams` wraps both streams so that the first such error points the
stream's file descriptor at `os.devnull` (the recipe of the Python docs, "Note on SIGPIPE",
https://docs.python.org/3/library/signal.html#note-on-sigpipe) and the run carries on; later
output is dropped. Installed by the CLI's process entry only, never by `main()` that tests call
in-process.
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

    def __init__(self, stream: TextIO):
        self._stream = stream
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
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            self._drop()
            try:  # the buffered text now goes to /dev/null
                return call(*args)
            except OSError:
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


def guard_std_streams() -> None:
    """Wrap `sys.stdout` and `sys.stderr` in `PipeSafeStream` (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, PipeSafeStream):
            setattr(sys, name, PipeSafeStream(stream))
