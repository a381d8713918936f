"""Error types shared by every block.

`UsageError` is bad input from the user (flags, configs, data, run directories): the CLI prints
its message on one line and exits with status 2. Anything else is an internal failure (status 1).
"""


class UsageError(ValueError):
    """Bad input: the message names the bad value and what was expected."""
