"""The between-graph protocol: the typed messages a client sends its launcher, in one place.

A launcher (`ensemble.runs.between`) starts clients (`ensemble client`, `ensemble.replication.
client`) as processes and reads two channels, both written here and read here:

- stderr lines `PREFIX{json}` while the client works, one message each (`Resume`, `Steps`,
  `Epoch`, `MemberDone`, `Interrupted`); other stderr lines are the client's own output;
- at exit, the `Report` JSON in the file named by `$ENSEMBLE_REPORT` (`REPORT_ENV`), which the
  launcher sets; never the user's stdout.

Each message is a frozen dataclass; `kind` names it on the wire (`"kind": "epoch"`), so a
launcher and a client of the same version agree by construction, and `decode` refuses what it
does not know by returning None (the line is then shown as the client's output).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TextIO

PREFIX = "ensemble-progress "
REPORT_ENV = "ENSEMBLE_REPORT"
HEAVY = ("tensorflow", "keras", "sklearn", "scipy", "pandas", "matplotlib")  # a Report's `loaded`
CLIENT_MODULE = "ensemble.replication.client"  # python -m CLIENT_MODULE --request JSON


@dataclass(frozen=True)
class ClientRequest:
    """What a launcher asks of a client process (`python -m ensemble.replication.client
    --request JSON`, `argv`), or a user of `ensemble client`: members `members` of the prepared
    run `run`, trained one after another, or with `predict` (a scaled `.npz` or a data source,
    streamed in batches of `batch_size` rows, label column `target`) predicted into `out` on
    `devices` (one per member; default their training devices) of cluster spec file `cluster`.
    `threads`: TensorFlow inter-op threads (None: TensorFlow's); `progress`: `report` (these
    messages on stderr), `log` (lines on stdout) or `none`."""

    run: str
    members: list[int]
    threads: int | None = None
    progress: str = "log"
    predict: str | None = None
    out: str | None = None
    devices: list[str] | None = None
    cluster: str | None = None
    batch_size: int | None = None
    target: str | None = None

    def argv(self) -> list[str]:
        """The client process's arguments (after `python -m CLIENT_MODULE`)."""
        return ["--request", json.dumps(dataclasses.asdict(self))]

    @classmethod
    def from_json(cls, text: str) -> "ClientRequest":
        """The request of `argv`'s JSON.

        Raises:
            ValueError: not a request's JSON (unknown or missing fields).
        """
        try:
            return cls(**json.loads(text))
        except TypeError as exc:
            raise ValueError(f"not a client request: {exc}") from None


@dataclass(frozen=True)
class Resume:
    """Member `member` resumes at 0-based `epoch` of `epochs` from its checkpoint."""

    kind: ClassVar[str] = "resume"
    member: int
    epoch: int
    epochs: int


@dataclass(frozen=True)
class Steps:
    """Within-epoch progress of `members`: `steps` of `n_steps` done, each member's mean
    `loss` so far (`[n_members]`), `seconds` since the epoch began."""

    kind: ClassVar[str] = "steps"
    members: list[int]
    epoch: int
    epochs: int
    steps: int
    n_steps: int
    loss: list[float]
    seconds: float


@dataclass(frozen=True)
class Epoch:
    """One member's epoch ended: its history record (`member`, `epoch`, `loss`, `val_loss`,
    the task's validation scores, `seconds`) and the run's `epochs`."""

    kind: ClassVar[str] = "epoch"
    epochs: int
    record: dict[str, Any]


@dataclass(frozen=True)
class MemberDone:
    """Member `member` is trained and its files written (`work_seconds` of training)."""

    kind: ClassVar[str] = "member-done"
    member: int
    work_seconds: float


@dataclass(frozen=True)
class Interrupted:
    """SIGINT/SIGTERM stopped member `member` in 0-based `epoch` of `epochs`."""

    kind: ClassVar[str] = "interrupted"
    member: int
    epoch: int
    epochs: int


Message = Resume | Steps | Epoch | MemberDone | Interrupted
KINDS = {cls.kind: cls for cls in (Resume, Steps, Epoch, MemberDone, Interrupted)}


def encode(message: Message) -> str:
    """The stderr line of `message` (without its newline)."""
    body = dataclasses.asdict(message)
    if isinstance(message, Epoch):
        body = {**body.pop("record"), "epochs": message.epochs}
    return PREFIX + json.dumps({"kind": message.kind, **body})


def decode(line: str) -> Message | None:
    """The message of a client's stderr `line`, or None for any other line (the client's own
    output, a damaged or unknown message). A message is found after other text too: another
    writer of the same stderr (a C++ log line written in parts, say) may have left the start
    of its line before the message's one write."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    try:
        body = json.loads(line[at + len(PREFIX):])
        cls = KINDS[body.pop("kind")]
        if cls is Epoch:
            return Epoch(body.pop("epochs"), body)
        return cls(**body)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def send(message: Message, stream: TextIO | None = None) -> None:
    """Write `message` to `stream` (default stderr) as one line in ONE write, flushed: the
    launcher reads it at once. (`print` writes the text and its newline separately, and with
    `PYTHONUNBUFFERED` or `-u`, which containers and CI often set, stderr writes each through:
    a TensorFlow log line or another thread's output landing between the two glued itself to
    the message, which the launcher then could not read.)"""
    stream = stream or sys.stderr
    stream.write(encode(message) + "\n")
    stream.flush()


@dataclass(frozen=True)
class Report:
    """What a client (or any measured process) reports at exit: `payload` as JSON in the file
    `$ENSEMBLE_REPORT` names (when set), plus `loaded`, the heavy libraries it imported."""

    payload: dict[str, Any] = field(default_factory=dict)

    def write(self, loaded: list[str]) -> dict[str, Any]:
        """Write the report file (when the launcher asked for one); returns the payload."""
        payload = {**self.payload, "loaded": loaded}
        path = os.environ.get(REPORT_ENV)
        if path:
            Path(path).write_text(json.dumps(payload))
        return payload


def read_report(path: str | Path) -> dict[str, Any] | None:
    """The report a process wrote to `path`, or None when it wrote none."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    return json.loads(text) if text.strip() else None
