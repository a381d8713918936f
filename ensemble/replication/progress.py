"""Training progress for people and for launchers, as `training.Callback`s.

- On a terminal (`TerminalProgress`): a Keras progress bar per epoch with the members' mean
  loss, then one line per member with its loss, validation loss and accuracy (regression:
  RMSE, and the units: the loss is on the standardised target, the validation scores are in
  the target's units).
- Elsewhere (`LogProgress`: a pipe, a file, CI): one line per epoch, and one every few seconds
  within a long epoch; every line is flushed, so `ensemble train | cat` shows them as they come.
- Between-graph clients (`ReportProgress`): one machine-readable line per epoch (and every few
  seconds within one) on stderr, `ensemble.replication.protocol` messages; the launcher reads them and prints
  `member I: ...` lines itself (`format_report`). Reports never go to the user's stdout.

Verbosity: 0 quiet (nothing), 1 normal, 2 verbose (off a terminal: a line per member too).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

import numpy as np

from ensemble.replication import protocol
from ensemble.replication.training import Callback

LOG_EVERY_SECONDS = 5.0


def _score(r: dict) -> str:
    """The record's second validation score (its task's `score_names[1]`: `val_accuracy`,
    `val_rmse`, ...): its first `val_` entry besides `val_loss`."""
    return next(k for k in r if k.startswith("val_") and k != "val_loss")


def _member_line(r: dict) -> str:
    """`loss L - val_loss V - val_accuracy A`, with the units the task names for its scores
    (`Task.score_units`: regression's loss is on the standardised target while its validation
    scores are in the target's units, so a negative loss beside a larger val_loss is not
    overfitting)."""
    from ensemble.tasks.registry import score_units

    score = _score(r)
    loss_unit, score_unit = score_units().get(score, ("", ""))
    return (f"loss {r['loss']:.4f}{loss_unit} - val_loss {r['val_loss']:.4f} - "
            f"{score} {r[score]:.4f}{score_unit}")


class TerminalProgress(Callback):
    """Keras `Progbar` per epoch (members' mean loss), then a line per member."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.bar, self.epochs = None, 0

    def on_train_begin(self, start_epoch, epochs, n_steps):
        self.epochs = epochs

    def on_call_end(self, epoch, steps_done, n_steps, mean_losses, seconds):
        import keras

        if self.bar is None:
            print(f"Epoch {epoch + 1}/{self.epochs}", file=self.stream, flush=True)
            self.bar = keras.utils.Progbar(n_steps, stateful_metrics=["loss"])
        self.bar.update(steps_done, [("loss", float(np.mean(mean_losses)))])

    def on_epoch_end(self, epoch, records):
        self.bar = None
        for r in records:
            print(f"  member {r['member']}: {_member_line(r)}", file=self.stream, flush=True)


class LogProgress(Callback):
    """Log lines: one per epoch (members' means), one every `every` seconds within an epoch;
    with `verbose`, one per member and epoch too."""

    def __init__(self, stream: TextIO | None = None, verbose: bool = False,
                 every: float = LOG_EVERY_SECONDS, prefix: str = ""):
        self.stream, self.verbose, self.every, self.prefix = stream, verbose, every, prefix
        self.epochs, self.last = 0, 0.0

    def _print(self, text: str) -> None:
        print(f"{self.prefix}{text}", file=self.stream or sys.stdout, flush=True)

    def on_train_begin(self, start_epoch, epochs, n_steps):  # a resume: `ResumeNotice`
        self.epochs, self.last = epochs, time.monotonic()

    def on_call_end(self, epoch, steps_done, n_steps, mean_losses, seconds):
        now = time.monotonic()
        if steps_done < n_steps and now - self.last >= self.every:
            self.last = now
            self._print(f"epoch {epoch + 1}/{self.epochs}: step {steps_done}/{n_steps} - "
                        f"loss {np.mean(mean_losses):.4f} - {seconds:.1f} s")

    def on_epoch_end(self, epoch, records):
        self.last = time.monotonic()
        if not records:  # every member still training diverged in this epoch: no line
            return
        mean = {k: float(np.mean([r[k] for r in records]))
                for k in ("loss", "val_loss", _score(records[0]))}
        many = f" (mean of {len(records)} members)" if len(records) > 1 else ""
        self._print(f"epoch {epoch + 1}/{self.epochs}: {_member_line(mean)} - "
                    f"{records[0]['seconds']:.1f} s{many}")
        if self.verbose and len(records) > 1:
            for r in records:
                self._print(f"  member {r['member']}: {_member_line(r)}")


class ReportProgress(Callback):
    """Machine-readable progress of a between-graph client for its launcher: lines
    `protocol` messages on `stream` (default stderr): `Epoch` per member and epoch (its history
    record), `Steps` every `every` seconds within an epoch, `Resume` on a resumed run."""

    def __init__(self, members, stream: TextIO | None = None,
                 every: float = LOG_EVERY_SECONDS):
        self.stream, self.every, self.epochs, self.last = stream, every, 0, 0.0
        self.members = [int(i) for i in members]

    def on_train_begin(self, start_epoch, epochs, n_steps):
        self.epochs, self.last = epochs, time.monotonic()
        if start_epoch:
            for i in self.members:
                protocol.send(protocol.Resume(i, start_epoch, epochs), self.stream)

    def on_call_end(self, epoch, steps_done, n_steps, mean_losses, seconds):
        now = time.monotonic()
        if steps_done < n_steps and now - self.last >= self.every:
            self.last = now
            protocol.send(protocol.Steps(self.members, epoch, self.epochs, steps_done, n_steps,
                                         [float(v) for v in mean_losses], seconds), self.stream)

    def on_epoch_end(self, epoch, records):
        self.last = time.monotonic()
        for r in records:
            protocol.send(protocol.Epoch(self.epochs, dict(r)), self.stream)


def resume_line(start_epoch: int, epochs: int) -> str:
    """Where a resumed run continues from its checkpoint of `start_epoch` epochs (0: none):
    `resuming at epoch E of N from ...`, or, when every epoch is in it (stopped after
    training), that only the rest is redone."""
    if start_epoch >= epochs:
        return (f"every epoch trained (the checkpoint of epoch {start_epoch}); resuming after "
                "training")
    where = (f"from the checkpoint of epoch {start_epoch}" if start_epoch
             else "from the start (no checkpoint yet)")
    return f"resuming at epoch {start_epoch + 1} of {epochs} {where}"


class ResumeNotice(Callback):
    """On a resumed run, one line saying the epoch training continues from (stderr)."""

    def __init__(self, stream: TextIO | None = None, prefix: str = ""):
        self.stream, self.prefix = stream, prefix

    def on_train_begin(self, start_epoch, epochs, n_steps):
        print(f"{self.prefix}{resume_line(start_epoch, epochs)}", file=self.stream or sys.stderr,
              flush=True)


def format_report(message: protocol.Message, verbose: bool = False) -> str | None:
    """The launcher's line for a client's progress message: `member I: epoch E/N - loss ...`,
    or None for messages it does not show (within-epoch ones unless `verbose`)."""
    if isinstance(message, protocol.Resume):
        return f"member {message.member}: {resume_line(message.epoch, message.epochs)}"
    if isinstance(message, protocol.Epoch):
        r = message.record
        return (f"member {r['member']}: epoch {r['epoch'] + 1}/{message.epochs} - "
                f"{_member_line(r)} - {r['seconds']:.1f} s")
    if verbose and isinstance(message, protocol.Steps):
        return "\n".join(
            f"member {i}: epoch {message.epoch + 1}/{message.epochs} step "
            f"{message.steps}/{message.n_steps} - loss {loss:.4f}"
            for i, loss in zip(message.members, message.loss))
    return None


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):  # closed or odd streams are not terminals
        return False


def for_people(verbosity: int = 1, stream: TextIO | None = None) -> list[Callback]:
    """The progress callbacks for a person watching `stream` (default stdout): none when
    `verbosity` is 0, a progress bar on a terminal, log lines elsewhere."""
    stream = stream or sys.stdout
    if verbosity <= 0 or stream is None:  # no stdout at all (`pythonw`, a closed descriptor)
        return []
    if _isatty(stream):
        return [TerminalProgress(stream)]
    return [LogProgress(stream, verbose=verbosity >= 2)]


class RowProgress:
    """Progress of a streamed prediction in rows, with rows per second: a Keras `Progbar` on a
    terminal (when Keras is loaded: a between-graph launcher never loads it), elsewhere a log
    line every `every` seconds; `end` prints the closing line.

    Args:
        total: rows of the input, or None when unknown (CSV).
        verbosity: 0 prints nothing.
        start: when the prediction began (`time.monotonic()`; default: now): rows per second
            are over the wall time since then, member loading and client processes included.
    """

    def __init__(self, total: int | None, stream: TextIO | None = None, verbosity: int = 1,
                 every: float = LOG_EVERY_SECONDS, start: float | None = None):
        self.total, self.stream, self.verbosity, self.every = total, stream, verbosity, every
        self.start = time.monotonic() if start is None else start
        self.last = time.monotonic()
        self.rows, self.bar = 0, None
        out = stream or sys.stdout
        if verbosity > 0 and _isatty(out) and "keras" in sys.modules:  # never load it here
            import keras

            self.bar = keras.utils.Progbar(total, stateful_metrics=["rows/s"], unit_name="row")

    def _rate(self) -> float:
        return self.rows / max(time.monotonic() - self.start, 1e-9)

    def update(self, rows: int) -> None:
        """`rows` more rows are done."""
        self.rows += rows
        if self.verbosity <= 0:
            return
        if self.bar is not None:
            self.bar.update(self.rows, [("rows/s", self._rate())])
            return
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            of = f"/{self.total:,}" if self.total else ""
            print(f"predicted {self.rows:,}{of} rows - {self._rate():,.0f} rows/s",
                  file=self.stream or sys.stdout, flush=True)

    def end(self) -> float:
        """Print the closing line; returns the seconds since the start."""
        seconds = time.monotonic() - self.start
        if self.verbosity > 0:
            print(f"predicted {self.rows:,} row{'s' * (self.rows != 1)} in {seconds:.1f} s "
                  f"({self._rate():,.0f} rows/s)", file=self.stream or sys.stdout, flush=True)
        return seconds
