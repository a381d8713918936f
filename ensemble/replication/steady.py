"""The steady-state training rate of a run: a `training.Callback` that counts the rows and seconds
of every traced call after the first (`benchmarks.benchmark`, `ensemble compare`)."""

from __future__ import annotations

import time

from ensemble.replication.training import Callback


class SteadyState(Callback):
    """Measures the steady-state training rate: the rows each member trained in every traced
    call after the run's first one (which pays for tracing and warm-up), and their seconds.

    Args:
        batch_size, n_train: the run's batch size and training rows (rows of a call follow from
            its step count; the ragged last step has `n_train % batch_size` rows).

    Attributes:
        rows: rows per member over the steady-state calls.
        seconds: wall seconds of those calls (host time between call ends, so the host's own
            work between calls, small, is included; validation and checkpoints are not).
        spans: `[start_unix, end_unix, rows]` of each run of back-to-back steady calls (one
            per epoch): when the calls ran, so that the calls of processes training at once
            can be told apart from those that ran alone (`benchmarks.benchmark`).
    """

    def __init__(self, batch_size: int, n_train: int):
        self.batch_size, self.n_train = batch_size, n_train
        self.rows, self.seconds = 0, 0.0
        self.spans: list[list[float]] = []
        self._first, self._last = True, (0, 0.0)

    def on_call_end(self, epoch, steps_done, n_steps, mean_losses, seconds):
        done = min(steps_done * self.batch_size, self.n_train)
        if steps_done > self._last[0] and not self._first:
            rows = done - min(self._last[0] * self.batch_size, self.n_train)
            self.rows += rows
            self.seconds += seconds - self._last[1]
            end = time.time()
            if self._last[0] and self.spans:  # the call went on from the previous one
                self.spans[-1][1:] = [end, self.spans[-1][2] + rows]
            else:
                self.spans.append([end - (seconds - self._last[1]), end, rows])
        self._first = False
        self._last = (steps_done, seconds) if steps_done < n_steps else (0, 0.0)
