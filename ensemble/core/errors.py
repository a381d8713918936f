"""Error types shared by every block.

`UsageError` is bad input from the user (flags, configs, data, run directories): the CLI prints
its message on one line and exits with status 2. Anything else is an internal failure (status 1).
"""


class UsageError(ValueError):
    """Bad input: the message names the bad value and what was expected."""


class ClientFailed(RuntimeError):
    """A between-graph client process failed (not on bad input): the message names its
    unfinished members and the client's last error line, so the CLI prints it on one line
    (status 1) instead of a traceback of the launcher, which did nothing wrong."""
