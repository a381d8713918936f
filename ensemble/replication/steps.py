"""The traced many-steps call: K steps of every member of a group, each data-parallel over its replicas.

`make_steps_fn` is the call both replication modes run (in-graph for all members, a client for
its one): THE per-member step (`training.train_step`) for every member, or its data-parallel
form below for a member of several replicas.

Data-parallel members in training: one member's step split over its replicas' devices.

`make_parallel`, for training: each batch's rows are split as evenly as possible across the
member's `R` replicas (replica `j` takes rows `[n*j//R, n*(j+1)//R)`), each replica runs the
member's forward pass and its part's loss and gradients on its own device (one
`GradientTape` per replica, `tape.gradient` under that replica's `tf.device`), and the
gradients are averaged on the member's home device (replica 0's device, where its variables
live), each part weighted by its rows `n_j / n`, then applied once by the member's optimiser.

`replicated_train_step` generalises `training.train_step`: with one replica it IS that step
(same graph, same numbers). With `R` replicas and no dropout it is the same update up to float
summation order. Dropout draws a mask per replica call (the member's seed generator advances
once per call, in a fixed order), so a replicated member is deterministic but draws other
masks than the unreplicated one. Batch statistics (batch normalisation) are per replica.
"""

from __future__ import annotations

from typing import Sequence

from ensemble.replication.training import train_step
from ensemble.models.members import member_rng


def replicated_train_step(model, optimizer, batch, task, devices: Sequence[str],
                          adversarial=None):
    """THE training step of one member over its replicas (`training.train_step` when
    `len(devices) == 1`).

    Args:
        model, optimizer: the member's Keras model (variables on `devices[0]`) and optimiser.
        batch: `(xb, yb)` (as Keras's `train_step(data)`): `xb` `[batch, *input_shape]` the
            batch's rows (float32, or uint8 images), `yb` `[batch]` their targets.
        task: the run's `tasks` object (its `loss`).
        devices: `[R]` distinct device names of the member's replicas; replica 0's is the
            member's home device (variables, the average and the update).
        adversarial: None, or the sign step of adversarial training (`training.train_step`);
            each replica perturbs its rows (the sign of a row's input gradient does not
            depend on how the batch is split).

    Returns:
        Scalar float32 batch loss: the row-weighted mean of the replicas' losses, i.e. the
        batch-mean task loss plus the member's regularisation penalties.
    """
    import tensorflow as tf

    home, (xb, yb) = devices[0], batch
    if len(devices) == 1:
        return train_step(model, optimizer, xb, yb, task, adversarial)
    n = tf.shape(yb)[0]
    rows = tf.cast(n, tf.float32)
    parts = []  # (weight n_j / n, loss_j, grads_j) of every replica
    for j, device in enumerate(devices):
        lo, hi = n * j // len(devices), n * (j + 1) // len(devices)
        with tf.name_scope(f"replica_{j}_{model.name}"), tf.device(device):
            xj, yj = xb[lo:hi], yb[lo:hi]
            if xj.dtype != tf.float32:
                xj = tf.cast(xj, tf.float32)
            with tf.GradientTape() as tape, member_rng(model):
                if adversarial is None:
                    loss = task.loss(yj, model(xj, training=True))
                else:
                    from ensemble.replication.adversarial import loss as adversarial_loss

                    loss = adversarial_loss(model, xj, yj, task, adversarial)
                if model.losses:
                    loss = loss + tf.add_n(model.losses)
                scaled = optimizer.scale_loss(loss)  # the optimiser unscales the average
            grads = tape.gradient(scaled, model.trainable_variables)
            weight = tf.cast(hi - lo, tf.float32) / rows
            # an empty part (a batch of fewer rows than replicas) has a NaN mean loss and
            # zero data gradients: it counts with weight 0
            loss = tf.where(hi > lo, loss, 0.0)
            parts.append((weight, loss, grads))
    with tf.name_scope(f"replica_mean_{model.name}"), tf.device(home):
        grads = [tf.add_n([w * tf.convert_to_tensor(g[v]) for w, _, g in parts])
                 for v in range(len(model.trainable_variables))]
        loss = tf.add_n([w * l for w, l, _ in parts])
        optimizer.apply(grads)
    return loss


def make_steps_fn(models: Sequence, optimizers: Sequence, devices: Sequence[str], task,
                  row_shape: tuple, x_dtype, client_device: str = "/device:CPU:0", *,
                  masked: bool = False, replicas: Sequence[Sequence[str]] | None = None,
                  adversarial: Sequence | None = None):
    """The traced call that trains a group of members for several steps.

    Args:
        models, optimizers: `[n_members]` the members' Keras models (built under their
            device) and built optimisers.
        devices: `[n_members]` device names: member `k`'s variables, loop and steps.
        task: the run's `tasks` object (its `loss`, `target_dtype`).
        row_shape: a row's shape; x_dtype: the rows' `tf.DType` (float32, or uint8 images).
        client_device: where a call's rows arrive and the members' sums are stacked.
        masked: a member whose `active` is false skips its steps (no update, loss 0): one
            loop per member, each inside a condition; unmasked, `active` is ignored, the
            graph holds no condition and a device's members share one loop (`StepsCall`
            picks the form: masked once some member has stopped or diverged).
        replicas: `[n_members]` lists of device names, replica 0 the member's device (None:
            one each): a member of several replicas takes `replicated_train_step`,
            data-parallel (the same step for one replica).
        adversarial: None, or `[n_members]` sign steps `[*input_shape]` of
            `adversarial.input_step` (adversarial training).


    The returned function takes `xb` `[n_members, steps, batch, *row_shape]` (`x_dtype`)
    and `yb` `[n_members, steps, batch]` (the task's target dtype): member `k`'s rows of
    each step, gathered on the host (`feed.Gather`), member-major so that `xb[k]` is a
    view, plus `total` `[n_members]` float32 (the epoch's running loss sum so far) and
    `active` `[n_members]` bool, and returns `total` plus, step after step, each member's
    batch-mean loss x batch rows: carrying the running sum through the calls makes it
    independent of how the steps are split into calls.

    The members of each device run their steps in one `tf.while_loop` on that device
    (`device_loop`), one step of each per iteration. A member's rows of the call are sent to
    its device once per call, nothing crosses devices step by step, the devices' loops run
    side by side without waiting for each other, and only stacking the sums runs on
    `client_device`. With `masked`, each member has a loop of its own inside a
    condition on `active[k]` instead, so that an inactive member skips its steps
    (`StepsCall` traces that form only once a member has stopped).
    """
    import tensorflow as tf

    n = len(devices)
    members = []  # (model, optimizer, replica devices, adversarial sign step or None)
    for k, device in enumerate(devices):
        with tf.device(device):
            members.append((models[k], optimizers[k],
                            replicas[k] if replicas is not None else [device],
                            None if adversarial is None
                            else tf.constant(adversarial[k], tf.float32)))
    units: dict = {}  # the members of one loop: a device's, or one member's (masked)
    for k in range(n):
        units.setdefault(k if masked else devices[k], []).append(k)

    @tf.function(input_signature=[tf.TensorSpec([n, None, None, *row_shape],
                                                x_dtype),
                                  tf.TensorSpec([n, None, None], task.target_dtype),
                                  tf.TensorSpec([n], tf.float32),
                                  tf.TensorSpec([n], tf.bool)], autograph=False)
    def run_steps(xb, yb, total, active):
        sums = [None] * n
        for ks in units.values():
            device = devices[ks[0]]
            with tf.device(client_device):  # the members' rows of the call (views), sent once
                fed = [(xb[k], yb[k], total[k]) for k in ks]
            with tf.device(device):
                # copied to the loop's device first: its frame nodes sit beside its inputs,
                # and on the client device they made every step wait on a cross-device send
                fed = [tuple(tf.identity(t) for t in f) for f in fed]
                loop = device_loop([members[k] for k in ks], device, task)
                if masked:  # one member
                    out = [tf.cond(active[ks[0]], lambda: loop(fed)[0], lambda: fed[0][2])]
                else:
                    out = loop(fed)
            for k, total_k in zip(ks, out):
                sums[k] = total_k
        with tf.device(client_device):
            return tf.stack(sums)

    return run_steps


def device_loop(members: Sequence[tuple], device: str, task):
    """The steps of a call of the members of one device: `loop(fed)` runs, in one
    `tf.while_loop` on `device`, `replicated_train_step` for every member at every step.

    Args:
        members: `[(model, optimizer, replica devices, adversarial sign step or None)]`.
        device: where the loop's counter, condition and sums run.
        task: the run's `tasks` object.

    Returns:
        `loop(fed)`: `fed` `[(xk [steps, batch, *row_shape], yk [steps, batch], total_k)]`
        one per member, all of the same steps and batch; returns `[total_k + sum over steps
        of the batch-mean loss x batch rows]` in the same order.
    """
    import tensorflow as tf

    def loop(fed):
        with tf.device(device):
            n_steps = tf.shape(fed[0][1])[0]
            rows = tf.cast(tf.shape(fed[0][1])[1], tf.float32)

            def body(s, *sums):
                return (s + 1, *[
                    total + replicated_train_step(model, optimizer, (xk[s], yk[s]), task,
                                                  group, adversarial) * rows
                    for total, (xk, yk, _), (model, optimizer, group, adversarial)
                    in zip(sums, fed, members)])

            out = tf.while_loop(lambda s, *_: s < n_steps, body,
                                [tf.constant(0), *[total for _, _, total in fed]],
                                parallel_iterations=1)
            return list(out[1:])

    return loop


class StepsCall:
    """A group's many-steps training call as `training.train_loop` runs it: numpy in and out,
    traced without masking while every member trains (one loop per device) and masked
    (`make_steps_fn`'s `masked`) for the calls in which some member does not (early stopping,
    divergence); each form is traced on first use.

    Args:
        make: `make(masked: bool)` -> the traced call (`make_steps_fn`).
    """

    def __init__(self, make):
        self.make, self.traced = make, {}

    def _form(self, masked: bool):
        if masked not in self.traced:
            self.traced[masked] = self.make(masked)
        return self.traced[masked]

    def prepare(self, active) -> None:
        """Trace the masked form now if `active` `[n_members]` bool has an inactive member
        and it is not traced yet (`training.train_loop`'s `prepare`: between epochs, where a member
        stops, so that the next call is not slowed by its tracing). The unmasked form is
        traced by the run's first call, which the loop already times apart."""
        if not active.all():
            self._form(True).get_concrete_function()

    def __call__(self, batch, total, active):
        """Run `batch` (`(xb, yb)` of `feed.Gather`) from the running sums `total`
        `[n_members]` float32 with `active` `[n_members]` bool; returns the new sums."""
        import tensorflow as tf

        from ensemble.replication.feed import to_tensor

        xb, yb = batch  # fed without a copy (`feed.to_tensor`)
        return self._form(not active.all())(to_tensor(xb), to_tensor(yb), tf.constant(total),
                                            tf.constant(active)).numpy()
