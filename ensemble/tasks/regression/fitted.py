"""Fitting the regression aggregators on the validation split only (numpy, SciPy).

Every function takes the members' *validation* outputs `[n_members, n_rows, 2]` (mean,
variance; target units) and targets `[n_rows]`, and nothing else. The criterion is the
validation Gaussian NLL of the ensemble's moment-matched mixture (`ensemble.tasks.regression.aggregators`),
the `nll` of `metrics.parquet`. Parameters are plain JSON in the run's `aggregators.json`.

- `weighted`: simplex weights (softmax of free logits, L-BFGS from uniform weights).
- `greedy`: Caruana et al. 2004 ensemble selection with replacement, as for classification
  (`ensemble.tasks.classification.fitted.greedy_selection`) but on the mixture's Gaussian NLL.
- `std-scaling`: one factor `s` on the predictive std. The NLL of `N(mu, s^2 sigma^2)` is
  `log s + (1 / s^2) mean(r^2 / (2 sigma^2)) + const` with `r = y - mu`, minimised in closed
  form by `s^2 = mean(r^2 / sigma^2)` (Laves et al. 2020, "Well-calibrated regression
  uncertainty in medical imaging with deep learning", eq. 5; Kuleshov et al. 2018).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ensemble.tasks.regression import aggregators as R
from ensemble.tasks.regression import metrics as RM
from ensemble.core.errors import UsageError
from ensemble.tasks.base import fit_member_weights


def _check(outputs, y) -> tuple[np.ndarray, np.ndarray]:
    out = R.check_members(outputs)
    y = np.asarray(y, np.float64)
    if y.shape != (out.shape[1],):
        raise UsageError(f"Expected {out.shape[1]} validation targets. Received: {y.shape}")
    return out, y


def mixture_nll_gaussian(outputs: np.ndarray, y: np.ndarray, weights=None,
                         scale: float = 1.0, transform=None) -> float:
    """Validation criterion: NLL of the moment-matched mixture (inf when its variance is 0
    somewhere): Gaussian, or under a target `transform` (`transform.TargetTransform`) the
    log-normal with the mixture's moments, with the Jacobian, as the run's metrics score it
    (`Regression.nll_of`)."""
    e = R.mixture(outputs, weights, scale)
    var = e[:, 1] + e[:, 2]
    if transform is None:
        value = RM.nll(y, e[:, 0], np.sqrt(var))
    elif np.any(var <= 0):
        value = None
    else:
        mu, s2 = transform.to_gaussian(e[:, 0], var)
        value = transform.nll(y, mu, np.sqrt(s2))
    return np.inf if value is None else value


def _transform(settings: dict | None):
    """The run's target transform named in the fit's `settings` (`target_transform`)."""
    from ensemble.tasks.regression import transform

    return transform.get((settings or {}).get("target_transform"))


def fit_weights(outputs: np.ndarray, y: np.ndarray, transform=None) -> dict[str, Any]:
    """Member weights on the simplex minimising the mixture's validation NLL
    (`mixture_nll_gaussian`, under the run's `transform`).

    Returns:
        `{"weights": [n_members]}` (weights below 1e-6 set to 0, renormalised).
    """
    from scipy.optimize import minimize

    out, y = _check(outputs, y)
    n = out.shape[0]

    def loss(z):
        w = np.exp(z - z.max())
        value = mixture_nll_gaussian(out, y, w / w.sum(), transform=transform)
        return value if np.isfinite(value) else 1e300

    res = minimize(loss, np.zeros(n), method="L-BFGS-B", options={"maxiter": 500})
    z = res.x if loss(res.x) <= loss(np.zeros(n)) else np.zeros(n)
    w = np.exp(z - z.max())
    w /= w.sum()
    w = np.where(w < 1e-6, 0.0, w)
    return {"weights": (w / w.sum()).tolist()}


def greedy_selection(outputs: np.ndarray, y: np.ndarray, rounds: int, transform=None
                     ) -> dict[str, Any]:
    """Caruana's forward selection with replacement on the mixture's validation NLL
    (`mixture_nll_gaussian`, under the run's `transform`).

    Returns:
        `{"order": [rounds] member positions, "size": length of the kept (best) prefix,
        "weights": [n_members] times chosen in the prefix / size}`; ties to the smallest
        position, a later prefix kept only if strictly better.
    """
    out, y = _check(outputs, y)
    if rounds < 1:
        raise UsageError(f"Expected `aggregation.greedy_rounds` >= 1. Received: {rounds}")
    n = out.shape[0]
    counts = np.zeros(n)
    order, best, size = [], np.inf, 0
    for r in range(1, rounds + 1):
        scores = []
        for m in range(n):
            c = counts.copy()
            c[m] += 1
            scores.append(mixture_nll_gaussian(out, y, c / c.sum(), transform=transform))
        pick = int(np.argmin(scores))
        order.append(pick)
        counts[pick] += 1
        if scores[pick] < best - 1e-12:
            best, size = scores[pick], r
    if size == 0:  # every prefix has zero variance somewhere: keep the first pick
        size = 1
    kept = np.bincount(order[:size], minlength=n)
    return {"order": order, "size": size, "weights": (kept / size).tolist()}


def fit_std_scale(outputs: np.ndarray, y: np.ndarray, transform=None) -> dict[str, Any]:
    """The factor `s` on the mean mixture's predictive std minimising validation NLL, in
    closed form `s = sqrt(mean((y - mu)^2 / sigma^2))` (rows with sigma 0 left out); under a
    target `transform` the log-normal NLL of the mixture's mean and `s` times its std (with
    the Jacobian, what the run's metrics score), minimised over `log s` in [-10, 10] by
    SciPy's bounded `minimize_scalar`.

    Returns:
        `{"scale": s}` (1.0 when no row has a positive sigma).
    """
    out, y = _check(outputs, y)
    e = R.mixture(out)
    var = e[:, 1] + e[:, 2]
    ok = var > 0
    if not ok.any():
        return {"scale": 1.0}
    if transform is not None:
        from scipy.optimize import minimize_scalar

        mean, var = e[ok, 0], var[ok]

        def loss(log_s):
            mu, s2 = transform.to_gaussian(mean, np.exp(2 * log_s) * var)
            return transform.nll(y[ok], mu, np.sqrt(s2))

        res = minimize_scalar(loss, bounds=(-10.0, 10.0), method="bounded",
                              options={"xatol": 1e-8})
        return {"scale": float(np.exp(res.x)) if loss(res.x) <= loss(0.0) else 1.0}
    s = float(np.sqrt(np.mean((y[ok] - e[ok, 0]) ** 2 / var[ok])))
    return {"scale": s if s > 0 else 1.0}


def fit_weighted(outputs: np.ndarray, y: np.ndarray, settings: dict) -> dict[str, Any]:
    """`weighted`: the config's weights, else `fit_weights` (`ensemble.tasks.base`)."""
    return fit_member_weights(lambda o, t: fit_weights(o, t, _transform(settings)), outputs, y,
                              settings)


def fit_greedy(outputs: np.ndarray, y: np.ndarray, settings: dict) -> dict[str, Any]:
    """`greedy`: `greedy_selection` for `settings["greedy_rounds"]` rounds."""
    return greedy_selection(outputs, y, int(settings["greedy_rounds"]), _transform(settings))


def fit_std_scale_on(outputs: np.ndarray, y: np.ndarray, settings: dict) -> dict[str, Any]:
    """`std-scaling`: `fit_std_scale` (under the run's `target_transform` of `settings`)."""
    return fit_std_scale(outputs, y, _transform(settings))


def member_losses(outputs: np.ndarray, y: np.ndarray) -> list[float]:
    """Per member, its validation Gaussian NLL (inf where undefined); the RMSE of the means
    when no member has an NLL (point members)."""
    out, y = _check(outputs, y)
    nll = [RM.nll(y, o[:, 0], np.sqrt(o[:, 1])) for o in out]
    if any(v is not None for v in nll):
        return [v if v is not None else np.inf for v in nll]
    return [RM.rmse(y, o[:, 0]) for o in out]
