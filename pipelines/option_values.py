"""Values of the `ensemble` command line's options: argparse `type`s that check a value
against the bounds of `ensemble.config.bounds`, so a bad value is refused in one line (exit
status 2) the same way in every command.
"""

from __future__ import annotations

import argparse
from typing import Callable

from ensemble.config import bounds as B
from ensemble.core import specs
from ensemble.core.errors import UsageError
from ensemble.runs import builtin_modes


def bounded(check: Callable, *args) -> Callable:
    """An argparse `type` from a `bounds` check (its UsageError becomes argparse's error:
    one line, exit 2, the same in every command)."""
    def parse(text: str):
        try:
            return check(text, *args)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(check, "__name__", "value")
    return parse


def replicas(flag: str) -> Callable:
    """`auto` or an integer in 1..`REPLICAS_MAX` (kept as text, as predict and serve take
    it)."""
    def check(text: str) -> str:
        text = text.strip()
        return text if text == "auto" else str(B.check_int(text, flag, 1, B.REPLICAS_MAX))

    return bounded(check)


DEVICES = bounded(B.check_devices, "--devices")
JOBS = bounded(B.check_int, "--jobs", 1, B.JOBS_MAX)
BATCH_ROWS = bounded(B.check_int, "--batch-size", 1, B.BATCH_ROWS_MAX)


MODE_METAVAR = "{" + ",".join(builtin_modes.names()) + "}"


def mode(text: str) -> str:
    """`--mode`: a built-in mode's name, or the `package.module:Class` / `path/file.py:Class`
    spec of a `Mode` subclass (`ensemble.runs.builtin_modes.get` loads it)."""
    if text in builtin_modes.names() or specs.is_spec(text):
        return text
    names = ", ".join(repr(n) for n in builtin_modes.names())
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r} (choose from {names}, or a Mode subclass as "
        "package.module:Class or path/file.py:Class)")


def member_list(text: str) -> list[int]:
    """`--member` of client: `I` or `I,J,...`, member indices (integers >= 0)."""
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected member indices I or I,J,... (integers >= 0), received {text!r}")
    return [int(p) for p in parts]


def replicas_value(text: str) -> int | str:
    """`--replicas` of train: `auto` or a positive integer (checked with the config; at most
    `bounds.REPLICAS_MAX`, as in every command)."""
    value = int(text) if text.strip().lstrip("-").isdigit() else text.strip()
    if isinstance(value, int) and value > B.REPLICAS_MAX:
        raise argparse.ArgumentTypeError(f"Expected `--replicas` to be auto or an integer in "
                                          f"1..{B.REPLICAS_MAX}. Received: {text!r}")
    return value
