"""Notices for people: one informational line on stderr, and the rewording of messages.

Below the inputs and the runs, which both print notices; the Python API rewords them (and
`UsageError`s) to name its own options and inputs instead of the CLI's flags or a temporary
file (`reworded`, `named`).
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Sequence

from ensemble.core.errors import UsageError

_REWORDING: list[tuple[str, str]] = []  # (regex, replacement) applied to messages (`reworded`)
_SAID: list[set[str]] = []  # the `once` notices of the innermost `said_once` block


_CONTROL = {c: f"\\x{c:02x}" for c in range(32) if c != 9}
_CONTROL.update({10: "\\n", 13: "\\r", 0x7f: "\\x7f"})


def one_line(text: str) -> str:
    """`text` with its control characters escaped as `repr` would (`\\n`, `\\r`, `\\x1b`):
    a path holding a newline cannot split a message across lines (nor a terminal escape act)."""
    return str(text).translate(_CONTROL)


def few(values, limit: int = 3, show=repr) -> str:
    """The first `limit` of `values` as `show` writes them (Python's `repr`), `...` beyond:
    `'a', 'b', 'c', ...` (a message names a few values, never hundreds)."""
    values = list(values)
    return ", ".join(map(show, values[:limit])) + (", ..." if len(values) > limit else "")


def notice(message: str, once: bool = False) -> None:
    """One informational line on stderr (never stdout: stdout belongs to the user); with
    `once`, inside a `said_once` block, a message the block already printed is not printed
    again (a command's early check reads the input, then the command reads it again)."""
    text = f"notice: {one_line(_reword(message))}"
    if once and _SAID:
        if text in _SAID[-1]:
            return
        _SAID[-1].add(text)
    sys.stderr.write(text + "\n")  # one write: no other line can land inside it
    sys.stderr.flush()


@contextlib.contextmanager
def said_once():
    """Within the block (one command), each `notice(..., once=True)` message prints once."""
    _SAID.append(set())
    try:
        yield
    finally:
        _SAID.pop()


def _reword(text: str) -> str:
    import re

    for pattern, replacement in _REWORDING:
        text = re.sub(pattern, replacement, text)
    return text


@contextlib.contextmanager
def reworded(rules: Sequence[tuple[str, str]]):
    """Within the block, notices and `UsageError`s have every regex of `rules` replaced
    (`re.sub`): the Python API names its own options and inputs, not the CLI's flags or an
    internal temporary file."""
    rules = list(rules)
    _REWORDING[:0] = rules
    try:
        yield
    except UsageError as exc:
        raise UsageError(_reword(str(exc))) from None
    finally:
        for rule in rules:
            _REWORDING.remove(rule)


def named(path, label: str):
    """`reworded`: messages name `label` (`the DataFrame`) instead of `path` (a temporary
    file or folder; the longer one first when nested)."""
    import re

    keys = sorted({str(path), str(Path(path).resolve())}, key=len, reverse=True)
    return reworded([(re.escape(k), label.replace("\\", r"\\")) for k in keys])
