"""Launching and measuring processes (clients, the aggregator, compare's phases, the benchmark's
workers), and the frame of a process `ensemble` starts (`entry`).

A measured process writes its JSON report to the file named by `$ENSEMBLE_REPORT`, which
`run_process` sets to a fresh temporary file (so the user's stdout never carries it; benchmark
workers print theirs as the last stdout line instead, see `last_report`); a client also
writes progress reports on stderr (`ensemble.replication.protocol` messages), which `run_process`
hands to a callback as they come while keeping the other stderr lines for error messages.
The temporary file has an owned staging name (`ensemble.core.staging`:
`.ensemble-report.<host>-<pid>.<random>.partial.json`), so the next launch removes those that
SIGKILLed launchers left behind.

No orphans: every process started here gets `$ENSEMBLE_PARENT_PID`, and `die_with_parent`
(called first thing by the CLI) asks Linux to SIGKILL it when its parent dies
(`prctl(PR_SET_PDEATHSIG)`), so a killed launcher leaves no client writing its run. The
launcher keeps its live children in a registry: `forward` sends them a signal (Ctrl-C,
SIGTERM), `kill_children` ends and reaps any still running.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import tempfile
import time
from pathlib import Path
from typing import Callable

from ensemble.core import staging
from ensemble.core.errors import UsageError
from ensemble.replication import protocol

PARENT_ENV = "ENSEMBLE_PARENT_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_children: set[subprocess.Popen] = set()
_children_lock = threading.Lock()


def die_with_parent() -> None:
    """In a process started by `run_process`: be SIGKILLed when the parent dies (Linux
    `prctl(PR_SET_PDEATHSIG)`; elsewhere nothing), and exit now if it is already gone.
    Removes `$ENSEMBLE_PARENT_PID` so that this process's own children do not inherit it."""
    parent = os.environ.pop(PARENT_ENV, None)
    if not parent or not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(parent):  # reparented: did the parent die before prctl?
        try:
            os.kill(int(parent), 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            pass  # alive (someone else's): the variable was inherited from further up


def forward(signum: int) -> None:
    """Send `signum` to every live child started by `run_process`."""
    with _children_lock:
        procs = list(_children)
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass


def kill_children() -> None:
    """SIGKILL and reap every child of `run_process` still running."""
    with _children_lock:
        procs = list(_children)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def run_process(argv: list[str], env: dict | None = None, *, module: str,
                on_stderr_line: Callable[[str], bool | str] | None = None) -> dict:
    """Run `python -m MODULE ARGV...` and measure it (`ensemble` starts only its own modules:
    the client, `protocol.CLIENT_MODULE`, and the aggregator; `pipelines` passes its CLI).

    Args:
        on_stderr_line: called with each stderr line (without its newline) as it arrives;
            lines for which it returns True are consumed (not kept in `stderr`); when it
            returns a string, that string is kept instead of the line.

    Returns:
        `{"returncode", "seconds" (wall), "spawned_unix" (time.time() at spawn), "stdout",
        "stderr", "report" (the process's `$ENSEMBLE_REPORT` JSON, or None)}`.
    """
    report_path = str(staging.new_path(Path(tempfile.gettempdir()) / "ensemble-report", ".json"))
    env = dict(os.environ if env is None else env, **{protocol.REPORT_ENV: report_path,
                                                          PARENT_ENV: str(os.getpid())})
    try:
        res = _run(argv, env, module, on_stderr_line)
        res["report"] = protocol.read_report(report_path)
    finally:
        os.unlink(report_path)
    return res


def _run(argv, env, module, on_stderr_line) -> dict:
    start, spawned = time.perf_counter(), time.time()
    proc = subprocess.Popen([sys.executable, "-m", module, *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=1)
    with _children_lock:
        _children.add(proc)
    try:
        return _collect(proc, start, spawned, on_stderr_line)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        with _children_lock:
            _children.discard(proc)


def _collect(proc, start, spawned, on_stderr_line) -> dict:
    kept: list[str] = []

    def read_stderr() -> None:
        for line in proc.stderr:
            line = line.rstrip("\n")
            taken = False if on_stderr_line is None else on_stderr_line(line)
            if taken is not True:
                kept.append(line if taken is False else taken)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    stdout = proc.stdout.read()
    proc.wait()
    reader.join()
    return {"returncode": proc.returncode, "seconds": time.perf_counter() - start,
            "spawned_unix": spawned, "stdout": stdout,
            "stderr": "".join(line + "\n" for line in kept)}


def last_report(res: dict) -> dict:
    """The JSON report of a measured process: its `$ENSEMBLE_REPORT` file, or (for workers
    that print it) its last stdout line."""
    if res.get("report") is not None:
        return res["report"]
    return json.loads(res["stdout"].strip().splitlines()[-1])


def last_error(res: dict) -> str:
    """The last stderr line of a finished process, or `(no output)`."""
    return (res["stderr"].strip().splitlines() or ["(no output)"])[-1]


def checked(res: dict, what: str) -> dict:
    """`res` of `run_process`, or raise naming `what` and the process's last error line:
    UsageError for exit status 2 (bad input), RuntimeError otherwise."""
    if res["returncode"] != 0:
        err = UsageError if res["returncode"] == 2 else RuntimeError
        raise err(f"{what} failed (exit {res['returncode']}): {last_error(res)}")
    return res


def entry(body: Callable[[], dict]) -> int:
    """The frame of a process `ensemble` starts (a client, the aggregator): dies with its
    parent, stops after the current call on SIGINT/SIGTERM, runs `body` and writes its
    payload as the process's `protocol.Report`; failures are one line on stderr.

    Returns:
        The exit status: 0, 2 bad input (`UsageError`), 1 a resource fault or an unreachable
        cluster task, 130 / 143 interrupted (the line says how to continue: the exception's
        `resume`).
    """
    from ensemble.core import faults, interrupt
    from ensemble.core.notices import one_line
    from ensemble.replication.cluster import ClusterError

    die_with_parent()
    try:
        with interrupt.handling_signals():
            payload = body()
        protocol.Report(payload).write([m for m in protocol.HEAVY if m in sys.modules])
        return 0
    except interrupt.Interrupted as exc:
        at = f" at epoch {exc.epoch} of {exc.epochs}" if exc.epoch else ""
        resume = getattr(exc, "resume", None)
        line = f"interrupted{at}; continue with: {resume}" if resume else f"interrupted ({exc})"
        print(one_line(line), file=sys.stderr, flush=True)
        return exc.exit_status
    except UsageError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:
        line = faults.describe(exc)
        if line is None and not isinstance(exc, ClusterError):
            raise
        print(f"error: {one_line(line or exc)}", file=sys.stderr, flush=True)
        return 1
