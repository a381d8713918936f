"""Where every member's ops ran: TensorFlow's own device placement log, filtered to the members.

`tf.debugging.set_log_device_placement(True)` makes TensorFlow's placer print one line per
placed op, `NAME: (TYPE): DEVICE`, with C `printf` on the process's stdout (file descriptor 1,
below Python). `capture` puts a pipe on descriptor 1 while training runs: a reader thread keeps
the placement lines and passes every other line (progress) through to the real stdout. The lines
whose op name carries a member's scope (`member_<i>/...`, the Keras model's name) are the
members' ops; `summary` counts them per member and device.

Own code because TensorFlow offers the log only as that print; the parsing is one regex.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from ensemble.replication.modes import Mode

LINE = re.compile(r"^(?P<op>\S.*?): \((?P<type>[A-Za-z0-9_]+)\): (?P<device>/\S+)$")
MEMBER = re.compile(r"(?:^|/)member_(\d+)(?:_\d+)?/")  # Keras may suffix a scope: member_0_1
ENV = "ENSEMBLE_LOG_DEVICE_PLACEMENT"  # set for between-graph clients: "1" to log


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def runtime_started() -> bool:
    """Whether TensorFlow's eager context (its runtime) is already initialised here: its
    graph placer then keeps the log setting it started with (the private handle is the only
    way TensorFlow tells)."""
    from tensorflow.python.eager import context

    return getattr(context.context(), "_context_handle", None) is not None


@contextmanager
def capture(path: str | Path) -> Iterator[None]:
    """Log device placement while the block runs; write the members' placement lines
    (`NAME: (TYPE): DEVICE`, one per op) to `path`. Other stdout lines pass through.

    TensorFlow's placer logs only when the setting is on before its runtime starts; when it
    has started already (a notebook that ran TensorFlow before), the block runs unlogged and a
    notice says to use a fresh process."""
    import tensorflow as tf

    if runtime_started():
        print("notice: TensorFlow already started in this process; its device placement log "
              "works only when set before that (run in a fresh process, e.g. the CLI)",
              file=sys.stderr, flush=True)
        yield
        return
    sys.stdout.flush()
    _flush_c_stdio()
    saved = os.dup(1)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 1)
    os.close(write_fd)
    kept: list[str] = []

    def reader() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                line = raw.decode(errors="replace").rstrip("\n")
                if LINE.match(line):
                    if MEMBER.search(line):
                        kept.append(line)
                else:
                    os.write(saved, raw)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    tf.debugging.set_log_device_placement(True)
    try:
        yield
    finally:
        tf.debugging.set_log_device_placement(False)
        sys.stdout.flush()
        _flush_c_stdio()
        os.dup2(saved, 1)  # closes the pipe's last write end: the reader ends
        thread.join(timeout=10)
        os.close(saved)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.writelines(line + "\n" for line in kept)


def summary(lines: list[str]) -> dict[int, Counter]:
    """Member index -> Counter of devices its ops were placed on (from placement lines)."""
    out: dict[int, Counter] = {}
    for line in lines:
        m, member = LINE.match(line), MEMBER.search(line)
        if m and member:
            out.setdefault(int(member.group(1)), Counter())[m.group("device")] += 1
    return out


def format_summary(paths: list[Path]) -> str:
    """`member I: N ops on DEVICE` lines for the placement logs `paths`."""
    lines = [ln for p in paths if Path(p).is_file() for ln in Path(p).read_text().splitlines()]
    text = []
    for member, devices in sorted(summary(lines).items()):
        where = ", ".join(f"{n} ops on {d}" for d, n in devices.most_common())
        text.append(f"member {member}: {where}")
    return "\n".join(text) or "no member ops in the device placement log"


@contextmanager
def logging(run_dir: Path, mode: Mode, enabled: bool):
    """`--log-device-placement` around training: in-graph, capture this process's log; between-graph, ask
    the clients (environment) to write theirs; then print the per-member summary."""
    if not enabled:
        yield
        return
    path = run_dir / "placement" / "in-graph.log"
    if mode.launcher_loads_tensorflow:  # the members train in this process
        with capture(path):
            yield
    else:
        old = os.environ.get(ENV)
        os.environ[ENV] = "1"
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = old
    logs = sorted((run_dir / "placement").glob("*.log"))
    print(f"device placement (TensorFlow's log of the members' ops: {run_dir / 'placement'}):")
    print(format_summary(logs), flush=True)
