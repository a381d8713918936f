"""TensorFlow side of regression: the Gaussian head of a member, its losses, and the TF twins
of the mixture aggregators of `ensemble.tasks.regression.aggregators` (in-graph ensembles and exports).

The head (`GaussianHead`, a registered serializable Keras layer, saved with the member) turns
the builder's outputs into the member's Gaussian *in the target's units*:
`mean = loc + scale * out[:, 0]`, `variance = scale^2 * (softplus(out[:, 1]) + 1e-6)`
(Lakshminarayanan et al. 2017, section 2.2.1), where `loc`, `scale` standardise the target
on the training split. A point member (`training.loss = "mse"`, one builder output) has
variance 0. The losses standardise again, so members train on the standardised target.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from ensemble.tasks.regression.aggregators import AGGREGATORS, VARIANCE_FLOOR, check_weights

LOG_2PI = math.log(2 * math.pi)


@keras.saving.register_keras_serializable(package="ensemble")
class GaussianHead(keras.layers.Layer):
    """`[batch, 2]` (or `[batch, 1]` when `point`) builder outputs -> `[batch, 2]` (mean,
    variance), target units. `loc`, `scale`: the training target's mean and std."""

    def __init__(self, loc: float = 0.0, scale: float = 1.0, point: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.loc, self.scale, self.point = float(loc), float(scale), bool(point)

    def call(self, out):
        mean = self.loc + self.scale * out[:, 0]
        if self.point:
            var = tf.zeros_like(mean)
        else:
            var = (self.scale ** 2) * (tf.math.softplus(out[:, 1]) + VARIANCE_FLOOR)
        return tf.stack([mean, var], axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 2)

    def get_config(self):
        return {**super().get_config(), "loc": self.loc, "scale": self.scale,
                "point": self.point}


def gaussian_nll(y, outputs, loc: float, scale: float):
    """Mean Gaussian NLL (natural log) of `y` `[batch]` under `outputs` `[batch, 2]` (mean,
    variance in target units), computed on the standardised target: the target-unit NLL
    minus `log scale` (same gradients). Scalar float32."""
    y = (tf.cast(y, tf.float32) - loc) / scale
    mu = (outputs[:, 0] - loc) / scale
    var = outputs[:, 1] / (scale * scale)
    return tf.reduce_mean(0.5 * (LOG_2PI + tf.math.log(var) + tf.square(y - mu) / var))


def mse(y, outputs, loc: float, scale: float):
    """Mean squared error of the standardised target and mean (point members). Scalar."""
    y = (tf.cast(y, tf.float32) - loc) / scale
    return tf.reduce_mean(tf.square(y - (outputs[:, 0] - loc) / scale))


def aggregate_tf(member_outputs, name: str, params: dict | None = None) -> tf.Tensor:
    """TensorFlow twin of `ensemble.tasks.regression.aggregators.aggregate`.

    Args:
        member_outputs: `[n_members, n_rows, 2]` float32 (mean, variance); `n_members`
            static for the fitted aggregators.
        name: `mean`, `weighted`, `greedy` or `std-scaling`.
        params: the fitted parameters (`aggregators.json`).

    Returns:
        `[n_rows, 3]` float32: mean, aleatoric variance, epistemic variance (float64 inside).

    Raises:
        ValueError: an aggregator that is not for regression, or missing parameters.
    """
    p = tf.cast(tf.convert_to_tensor(member_outputs, tf.float32), tf.float64)
    if name not in AGGREGATORS:
        raise ValueError(f"Expected a regression aggregator from {', '.join(AGGREGATORS)}. "
                         f"Received: aggregator={name!r}")
    s2 = 1.0
    if name == "mean":
        w = None
    elif not params:
        raise ValueError(f"Aggregator {name!r} needs its fitted parameters (aggregators.json).")
    elif name == "std-scaling":
        w, s2 = None, float(params["scale"]) ** 2
    else:
        w = tf.constant(check_weights(params["weights"], int(p.shape[0])), tf.float64)
    mu_m, var_m = p[..., 0], p[..., 1]
    if w is None:
        mu = tf.reduce_mean(mu_m, axis=0)
        ale = tf.reduce_mean(var_m, axis=0)
        epi = tf.reduce_mean(tf.square(mu_m - mu), axis=0)
    else:
        mu = tf.tensordot(w, mu_m, axes=1)
        ale = tf.tensordot(w, var_m, axes=1)
        epi = tf.tensordot(w, tf.square(mu_m - mu), axes=1)
    return tf.cast(tf.stack([mu, ale * s2, epi * s2], axis=1), tf.float32)


def mean_std(ensemble) -> tuple[tf.Tensor, tf.Tensor]:
    """(mean `[n_rows]`, predictive std `[n_rows]`) of an aggregator's `[n_rows, 3]`."""
    e = tf.convert_to_tensor(ensemble)
    return e[:, 0], tf.sqrt(e[:, 1] + e[:, 2])


def as_numpy_params(params: dict | None) -> dict:
    """A copy of `params` with numpy arrays turned to lists (JSON-like)."""
    return {k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v)
            for k, v in (params or {}).items()}
