"""Data-parallel members in training: one member's step split over its replicas' devices.

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

from ensemble.training import memory_of, train_step


def replicated_train_step(model, optimizer, data: dict, idx, task, devices: Sequence[str],
                          adversarial=None):
    """THE training step of one member over its replicas (`training.train_step` when
    `len(devices) == 1`).

    Args:
        model, optimizer: the member's Keras model (variables on `devices[0]`) and optimiser.
        data: `{memory_of(device): (x [n_train, *input_shape], y [n_train])}`: the training
            data in every memory the replicas use (`training.memory_of`).
        idx: `[batch]` int32 row indices of this batch.
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

    home = devices[0]
    if len(devices) == 1:
        x, y = data[memory_of(home)]
        return train_step(model, optimizer, x, y, idx, task, adversarial)
    n = tf.shape(idx)[0]
    rows = tf.cast(n, tf.float32)
    parts = []  # (weight n_j / n, loss_j, grads_j) of every replica
    for j, device in enumerate(devices):
        lo, hi = n * j // len(devices), n * (j + 1) // len(devices)
        with tf.name_scope(f"replica_{j}_{model.name}"), tf.device(device):
            x, y = data[memory_of(device)]
            xb, yb = tf.gather(x, idx[lo:hi]), tf.gather(y, idx[lo:hi])
            if xb.dtype != tf.float32:
                xb = tf.cast(xb, tf.float32)
            with tf.GradientTape() as tape:
                if adversarial is None:
                    loss = task.loss(yb, model(xb, training=True))
                else:
                    from ensemble.adversarial import loss as adversarial_loss

                    loss = adversarial_loss(model, xb, yb, task, adversarial)
                if model.losses:
                    loss = loss + tf.add_n(model.losses)
            grads = tape.gradient(loss, model.trainable_variables)
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


def memories(devices: Sequence[str], replicas: Sequence[Sequence[str]] | None) -> list[str]:
    """Every device whose memory needs the training data: the members' `devices` and their
    replicas' (`[n_members]` lists, or None), in order of first use, without repeats."""
    return list(dict.fromkeys([*devices, *(d for r in (replicas or ()) for d in r)]))
