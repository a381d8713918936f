"""Adversarial training, the third ingredient of deep ensembles (Lakshminarayanan, Pritzel and
Blundell 2017, Sec. 2.3): the fast gradient sign method (Goodfellow, Shlens and Szegedy 2015)
`x' = x + eps * sign(grad_x loss(x, y))`, and the loss on clean plus adversarial examples,
`loss(x, y) + loss(x', y)`.

`[training] adversarial_epsilon` is in units of the input's range *after the model's scaling*:
the range `max - min` over every value of the training split as the first layer after the
input sees it (the `scaling` layer of an array run, e.g. `Rescaling(1/255)`: images in [0, 1];
a table run's rows are scaled before the model). The paper used 1% of the input range
(`adversarial_epsilon = 0.01`). The step is taken on the model's raw input, so it is divided,
per input element, by the scaling layer's slope (affine per element, measured by probing the
layer at 0 and 1).

`input_step` runs once per member before training (numpy, on the host); `loss` is called by
`training.train_step`, THE per-member step of both replication modes, so members trained with
adversarial examples stay identical across modes. The direction is taken with the model in
inference mode (`training=False`: no dropout draw, no batch-statistics update), then the clean and
the adversarial batch each go through the model in training mode.
"""

from __future__ import annotations

import numpy as np


def _scaling_layer(model):
    for layer in getattr(model, "layers", []):
        if layer.name == "scaling":
            return layer
    return None


def input_step(model, x_train: np.ndarray, epsilon: float) -> np.ndarray:
    """The sign step in the model's raw input units, per input element.

    Args:
        model: a member (its `scaling` layer, when it has one, defines the scaled space).
        x_train: `[n_train, *input_shape]` the training split as the model takes it.
        epsilon: the step in units of the scaled input's range (>= 0).

    Returns:
        `[*input_shape]` float32: `epsilon * range / slope` per element.
    """
    x = np.asarray(x_train, np.float32)
    layer = _scaling_layer(model)
    if layer is None:
        slope = np.ones(x.shape[1:], np.float32)
        lo, hi = float(x.min()), float(x.max())
    else:
        zero = np.asarray(layer(np.zeros((1, *x.shape[1:]), np.float32)))[0]
        slope = np.asarray(layer(np.ones((1, *x.shape[1:]), np.float32)))[0] - zero
        ends = np.stack([zero + slope * x.min(axis=0), zero + slope * x.max(axis=0)])
        lo, hi = float(ends.min()), float(ends.max())
    slope = np.where(np.abs(slope) > 1e-12, np.abs(slope), 1.0)
    return (float(epsilon) * (hi - lo) / slope).astype(np.float32)


def loss(model, xb, yb, task, step):
    """`task.loss(x) + task.loss(x')` of one batch, `x' = x + step * sign(grad_x task.loss)`
    (Lakshminarayanan et al. 2017, Eq. for adversarial training; the gradient of `x'` itself
    is stopped). Call inside the step's `GradientTape`.

    Args:
        xb: `[batch, *input_shape]` float32; yb: `[batch]` targets; step: `[*input_shape]`
            tensor from `input_step`.

    Returns:
        Scalar float32: the sum of the two mean losses.
    """
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch(xb)
        probe = task.loss(yb, model(xb, training=False))
    x_adv = tf.stop_gradient(xb + step * tf.sign(tape.gradient(probe, xb)))
    return task.loss(yb, model(xb, training=True)) + task.loss(yb, model(x_adv, training=True))
