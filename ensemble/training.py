"""Training: THE per-member step, the traced many-steps call, and the epoch loop.

One traced call runs `K` steps (up to a whole epoch) of every member of a group, like Keras's
`steps_per_execution`: the batch rows go in once as a `[steps, n_members, batch]` int32 tensor,
a `tf.while_loop` runs the steps, the losses are summed on the device, and the host syncs once
per call. Both replication modes call the same per-member `train_step` inside it, which is what
keeps their members identical; `K` changes only how often the host looks, never the numbers.

Per-epoch hooks (progress, TensorBoard, a stop check) plug into `train_loop` as `Callback`
objects. SIGINT/SIGTERM (when `ensemble.interrupt.handling_signals` is on) stop the loop after
the current traced call or after an epoch's checkpoint (`interrupt.Interrupted`).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from ensemble import metrics
from ensemble.members import batch_order

CALL_SECONDS = 1.0  # automatic K aims at calls of about this long (progress every call)
FIRST_CALL_STEPS = 8


def train_step(model, optimizer, x, y, idx):
    """THE training step of one member: gather the batch, forward, backward, Adam update.

    Args:
        x: `[n_train, n_features]` float32 tensor on the member's device.
        y: `[n_train]` int32 class indices on the member's device.
        idx: `[batch]` int32 row indices of this batch.

    Returns:
        Scalar float32 mean cross-entropy (natural log) of the batch, plus the member's kernel
        L2 penalty (`model.losses`) when it has one.
    """
    import keras
    import tensorflow as tf

    xb, yb = tf.gather(x, idx), tf.gather(y, idx)
    with tf.GradientTape() as tape:
        probs = model(xb, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(yb, probs))
        if model.losses:  # the kernel L2 penalty (`members.l2`)
            loss = loss + tf.add_n(model.losses)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads)
    return loss


def make_steps_fn(models, optimizers, devices, x_train, y_train, client_device: str,
                  on_device: dict | None = None):
    """The traced call that trains a group of members for several steps.

    The training data is copied once onto each member's device; or the caller gives those
    copies as `on_device` `{device: (x [n_train, n_features] float32, y [n_train] int32)}`,
    e.g. variables it reassigns between fits so that the call is traced once
    (`ensemble.graph_cache`; `x_train`, `y_train` are then unused). The returned function takes
    `idx` `[steps, n_members, batch]` int32 (member `k`'s rows of each step) and `total`
    `[n_members]` float32 (the epoch's running loss sum so far) and returns `total` plus, step
    after step, each member's batch-mean loss x batch rows: carrying the running sum through
    the calls makes it independent of how the steps are split into calls.
    Every step calls `train_step` for every member under `tf.device` of its device; the
    summing runs on `client_device`.
    """
    import tensorflow as tf

    on_device = dict(on_device or {})
    for device in dict.fromkeys(devices):
        if device in on_device:
            continue
        with tf.device(device):
            on_device[device] = (tf.identity(tf.constant(x_train, tf.float32)),
                                 tf.identity(tf.constant(y_train, tf.int32)))
    n = len(models)

    @tf.function(input_signature=[tf.TensorSpec([None, n, None], tf.int32),
                                  tf.TensorSpec([n], tf.float32)], autograph=False)
    def run_steps(idx, total):
        rows = tf.cast(tf.shape(idx)[2], tf.float32)

        def body(s, total):
            losses = []
            for k, (model, opt, device) in enumerate(zip(models, optimizers, devices)):
                with tf.device(device):
                    x, y = on_device[device]
                    losses.append(train_step(model, opt, x, y, idx[s, k]))
            with tf.device(client_device):
                return s + 1, total + tf.stack(losses) * rows

        with tf.device(client_device):
            _, total = tf.while_loop(lambda s, _: s < tf.shape(idx)[0], body,
                                     [tf.constant(0), total],
                                     parallel_iterations=1)
            return total

    return run_steps


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
    """

    def __init__(self, batch_size: int, n_train: int):
        self.batch_size, self.n_train = batch_size, n_train
        self.rows, self.seconds = 0, 0.0
        self._first, self._last = True, (0, 0.0)

    def on_call_end(self, epoch, steps_done, n_steps, mean_losses, seconds):
        done = min(steps_done * self.batch_size, self.n_train)
        if steps_done > self._last[0] and not self._first:
            self.rows += done - min(self._last[0] * self.batch_size, self.n_train)
            self.seconds += seconds - self._last[1]
        self._first = False
        self._last = (steps_done, seconds) if steps_done < n_steps else (0, 0.0)


def _plan(n_steps: int, batch_size: int, n_train: int):
    """Row bounds `(lo, hi)` of each step; the last one ragged when `batch_size` does not
    divide `n_train`."""
    return [(s * batch_size, min((s + 1) * batch_size, n_train)) for s in range(n_steps)]


def train_loop(run_steps: Callable[[np.ndarray, np.ndarray], np.ndarray],
               predict_val: Callable[[], np.ndarray], indices: Sequence[int], run_seed: int,
               epochs: int, n_train: int, batch_size: int, y_val: np.ndarray,
               checkpoints=None, callbacks: Sequence[Callback] = (),
               steps_per_call: int = 0, checkpoint_every: int = 1) -> list[dict]:
    """Run the epochs for the members `indices` and record their history.

    Args:
        run_steps: takes `[steps, len(indices), batch]` int32 batch rows and the running
            `[len(indices)]` float32 loss sum, runs those steps for those members
            (`make_steps_fn`), returns the new running sum (losses x rows).
        predict_val: returns validation probabilities `[len(indices), n_val, n_classes]`;
            None when there is no validation data (`val_loss`, `val_accuracy` are then NaN).
        y_val: `[n_val]` validation class indices (unused without `predict_val`).
        checkpoints: optional `checkpoints.EpochCheckpoints`: training resumes after its
            newest checkpoint and saves one every `checkpoint_every` epochs and after the last.
        callbacks: `Callback` hooks, called in order.
        steps_per_call: steps per traced call (K); 0 picks K so that a call takes about
            `CALL_SECONDS`. The full-size batches and the ragged last batch go in separate
            calls (a tensor has one batch size).

    Returns:
        History records `{member, epoch, loss, val_loss, val_accuracy, seconds}` of every epoch
        (restored ones included); `seconds` is the epoch's wall time, shared by the members
        trained together.
    """
    from ensemble import interrupt
    from ensemble.checkpoints import hold_here, hold_point

    with interrupt.deferred():
        return _epochs(run_steps, predict_val, indices, run_seed, epochs, n_train, batch_size,
                       y_val, checkpoints, callbacks, steps_per_call, checkpoint_every,
                       hold_point(indices), hold_here, interrupt.check)


def _epochs(run_steps, predict_val, indices, run_seed, epochs, n_train, batch_size, y_val,
            checkpoints, callbacks, steps_per_call, checkpoint_every, hold, hold_here, check):
    start_epoch, records = checkpoints.restore() if checkpoints is not None else (0, [])
    n_steps = -(-n_train // batch_size)
    n_full = n_train // batch_size
    k = steps_per_call or min(FIRST_CALL_STEPS, n_steps)
    for cb in callbacks:
        cb.on_train_begin(start_epoch, epochs, n_steps)
    for epoch in range(start_epoch, epochs):
        start = time.perf_counter()
        order = np.stack([batch_order(run_seed, i, epoch, n_train) for i in indices])
        full = order[:, :n_full * batch_size].reshape(len(indices), n_full, batch_size)
        full = np.ascontiguousarray(full.transpose(1, 0, 2))  # [n_full, n_members, batch]
        hold_step = hold[1] if hold is not None and hold[0] == epoch else None
        total, done = np.zeros(len(indices), np.float32), 0
        while done < n_steps:
            if done < n_full:
                stop = min(n_full, done + k)
                if hold_step is not None and done <= hold_step < stop - 1:
                    stop = hold_step + 1  # a call boundary where the test hook holds
                batch = full[done:stop]
            else:
                stop, batch = n_steps, order[:, n_full * batch_size:][None]
            call_start = time.perf_counter()
            total = np.asarray(run_steps(batch, total), np.float32)
            if not steps_per_call and stop - done == k and stop <= n_full:
                per_step = (time.perf_counter() - call_start) / k
                k = int(min(max(1, CALL_SECONDS / max(per_step, 1e-6)), 4 * k, n_steps))
            rows = n_train if stop == n_steps else stop * batch_size
            done = stop
            for cb in callbacks:
                cb.on_call_end(epoch, done, n_steps, total / np.float32(rows),
                               time.perf_counter() - start)
            check(epoch + 1, epochs)
            if hold_step is not None and done == hold_step + 1:
                hold_here()
        losses = total.astype(np.float64) / n_train
        val = predict_val() if predict_val is not None else None
        seconds = time.perf_counter() - start
        nan = float("nan")
        new = [{"member": i, "epoch": epoch, "loss": float(losses[j]),
                "val_loss": nan if val is None else metrics.nll(y_val, val[j]),
                "val_accuracy": nan if val is None else metrics.accuracy(y_val, val[j]),
                "seconds": seconds}
               for j, i in enumerate(indices)]
        records.extend(new)
        if checkpoints is not None and ((epoch + 1) % checkpoint_every == 0
                                        or epoch + 1 == epochs):
            checkpoints.save(epoch, records)
        for cb in callbacks:
            cb.on_epoch_end(epoch, new)
        check(min(epoch + 2, epochs), epochs)
        if hold is not None and hold == (epoch, None):
            hold_here()
    return records
