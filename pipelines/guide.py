"""Argument parsing that guides, and the lines for people when a command fails: no abbreviations, one-line errors with a "did you mean" from
the known options and choices (difflib), help that states every default, and the
machine-readable report channel between processes (never the user's stdout).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import re

from ensemble.core.errors import UsageError
from ensemble.replication import protocol
from ensemble.runs import builtin_modes


def suggest(word: str, known) -> str:
    """` (did you mean X?)` for the closest of `known` (difflib), or ``."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_options(command: str, extra: list[str], parser: argparse.ArgumentParser) -> UsageError:
    """The error for options `extra` that `parser` (the command's) does not know, with the
    closest known option suggested."""
    first = next((x for x in extra if x.startswith("-")), extra[0])
    return UsageError(f"ensemble {command}: unrecognized arguments: {' '.join(extra)}"
                      + suggest(first.split("=")[0], parser._option_string_actions))


class Parser(argparse.ArgumentParser):
    """No abbreviations (`--member` is not `--members`); errors are one line with a "did you
    mean" taken from the known choices."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line, exit 2, no usage dump
        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if bad:
            message += suggest(bad.group(1), re.findall(r"'([^']*)'", bad.group(2)))
        raise UsageError(f"{self.prog}: {message}")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that states every option's default: `(default: X)` from the parser when the help
    text does not already say it; flags are `(default: off)`."""

    def __init__(self, prog: str, max_help_position: int = 30, **kwargs):
        super().__init__(prog, max_help_position=max_help_position, **kwargs)

    def add_argument(self, action):
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):  # commands are listed one level
            self._action_max_length += self._indent_increment  # deeper than argparse counts

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or action.required:
            return text
        if action.default is False:
            return f"{text} (default: off)"
        if action.default is not None:
            return f"{text} (default: %(default)s)"
        return text


def add(parser, *flags, **kwargs):
    """`add_argument` with its help text required (every option has help)."""
    assert kwargs.get("help"), flags
    return parser.add_argument(*flags, **kwargs)


def positive(text: str) -> int:
    if not text.lstrip("-").isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}")
    return int(text)


def nonneg(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, received {text!r}")
    return int(text)


def report(payload: dict, args=None) -> None:
    """A machine-readable report for the process that launched this one: written as JSON to the
    file named by `$ENSEMBLE_REPORT` (set by `ensemble.runs.between.run_process`), never to the
    user's stdout; printed as the last stdout line only when the user asks with `--json`.
    `loaded` lists which of the heavy libraries this process imported (start-up cost)."""
    payload = protocol.Report(payload).write([m for m in protocol.HEAVY if m in sys.modules])
    if getattr(args, "json", False):
        print(json.dumps(payload))


def interrupted_line(exc, args) -> str:
    """The one line printed on SIGINT/SIGTERM: where training stopped and how to continue."""
    from pathlib import Path as _Path

    at = f" at epoch {exc.epoch} of {exc.epochs}" if exc.epoch else ""
    run_dir = getattr(exc, "run_dir", None) or getattr(args, "run_dir", None)
    if getattr(exc, "resume", None):
        return f"interrupted{at}; continue with: {exc.resume}"
    if args is not None and args.command == "search" and run_dir:
        return f"interrupted{at}; continue with: {search_resume(args, run_dir)}"
    if getattr(args, "command", None) == "train" and run_dir and \
            (_Path(run_dir) / "manifest.json").is_file():
        from ensemble.core.manifest import Manifest

        try:  # interrupted before --overwrite replaced a finished run: nothing to resume
            finished = Manifest.load(run_dir).status == "completed"
        except Exception:  # noqa: BLE001 (an unreadable manifest: resume says why)
            finished = False
        if finished:
            return f"interrupted{at}; {run_dir} holds a completed run"
        return f"interrupted{at}; continue with: ensemble train --resume --run-dir {run_dir}"
    run = getattr(args, "run", None)
    if getattr(args, "command", None) == "aggregate" and run and \
            (_Path(run) / "manifest.json").is_file():
        from ensemble.core.manifest import Manifest

        try:  # interrupted while replacing the run's files: marked failed, redo it
            redo = Manifest.load(run).failed_by == "aggregate"
        except Exception:  # noqa: BLE001 (an unreadable manifest: aggregate says why)
            redo = False
        if redo:
            return (f"interrupted; run {run} marked failed (its files were being replaced): "
                    f"continue with: ensemble aggregate --run {run}")
    return f"interrupted ({exc})"


def search_resume(args, run_dir) -> str:
    """The command that continues the search of `args` in `run_dir`: the command line as given
    (`args.argv`), without `--overwrite` and its own `--run-dir`, with `--resume --run-dir`."""
    import shlex

    argv, out, skip = list(getattr(args, "argv", None) or ["search"]), [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--run-dir":
            skip = True
        elif a not in ("--overwrite", "--resume") and not a.startswith("--run-dir="):
            out.append(a)
    return "ensemble " + shlex.join([*out, "--resume", "--run-dir", str(run_dir)])


def failed_line(exc: Exception, args) -> str:
    """The one line for a failed cluster task or client: its message and, when the run was
    training and is marked failed, how to continue it."""
    from ensemble.core.manifest import Manifest

    line = str(exc)
    run_dir = getattr(exc, "run_dir", None) or getattr(args, "run_dir", None)
    if getattr(args, "command", None) not in ("train", "search") or not run_dir:
        return line
    try:
        status = Manifest.load(run_dir).status
    except Exception:  # noqa: BLE001 (no manifest: nothing was kept)
        return line
    if status in ("failed", "interrupted"):
        again = search_resume(args, run_dir) if args.command == "search" else \
            f"ensemble train --resume --run-dir {run_dir}"
        line += f"; run {run_dir} marked {status} (completed members kept): continue with: {again}"
    return line


def fault_line(exc: Exception, args) -> str | None:
    """The one line for a resource fault (full disk, quota, read-only, file-size limit), with
    the run's state when it was training, or for an output written through whose reader went
    away (`--out /dev/stdout | head -3`); None for any other exception."""
    from ensemble.core import faults
    from ensemble.core.manifest import Manifest

    if isinstance(exc, BrokenPipeError):  # a pipe or FIFO output (`ensemble.core.outputs`)
        return (f"cannot write {getattr(args, 'out', None) or 'the output'}: its reader went "
                "away (broken pipe); the output is incomplete")
    line = faults.describe(exc)
    run_dir = getattr(args, "run_dir", None) or getattr(args, "run", None)
    if line is None or getattr(args, "command", None) not in ("train", "aggregate", "search") \
            or not run_dir:
        return line
    try:
        status = Manifest.load(run_dir).status
    except Exception:  # noqa: BLE001 (no manifest: nothing was kept)
        return line
    if status == "failed":
        again = (f"ensemble aggregate --run {run_dir}" if args.command == "aggregate"
                 else f"ensemble train --resume --run-dir {run_dir}")
        line += (f"; run {run_dir} marked failed (completed files kept): free space, then "
                 f"continue with: {again}")
    return line


def refuse_inapplicable(args) -> None:
    """Options that do not apply to the chosen mode are refused, with the reason."""
    mode = getattr(args, "mode", None)
    if mode is not None:
        given = [o for o in ("jobs", "prepare_only", "devices", "replicas")
                 if getattr(args, o, None)]
        reason = builtin_modes.get(mode).refusal(args.command, given)
        if reason:
            raise UsageError(reason)
    if args.command == "predict" and args.replicas and args.replicas != "auto" and \
            not (args.replicas.isdigit() and int(args.replicas) >= 1):
        raise UsageError(f"Expected --replicas to be auto or a positive integer. "
                         f"Received: {args.replicas!r}")


def uses_tensorflow(args) -> bool:
    """Whether the command (or the processes it starts) loads TensorFlow: all but
    `aggregate` and a plain `evaluate`."""
    if args.command == "aggregate":
        return False
    if args.command == "evaluate":
        return bool(getattr(args, "ood", None) or getattr(args, "shift", None)
                    or getattr(args, "data", None))
    return True


def environment_line(exc: BaseException) -> str | None:
    """The one line for a failure of the environment rather than of the command: a path of
    bytes that are not UTF-8 (the libraries cannot open it), a working directory that was
    deleted; None for anything else."""
    if isinstance(exc, UnicodeEncodeError) and isinstance(exc.object, str) and any(
            0xDC80 <= ord(c) <= 0xDCFF for c in exc.object):
        return (f"the path {exc.object!r} holds bytes that are not UTF-8; the libraries this "
                "command uses (pyarrow, TensorFlow) cannot open it: rename it (or link it "
                "under a UTF-8 name)")
    if isinstance(exc, FileNotFoundError):
        try:
            os.getcwd()
        except OSError:
            return ("the working directory no longer exists (it was deleted); cd to an "
                    "existing folder or give absolute paths")
    return None
