"""Regression deep ensembles (numpy, pure): Gaussian metrics and the mixture aggregators.

A regression member predicts a Gaussian per row: its outputs are `[n_rows, 2]` = (mean,
variance) in the target's own units (the member's head, `ensemble.tasks.regression.tf_ops.GaussianHead`,
undoes the target's standardisation). Stacked members are `[n_members, n_rows, 2]`.

An aggregator maps members to the ensemble's *moment-matched mixture* (Lakshminarayanan,
Pritzel and Blundell 2017, "Simple and Scalable Predictive Uncertainty Estimation using Deep
Ensembles", section 2.4): `[n_rows, 3]` = (mean, aleatoric variance, epistemic variance),
predictive variance = aleatoric + epistemic. With member weights `w` (uniform for `mean`):

    mu        = sum_m w_m mu_m
    aleatoric = sum_m w_m sigma_m^2                  (expected member variance)
    epistemic = sum_m w_m (mu_m - mu)^2              (spread of the member means)
    sigma^2   = aleatoric + epistemic = sum_m w_m (sigma_m^2 + mu_m^2) - mu^2

`std-scaling` multiplies the mean mixture's standard deviation by a factor `s` fitted on the
validation split (both parts of the variance by `s^2`; Kuleshov et al. 2018, Laves et al.
2020). Metrics are in `ensemble.tasks.regression.metrics`, fitting in `ensemble.tasks.regression.fitted`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.tasks.base import Aggregator, check_weights, registry

REGRESSION_DEFAULT = ("mean", "std-scaling")  # a regression run's aggregators by default
VARIANCE_FLOOR = 1e-6  # added to softplus(raw) in the head: sigma^2 = softplus(raw) + 1e-6


def check_members(outputs: np.ndarray) -> np.ndarray:
    """`outputs` as float64 `[n_members, n_rows, 2]` (mean, variance).

    Raises:
        UsageError: another shape, or a negative variance.
    """
    out = np.asarray(outputs, np.float64)
    if out.ndim != 3 or out.shape[2] != 2 or 0 in out.shape:
        raise UsageError("Expected member outputs of shape [n_members, n_rows, 2] (mean, "
                         f"variance). Received shape: {np.shape(outputs)}")
    if np.any(out[..., 1] < 0):
        raise UsageError("Expected non-negative member variances.")
    return out


def mixture(outputs: np.ndarray, weights: Any = None, scale: float = 1.0) -> np.ndarray:
    """The moment-matched mixture of the members.

    Args:
        outputs: `[n_members, n_rows, 2]` member (mean, variance), target units.
        weights: `[n_members]` member weights (normalised to sum 1), uniform when None.
        scale: factor on the predictive standard deviation (`std-scaling`), > 0.

    Returns:
        `[n_rows, 3]` float64: mean, aleatoric variance, epistemic variance (both times
        `scale^2`).
    """
    out = check_members(outputs)
    n = out.shape[0]
    w = np.full(n, 1.0 / n) if weights is None else check_weights(weights, n)
    mu = np.tensordot(w, out[..., 0], axes=1)
    aleatoric = np.tensordot(w, out[..., 1], axes=1)
    epistemic = np.tensordot(w, (out[..., 0] - mu) ** 2, axes=1)
    s2 = float(scale) ** 2
    return np.stack([mu, aleatoric * s2, epistemic * s2], axis=1)


def member_weights(name: str, n_members: int, params: dict | None) -> np.ndarray:
    """`[n_members]` float64 weights of aggregator `name`: the fitted ones of `weighted` and
    `greedy`, uniform otherwise."""
    if params and "weights" in params:  # an aggregator that fitted member weights
        return check_weights(params["weights"], n_members)
    return np.full(n_members, 1.0 / n_members)


def _scaled(outputs: np.ndarray, params: dict) -> np.ndarray:
    s = float(params["scale"])
    if not s > 0:
        raise UsageError(f"Expected a positive std scale. Received: scale={s}")
    return mixture(outputs, scale=s)


_TF = "ensemble.tasks.regression.tf_ops:"
_FIT = "ensemble.tasks.regression.fitted:"
REGISTRY = registry(  # the regression task's aggregators (`ensemble.tasks.base.Aggregator`)
    Aggregator("mean", lambda o, _: mixture(o), _TF + "mean"),
    Aggregator("weighted", lambda o, q: mixture(o, weights=q["weights"]), _TF + "weighted",
               _FIT + "fit_weighted"),
    Aggregator("greedy", lambda o, q: mixture(o, weights=q["weights"]), _TF + "weighted",
               _FIT + "fit_greedy", selects=True),
    Aggregator("std-scaling", _scaled, _TF + "std_scaling", _FIT + "fit_std_scale_on"),
)
AGGREGATORS = tuple(REGISTRY)
FITTED = tuple(a.name for a in REGISTRY.values() if a.fitted)


def unknown(name: str, names=None) -> str:
    """The message refusing an aggregator regression does not have (in `names`)."""
    return (f"Aggregator {name!r} is for classification; a regression run "
            f"takes {', '.join(AGGREGATORS)}. Received: {list(names or [name])}")


def aggregate(outputs: np.ndarray, name: str, params: dict | None = None) -> np.ndarray:
    """Apply the regression aggregator `name` of `REGISTRY` to `[n_members, n_rows, 2]`
    member outputs.

    Args:
        params: a fitted aggregator's parameters (`aggregators.json`): `weights` for
            `weighted` / `greedy`, `scale` for `std-scaling`.

    Returns:
        `[n_rows, 3]` float64 (mean, aleatoric variance, epistemic variance), see `mixture`.

    Raises:
        UsageError: an aggregator that is not for regression, or a fitted one without its
            parameters.
    """
    if name not in REGISTRY:
        raise UsageError(unknown(name))
    return REGISTRY[name](outputs, params)


def components(outputs: np.ndarray, name: str, params: dict | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exact mixture behind aggregator `name`: component means and variances
    `[n_members, n_rows]` and weights `[n_members]`. Under `std-scaling` every component's
    distance to the mixture mean and its std are scaled by `s`, so the mixture's moments are
    those of `aggregate`."""
    out = check_members(outputs)
    w = member_weights(name, out.shape[0], params)
    mu_m, var_m = out[..., 0], out[..., 1]
    if name == "std-scaling" and params:
        s = float(params["scale"])
        mu = mu_m.mean(axis=0)
        mu_m, var_m = mu + s * (mu_m - mu), var_m * s * s
    return mu_m, var_m, w


def std_of(ensemble: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(std, aleatoric std, epistemic std) `[n_rows]` of an aggregator's `[n_rows, 3]`."""
    e = np.asarray(ensemble, np.float64)
    return np.sqrt(e[:, 1] + e[:, 2]), np.sqrt(e[:, 1]), np.sqrt(e[:, 2])


def disagreement(outputs: np.ndarray) -> float:
    """Mean over rows of the members' spread: the population std of the member means,
    target units (0 for one member). Input `[n_members, n_rows, 2]`."""
    return float(np.mean(np.std(check_members(outputs)[..., 0], axis=0)))
