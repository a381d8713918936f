"""Regression metrics of a Gaussian predictive distribution (numpy + scipy.special, pure).

Inputs are targets `y` `[n_rows]`, predictive means `mu` `[n_rows]` and standard deviations
`sigma` `[n_rows]`, all in the target's own units; every metric is a mean over rows (natural
log for likelihoods), so an NLL is in nats per row *of the target's units* (it shifts by
`log c` when the target is multiplied by `c`). A zero `sigma` (a point prediction: an `mse`
member) has no likelihood: its `nll` is None; its CRPS is the absolute error (the limit).
"""

from __future__ import annotations

import numpy as np
from scipy.special import erf, erfinv, logsumexp

LOG_2PI = float(np.log(2 * np.pi))
COVERAGE_LEVELS = (0.9, 0.95)
CALIBRATION_LEVELS = tuple(np.round(np.arange(0.05, 0.951, 0.05), 2))  # 19 quantile levels
METRICS = ("rmse", "mae", "nll", "mixture_nll", "crps", "coverage_90", "width_90",
           "coverage_95", "width_95", "calibration_error", "r2")
GAIN_METRICS = ("rmse", "mae", "nll", "mixture_nll", "crps", "calibration_error", "r2")
LOWER_IS_BETTER = frozenset({"rmse", "mae", "nll", "mixture_nll", "crps", "calibration_error"})


def _norm_cdf(z):
    return 0.5 * (1.0 + erf(np.asarray(z) / np.sqrt(2.0)))


def _norm_ppf(p: float) -> float:
    return float(np.sqrt(2.0) * erfinv(2.0 * p - 1.0))


def _check(y, mu, sigma=None):
    y, mu = np.asarray(y, np.float64), np.asarray(mu, np.float64)
    if y.ndim != 1 or mu.shape != y.shape or y.size == 0:
        raise ValueError(f"Expected y and mu of shape [n_rows]. Received: {y.shape}, {mu.shape}")
    if sigma is None:
        return y, mu
    sigma = np.asarray(sigma, np.float64)
    if sigma.shape != y.shape:
        raise ValueError(f"Expected sigma of shape {y.shape}. Received: {sigma.shape}")
    return y, mu, sigma


def rmse(y, mu) -> float:
    """Root mean squared error, target units (`sklearn.metrics.root_mean_squared_error`)."""
    y, mu = _check(y, mu)
    return float(np.sqrt(np.mean((y - mu) ** 2)))


def mae(y, mu) -> float:
    """Mean absolute error, target units (`sklearn.metrics.mean_absolute_error`)."""
    y, mu = _check(y, mu)
    return float(np.mean(np.abs(y - mu)))


def r2(y, mu) -> float | None:
    """Coefficient of determination `1 - SS_res / SS_tot` (`sklearn.metrics.r2_score`; 0 when
    the targets are constant and the prediction imperfect, 1 when perfect); None for a single
    row, where it is not defined (scikit-learn warns and returns NaN)."""
    y, mu = _check(y, mu)
    if y.size < 2:
        return None
    ss_res, ss_tot = np.sum((y - mu) ** 2), np.sum((y - y.mean()) ** 2)
    if ss_tot == 0:
        return 1.0 if ss_res == 0 else 0.0
    return float(1.0 - ss_res / ss_tot)


def nll(y, mu, sigma) -> float | None:
    """Gaussian negative log-likelihood, mean over rows:
    `0.5 log(2 pi sigma^2) + (y - mu)^2 / (2 sigma^2)` (the density of
    `scipy.stats.norm(mu, sigma).logpdf(y)`, negated); None when a `sigma` is 0."""
    y, mu, sigma = _check(y, mu, sigma)
    if np.any(sigma <= 0):
        return None
    return float(np.mean(0.5 * LOG_2PI + np.log(sigma) + 0.5 * ((y - mu) / sigma) ** 2))


def mixture_nll(y, mu_m, var_m, weights=None) -> float | None:
    """NLL of the exact Gaussian mixture `sum_m w_m N(y; mu_m, var_m)`, mean over rows, by
    logsumexp over members (Lakshminarayanan et al. 2017, eq. in section 2.4 before moment
    matching). `mu_m`, `var_m`: `[n_members, n_rows]`; `weights`: `[n_members]` (uniform when
    None; zero weights drop a member). None when a member with weight > 0 has variance 0."""
    mu_m, var_m = np.asarray(mu_m, np.float64), np.asarray(var_m, np.float64)
    y = np.asarray(y, np.float64)
    w = np.full(len(mu_m), 1.0 / len(mu_m)) if weights is None else np.asarray(weights, float)
    keep = w > 0
    mu_m, var_m, w = mu_m[keep], var_m[keep], w[keep] / w[keep].sum()
    if np.any(var_m <= 0):
        return None
    logp = -0.5 * (LOG_2PI + np.log(var_m) + (y[None] - mu_m) ** 2 / var_m)
    return float(-np.mean(logsumexp(logp, axis=0, b=w[:, None])))


def crps(y, mu, sigma) -> float:
    """Continuous ranked probability score of `N(mu, sigma^2)`, mean over rows, target units
    (closed form, Gneiting and Raftery 2007, eq. 21):
    `sigma * (z (2 Phi(z) - 1) + 2 phi(z) - 1 / sqrt(pi))`, `z = (y - mu) / sigma`;
    `|y - mu|` where `sigma` is 0."""
    y, mu, sigma = _check(y, mu, sigma)
    safe = np.where(sigma > 0, sigma, 1.0)
    z = (y - mu) / safe
    pdf = np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    score = safe * (z * (2 * _norm_cdf(z) - 1) + 2 * pdf - 1 / np.sqrt(np.pi))
    return float(np.mean(np.where(sigma > 0, score, np.abs(y - mu))))


def _abs_moment(m, var):
    """`E|X|` of `X ~ N(m, var)`, elementwise: `s sqrt(2/pi) exp(-m^2 / (2 s^2)) +
    m (2 Phi(m / s) - 1)` with `s = sqrt(var)`; `|m|` where `var` is 0."""
    s = np.sqrt(np.maximum(var, 0.0))
    safe = np.where(s > 0, s, 1.0)
    value = (safe * np.sqrt(2.0 / np.pi) * np.exp(-0.5 * (m / safe) ** 2)
             + m * (2.0 * _norm_cdf(m / safe) - 1.0))
    return np.where(s > 0, value, np.abs(m))


def mixture_crps(y, mu_m, var_m, weights=None) -> float:
    """CRPS of the exact Gaussian mixture `sum_i w_i N(mu_i, var_i)`, mean over rows, target
    units, in closed form (Grimit, Gneiting, Berrocal and Johnson 2006, "The continuous ranked
    probability score for circular variables ...", eq. 5; the kernel form
    `CRPS = E|X - y| - 1/2 E|X - X'|` of Gneiting and Raftery 2007, eq. 21):

        CRPS = sum_i w_i A(y - mu_i, var_i) - 1/2 sum_ij w_i w_j A(mu_i - mu_j, var_i + var_j)

    with `A(m, v) = E|N(m, v)|` (`_abs_moment`). `mu_m`, `var_m`: `[n_members, n_rows]`;
    `weights` `[n_members]` (uniform when None; zero weights drop a member). Memory is
    `O(n_rows)`: the member pairs are summed one at a time. One member: `crps`."""
    mu_m, var_m = np.asarray(mu_m, np.float64), np.asarray(var_m, np.float64)
    y = np.asarray(y, np.float64)
    w = np.full(len(mu_m), 1.0 / len(mu_m)) if weights is None else np.asarray(weights, float)
    keep = w > 0
    mu_m, var_m, w = mu_m[keep], var_m[keep], w[keep] / w[keep].sum()
    first = sum(w[i] * _abs_moment(y - mu_m[i], var_m[i]) for i in range(len(w)))
    spread = sum(w[i] * w[i] * _abs_moment(0.0, 2 * var_m[i]) for i in range(len(w)))
    spread = spread + sum(2 * w[i] * w[j] * _abs_moment(mu_m[i] - mu_m[j], var_m[i] + var_m[j])
                          for i in range(len(w)) for j in range(i + 1, len(w)))
    return float(np.mean(first - 0.5 * spread))


def coverage(y, mu, sigma, level: float) -> tuple[float, float]:
    """(share of rows inside the central `level` interval `mu +- z sigma`,
    `z = Phi^-1((1 + level) / 2)`; its mean width `2 z sigma`, target units)."""
    y, mu, sigma = _check(y, mu, sigma)
    z = _norm_ppf((1.0 + level) / 2.0)
    return float(np.mean(np.abs(y - mu) <= z * sigma)), float(np.mean(2 * z * sigma))


def calibration_error(y, mu, sigma, levels=CALIBRATION_LEVELS) -> float:
    """Mean absolute calibration error over quantile levels `p` = 0.05, 0.10, ..., 0.95:
    `mean_p |p - share(y <= mu + sigma Phi^-1(p))|` (Kuleshov et al. 2018, "Accurate
    Uncertainties for Deep Learning Using Calibrated Regression", eq. 9 with equal weights
    and the absolute difference, as uncertainty-toolbox's `mean_absolute_calibration_error`)."""
    y, mu, sigma = _check(y, mu, sigma)
    return float(np.mean([abs(p - np.mean(y <= mu + sigma * _norm_ppf(p))) for p in levels]))


def all_metrics(y, mu, sigma, mu_m=None, var_m=None, weights=None) -> dict[str, float | None]:
    """Every metric of `METRICS` for one model. `mu_m`, `var_m` `[n_members, n_rows]` and
    `weights` describe the exact mixture behind an ensemble's `mu`, `sigma`; for a member
    (None) `mixture_nll` is its `nll`. `crps` is the exact mixture's (`mixture_crps`) when
    the mixture is given, else that of `N(mu, sigma^2)`; `nll`, coverage and calibration are
    those of the moment-matched Gaussian `N(mu, sigma^2)`."""
    out = {"rmse": rmse(y, mu), "mae": mae(y, mu), "nll": nll(y, mu, sigma)}
    out["mixture_nll"] = (out["nll"] if mu_m is None
                          else mixture_nll(y, mu_m, var_m, weights))
    out["crps"] = crps(y, mu, sigma) if mu_m is None else mixture_crps(y, mu_m, var_m, weights)
    for level in COVERAGE_LEVELS:
        k = int(round(100 * level))
        out[f"coverage_{k}"], out[f"width_{k}"] = coverage(y, mu, sigma, level)
    out["calibration_error"] = calibration_error(y, mu, sigma)
    out["r2"] = r2(y, mu)
    return out
