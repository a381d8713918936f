"""TensorFlow side of regression: the Gaussian head of a member, its losses, and the TF twins
of the mixture aggregators of `ensemble.tasks.regression.aggregators` (in-graph ensembles and exports).

The head (`GaussianHead`, a registered serializable Keras layer, saved with the member) turns
the builder's outputs into the member's Gaussian *in the target's units*:
`mean = loc + scale * out[:, 0]`, `variance = scale^2 * (softplus(out[:, 1]) + 1e-6)`
(Lakshminarayanan et al. 2017, section 2.2.1), where `loc`, `scale` standardise the target
on the training split. A point member (`training.loss = "mse"`, one builder output) has
variance 0. The losses standardise again, so members train on the standardised target.
Under a target transform (`training.target_transform`, `ensemble.tasks.regression.transform`)
`loc`, `scale` standardise `z = log(y + shift)`, the Gaussian above is that of `z`, and the head
returns the mean and variance of its log-normal on the target's scale; the losses take them
back to `z` (`on_z`).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from ensemble.tasks.base import check_weights
from ensemble.tasks.regression.aggregators import REGISTRY, VARIANCE_FLOOR, unknown

LOG_2PI = math.log(2 * math.pi)


@keras.saving.register_keras_serializable(package="ensemble")
class GaussianHead(keras.layers.Layer):
    """`[batch, 2]` (or `[batch, 1]` when `point`) builder outputs -> `[batch, 2]` float64
    (mean, variance), target units. `loc`, `scale`: the training target's mean and std
    (of `z = log(y + shift)` when `shift` is not None: the log-normal's moments returned)."""

    def __init__(self, loc: float = 0.0, scale: float = 1.0, point: bool = False,
                 shift: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.loc, self.scale, self.point = float(loc), float(scale), bool(point)
        self.shift = None if shift is None else float(shift)

    def call(self, out):
        out = tf.cast(out, tf.float64)  # target units: float64 (a price near 1e9 keeps its digits)
        mean = self.loc + self.scale * out[:, 0]
        if self.point:
            var = tf.zeros_like(mean)
        else:
            var = (self.scale ** 2) * (tf.math.softplus(out[:, 1]) + VARIANCE_FLOOR)
        if self.shift is not None:  # log-normal moments: exp(mu + s^2/2) - shift, ...
            mean, var = (tf.exp(mean + var / 2) - self.shift,
                         tf.math.expm1(var) * tf.exp(2 * mean + var))
        return tf.stack([mean, var], axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 2)

    def get_config(self):
        return {**super().get_config(), "loc": self.loc, "scale": self.scale,
                "point": self.point, "shift": self.shift}


def on_z(y, outputs, shift: float | None):
    """`(z, outputs on z)`: `z = log(y + shift)` `[batch]` and the Gaussian `[batch, 2]`
    (mean, variance) of `z` whose log-normal has the moments `outputs` (target scale):
    `s^2 = log(1 + var / (mean + shift)^2)`, `mu = log(mean + shift) - s^2 / 2`; both unchanged
    when `shift` is None."""
    if shift is None:
        return y, outputs
    out = tf.cast(outputs, tf.float64)
    m = out[:, 0] + shift
    s2 = tf.math.log1p(out[:, 1] / tf.square(m))
    return (tf.math.log(tf.cast(y, tf.float64) + shift),
            tf.stack([tf.math.log(m) - s2 / 2, s2], axis=1))


def standardised(y, outputs, loc: float, scale: float):
    """`(y, mean, variance)` `[batch]` float32 on the standardised target, standardised in
    float64 (`y - loc` of a target near 1e9 loses its digits in float32)."""
    out = tf.cast(outputs, tf.float64)
    y = (tf.cast(y, tf.float64) - loc) / scale
    return tuple(tf.cast(t, tf.float32) for t in (y, (out[:, 0] - loc) / scale,
                                                   out[:, 1] / (scale * scale)))


def gaussian_nll(y, outputs, loc: float, scale: float, shift: float | None = None):
    """Mean Gaussian NLL (natural log) of `y` `[batch]` under `outputs` `[batch, 2]` (mean,
    variance in target units), computed on the standardised target: the target-unit NLL
    minus `log scale` (same gradients); on `z` under a target transform (`on_z`). Scalar
    float32."""
    y, mu, var = standardised(*on_z(y, outputs, shift), loc, scale)
    return tf.reduce_mean(0.5 * (LOG_2PI + tf.math.log(var) + tf.square(y - mu) / var))


def mse(y, outputs, loc: float, scale: float, shift: float | None = None):
    """Mean squared error of the standardised target and mean (point members; on `z` under a
    target transform, `on_z`). Scalar."""
    y, mu, _ = standardised(*on_z(y, outputs, shift), loc, scale)
    return tf.reduce_mean(tf.square(y - mu))


def mixture_tf(member_outputs, weights=None, scale: float = 1.0) -> tf.Tensor:
    """TensorFlow twin of `ensemble.tasks.regression.aggregators.mixture`: `[n_members, n_rows,
    2]` (mean, variance) -> `[n_rows, 3]` float64 (mean, aleatoric and epistemic variance,
    both times `scale^2`); `weights` `[n_members]` or None (uniform)."""
    p = tf.cast(tf.convert_to_tensor(member_outputs), tf.float64)
    mu_m, var_m = p[..., 0], p[..., 1]
    if weights is None:
        mu = tf.reduce_mean(mu_m, axis=0)
        ale = tf.reduce_mean(var_m, axis=0)
        epi = tf.reduce_mean(tf.square(mu_m - mu), axis=0)
    else:
        w = tf.constant(check_weights(weights, int(p.shape[0])), tf.float64)
        mu = tf.tensordot(w, mu_m, axes=1)
        ale = tf.tensordot(w, var_m, axes=1)
        epi = tf.tensordot(w, tf.square(mu_m - mu), axes=1)
    s2 = float(scale) ** 2
    return tf.stack([mu, ale * s2, epi * s2], axis=1)


def mean(member_outputs, params=None) -> tf.Tensor:
    """The `mean` mixture (uniform weights)."""
    return mixture_tf(member_outputs)


def weighted(member_outputs, params: dict) -> tf.Tensor:
    """`weighted` and `greedy`: the mixture with the fitted weights (`n_members` static)."""
    return mixture_tf(member_outputs, params["weights"])


def std_scaling(member_outputs, params: dict) -> tf.Tensor:
    """`std-scaling`: the mean mixture with both variances times `scale^2`."""
    return mixture_tf(member_outputs, scale=float(params["scale"]))


def aggregate_tf(member_outputs, name: str, params: dict | None = None) -> tf.Tensor:
    """TensorFlow twin of `ensemble.tasks.regression.aggregators.aggregate`.

    Args:
        member_outputs: `[n_members, n_rows, 2]` float64 (mean, variance); `n_members`
            static for the fitted aggregators.
        name: `mean`, `weighted`, `greedy` or `std-scaling`.
        params: the fitted parameters (`aggregators.json`).

    Returns:
        `[n_rows, 3]` float64: mean, aleatoric variance, epistemic variance.

    Raises:
        ValueError: an aggregator that is not for regression, or missing parameters.
    """
    if name not in REGISTRY:
        raise ValueError(unknown(name))
    return REGISTRY[name].apply_tf(member_outputs, params)


def uncertainty_tf(ensemble) -> dict:
    """`{"std", "aleatoric_std", "epistemic_std"}` `[batch]` (target units) of an aggregator's
    `[batch, 3]` (mean, aleatoric variance, epistemic variance): TF twin of
    `ensemble.tasks.regression.aggregators.std_of`."""
    e = tf.cast(ensemble, tf.float64)
    return {"std": tf.cast(tf.sqrt(e[:, 1] + e[:, 2]), tf.float32),
            "aleatoric_std": tf.cast(tf.sqrt(e[:, 1]), tf.float32),
            "epistemic_std": tf.cast(tf.sqrt(e[:, 2]), tf.float32)}


def serving_outputs(stacked, name: str, params: dict | None, classes=None) -> dict:
    """An exported signature's outputs of aggregator `name` over `stacked` `[n_members, batch,
    2]` (mean, variance): `mean`, `std`, `aleatoric_std`, `epistemic_std` `[batch]` and
    `member_mean`, `member_std` `[batch, n_members]`, target units; the means float64 (a
    target near 1e9 keeps its digits), the stds float32."""
    ens = aggregate_tf(stacked, name, params)
    stacked = tf.cast(stacked, tf.float64)
    return {"mean": ens[:, 0], **uncertainty_tf(ens),
            "member_mean": tf.transpose(stacked[..., 0]),
            "member_std": tf.cast(tf.transpose(tf.sqrt(stacked[..., 1])), tf.float32)}
