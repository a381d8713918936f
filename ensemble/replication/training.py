"""Training: THE per-member step, the traced many-steps call, and the epoch loop.

One traced call runs `K` steps (up to a whole epoch) of every member of a group, like Keras's
`steps_per_execution`: the batches go in once as `[n_members, steps, batch, *row_shape]` rows
gathered on the host from the (memory-mapped) split by the members' row order, the next call's
while the current one runs, across epochs (`ensemble.replication.feed`); a `tf.while_loop`
runs the steps, the losses are summed on the device, and the host syncs once per call. Both
replication modes call the same per-member `train_step` inside it, which is what keeps their
members identical; `K` changes only how often the host looks, never the numbers.

Per-epoch hooks (progress, TensorBoard, a stop check) plug into `train_loop` as `Callback`
objects. SIGINT/SIGTERM (when `ensemble.core.interrupt.handling_signals` is on) stop the loop after
the current traced call or after an epoch's checkpoint (`interrupt.Interrupted`).
"""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ensemble.core import hooks, interrupt
from ensemble.replication.feed import prefetched
from ensemble.models.members import batch_order, member_rng

if TYPE_CHECKING:
    from ensemble.replication.early_stopping import EarlyStopping

CALL_SECONDS = 1.0  # automatic K aims at calls of about this long (progress every call)
FIRST_CALL_STEPS = 8


@dataclass(frozen=True)
class Schedule:
    """How a group of members trains, epoch by epoch (the `[training]` keys that shape the
    loop).

    Attributes:
        run_seed: the run seed (batch order of member `i` in epoch `e`: `batch_order`).
        epochs, batch_size: epochs to train and rows per step.
        steps_per_call: steps per traced call (K); 0 picks K so that a call takes about
            `CALL_SECONDS`.
        checkpoint_every: epochs between checkpoints (the last epoch is always saved).
        patience: early stopping: a member whose validation loss has not improved for this
            many epochs stops and gets its best epoch's weights back (0: off).
        min_delta: the drop of validation loss below the best that counts as an improvement
            (the loss's units: nats per row for the NLL losses).
    """

    run_seed: int
    epochs: int
    batch_size: int
    steps_per_call: int = 0
    checkpoint_every: int = 1
    patience: int = 0
    min_delta: float = 0.0

    @classmethod
    def of(cls, training) -> "Schedule":
        """The schedule of a `config.TrainingConfig`."""
        return cls(training.seed, training.epochs, training.batch_size,
                   training.steps_per_execution, training.checkpoint_every,
                   training.early_stopping, training.min_delta)

    def steps_per_epoch(self, n_train: int) -> int:
        """Optimiser updates per epoch (the ragged last batch is one)."""
        return -(-n_train // self.batch_size)


def train_step(model, optimizer, xb, yb, task, adversarial=None):
    """THE training step of one member: forward, backward, update on one batch.

    Args:
        xb: `[batch, *input_shape]` float32 (or uint8 images) rows of this batch, gathered
            on the host (`feed.Gather`).
        yb: `[batch]` their targets (class indices for classification).
        task: the run's `tasks` object (its `loss`).
        adversarial: None (the default: no adversarial op in the graph), or the
            `[*input_shape]` sign step of `adversarial.input_step`: the loss is then that
            of the clean plus the fast-gradient-sign batch (`adversarial.loss`).

    Returns:
        Scalar float32 mean task loss of the batch, plus the member's regularisation
        penalties (`model.losses`, e.g. a kernel L2) when it has any.
    """
    import tensorflow as tf

    if xb.dtype != tf.float32:  # images stay uint8 up to here: 4x less memory
        xb = tf.cast(xb, tf.float32)
    with tf.GradientTape() as tape, member_rng(model):
        if adversarial is None:
            loss = task.loss(yb, model(xb, training=True))
        else:  # Lakshminarayanan et al. 2017: clean + adversarial examples
            from ensemble.replication.adversarial import loss as adversarial_loss

            loss = adversarial_loss(model, xb, yb, task, adversarial)
        if model.losses:  # regularisation penalties (the mlp's `l2`, a user's regularisers)
            loss = loss + tf.add_n(model.losses)
        scaled = optimizer.scale_loss(loss)  # times the loss scale under mixed_float16
    grads = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply(grads)
    return loss


class Callback:
    """Hooks of `train_loop`; subclass and override what you need (all default to nothing).

    A hook may raise to stop training (for example on a stop request): the exception leaves
    `train_loop` after the current call; the last saved checkpoint stays the resume point.
    """

    def on_train_begin(self, start_epoch: int, epochs: int, n_steps: int) -> None:
        """Before the first epoch still to train (`start_epoch` > 0 after a resume)."""

    def on_call_end(self, epoch: int, steps_done: int, n_steps: int,
                    mean_losses: np.ndarray, seconds: float) -> None:
        """After each traced call: `steps_done` of `n_steps` steps of `epoch` are done;
        `mean_losses` `[n_members]` is each member's mean loss so far in this epoch;
        `seconds` since the epoch began."""

    def on_epoch_end(self, epoch: int, records: list[dict]) -> None:
        """After `epoch` is validated (and checkpointed when due): `records` are this
        epoch's history records, one per member (see `train_loop`)."""


def train_loop(run_steps: Callable[[object, np.ndarray, np.ndarray], np.ndarray],
               indices: Sequence[int], schedule: Schedule, n_train: int, task,
               predict_val: Callable[[], np.ndarray] | None = None,
               y_val: np.ndarray | None = None, *, checkpoints=None,
               callbacks: Sequence[Callback] = (), stopping: EarlyStopping | None = None,
               divergence=None, gather: Callable[[np.ndarray], object] | None = None,
               max_steps: int | None = None,
               prepare: Callable[[np.ndarray], None] | None = None) -> list[dict]:
    """Run the epochs for the members `indices` and record their history.

    The full-size batches and the ragged last batch go in separate calls (a tensor has one
    batch size).

    Args:
        run_steps: takes a call's batches (`gather` of its `[len(indices), steps, batch]`
            int32 batch rows), the running `[len(indices)]` float32 loss sum and the
            `[len(indices)]` bool active mask, runs those steps for those members
            (`steps.StepsCall`), returns the new running sum.
        indices: the members' indices in the run.
        schedule: the epochs, batch size, K, checkpoint period and patience (`Schedule`).
        n_train: training rows.
        task: the run's `tasks` object (`validation_scores`).
        predict_val: returns validation outputs `[len(indices), n_val, ...]`; None when there
            is no validation data (the validation scores are then NaN).
        y_val: `[n_val]` validation targets (unused without `predict_val`).
        checkpoints: optional `checkpoints.EpochCheckpoints`: training resumes after its
            newest checkpoint and saves one every `schedule.checkpoint_every` epochs and after
            the last.
        callbacks: `Callback` hooks, called in order.
        stopping: `early_stopping.EarlyStopping` (with `schedule.patience`), or None.
        divergence: an `ensemble.replication.divergence.Divergence` of `indices` that records the
            members whose loss sums (checked after every call) or validation outputs
            (after every epoch) turn non-finite; their steps are masked from then on, like
            a stopped member's, and they get no further history records. None: a new one.
        gather: turns a call's batch rows into what `run_steps` takes (`feed.Gather`: the
            rows themselves); run one call ahead in a background thread. None: the row
            indices are passed as they are.
        max_steps: the most steps one call may take (`feed.Gather.plan_calls`: bounds the
            bytes of a call's batches); None: no bound beyond the epoch.
        prepare: called with each epoch's `[len(indices)]` bool active mask before the
            epoch's clock starts (`steps.StepsCall.prepare`: a graph that mask needs is traced
            there, so that its tracing is not timed as training); None: nothing.

    Returns:
        History records `{member, epoch, loss, val_loss, val_<score>..., seconds}` of every
        epoch a member trained (restored ones included; none after a member stopped);
        `seconds` is the epoch's wall time, shared by the members trained together.
    """
    from ensemble.replication.divergence import Divergence

    with interrupt.deferred():
        return _Loop(run_steps, indices, schedule, n_train, task, predict_val, y_val,
                     checkpoints, callbacks, stopping, interrupt.check,
                     divergence or Divergence(indices), gather, max_steps, prepare).run()


class _Loop:
    """The epoch loop of `train_loop` (its arguments as attributes, plus its state)."""

    def __init__(self, run_steps, indices, schedule, n_train, task, predict_val, y_val,
                 checkpoints, callbacks, stopping, check, divergence, gather, max_steps,
                 prepare):
        self.run_steps, self.predict_val = run_steps, predict_val
        self.indices = list(indices)
        self.s, self.n_train, self.y_val, self.task = schedule, n_train, y_val, task
        self.checkpoints, self.callbacks = checkpoints, callbacks
        self.stopping, self.check, self.divergence = stopping, check, divergence
        self.gather = gather or (lambda idx: idx)
        self.prepare = prepare or (lambda active: None)
        self.n_steps = schedule.steps_per_epoch(n_train)
        self.n_full = n_train // schedule.batch_size  # steps of a full batch
        self.max_steps = max_steps or self.n_steps
        self.traced = False
        self.k = min(schedule.steps_per_call or min(FIRST_CALL_STEPS, self.n_steps),
                     self.max_steps)

    def run(self) -> list[dict]:
        s = self.s
        start_epoch, records = (self.checkpoints.restore() if self.checkpoints is not None
                                else (0, []))
        if self.stopping is not None:  # replay the restored epochs' decisions
            for r in records:
                self.stopping.update(self.indices.index(r["member"]), r["epoch"],
                                     r["val_loss"], live=False)
        for cb in self.callbacks:
            cb.on_train_begin(start_epoch, s.epochs, self.n_steps)
        # one stream of calls over the epochs: the next epoch's first batches are gathered
        # while this epoch ends (its last call, validation, checkpoint), not after
        with closing(prefetched(self._calls(start_epoch), lambda c: self.gather(c[3]))) as calls:
            return self._epochs(start_epoch, records, calls)

    def _epochs(self, start_epoch: int, records: list[dict], calls) -> list[dict]:
        s = self.s
        for epoch in range(start_epoch, s.epochs):
            active = (self.stopping.active.copy() if self.stopping is not None
                      else np.ones(len(self.indices), bool)) & self.divergence.healthy()
            if not active.any():
                break
            self.prepare(active)
            start = time.perf_counter()
            total = self._epoch(epoch, active, start, calls)
            new = self._records(epoch, total, active, start)
            records.extend(new)
            if self.checkpoints is not None and ((epoch + 1) % s.checkpoint_every == 0
                                                 or epoch + 1 == s.epochs
                                                 or (self.stopping is not None
                                                     and not self.stopping.active.any())):
                self.checkpoints.save(epoch, records)
            for cb in self.callbacks:
                cb.on_epoch_end(epoch, new)
            self.check(min(epoch + 2, s.epochs), s.epochs)
            hooks.fire("epoch_end", epoch=epoch, members=self.indices)
        if self.stopping is not None:
            self.stopping.finish()
        return records

    def _records(self, epoch, total, active, start) -> list[dict]:
        losses = total.astype(np.float64) / self.n_train
        val = self.predict_val() if self.predict_val is not None else None
        if val is not None and self.divergence.check_outputs(epoch, val, active):
            active &= self.divergence.healthy()  # diverged: no record, no stopping decision
        seconds = time.perf_counter() - start
        new = []
        for j, i in enumerate(self.indices):
            if not active[j]:
                continue
            scores = (self.task.validation_scores(self.y_val, val[j]) if val is not None
                      else dict.fromkeys(self.task.score_names, float("nan")))
            new.append({"member": i, "epoch": epoch, "loss": float(losses[j]), **scores,
                        "seconds": seconds})
            if self.stopping is not None:
                self.stopping.update(j, epoch, scores["val_loss"])
        return new

    def _calls(self, start_epoch: int):
        """`(epoch, done, stop, rows)` of each traced call of the epochs from `start_epoch`:
        steps `done..stop` of `epoch` and their `[n_members, stop - done, batch]` batch rows
        (the ragged last batch alone). Lazy: a call's size is the `k` at the time it is asked
        for."""
        bs, n_full = self.s.batch_size, self.n_full
        for epoch in range(start_epoch, self.s.epochs):
            order = np.stack([batch_order(self.s.run_seed, i, epoch, self.n_train)
                              for i in self.indices])
            full, done = order[:, :n_full * bs].reshape(len(self.indices), n_full, bs), 0
            while done < self.n_steps:
                if done < n_full:
                    stop = min(n_full, done + self.k)
                    yield epoch, done, stop, full[:, done:stop]
                else:
                    stop = self.n_steps
                    yield epoch, done, stop, order[:, None, n_full * bs:]
                done = stop

    def _epoch(self, epoch: int, active: np.ndarray, start: float, calls) -> np.ndarray:
        s, n_steps = self.s, self.n_steps
        total = np.zeros(len(self.indices), np.float32)
        for (_, done, stop, _), batch in calls:  # this epoch's calls, in order
            call_start = time.perf_counter()
            total = np.asarray(self.run_steps(batch, total, active), np.float32)
            if self.divergence.check_losses(epoch, total, active):  # values already here
                active &= self.divergence.healthy()  # masked from the next call on
                if not active.any():  # the run ends: no later epoch has a member to train,
                    break  # so the rest of this epoch's calls is never asked for
            if (self.traced and not s.steps_per_call and stop <= self.n_full
                    and stop - done >= min(self.k, FIRST_CALL_STEPS)):
                per_step = (time.perf_counter() - call_start) / (stop - done)
                self.k = int(min(max(1, CALL_SECONDS / max(per_step, 1e-6)), 4 * self.k,
                                 n_steps, self.max_steps))
            self.traced = True  # the run's first call traces the graph: its time is no guide
            rows = self.n_train if stop == n_steps else stop * s.batch_size
            for cb in self.callbacks:
                cb.on_call_end(epoch, stop, n_steps, total / np.float32(rows),
                               time.perf_counter() - start)
            self.check(epoch + 1, s.epochs)
            hooks.fire("call_end", epoch=epoch, steps_done=stop, members=self.indices)
            if stop == n_steps:
                break
        return total
