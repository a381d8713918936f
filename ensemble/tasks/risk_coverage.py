"""Accuracy against confidence (Lakshminarayanan et al. 2017, Fig. 6) and the risk-coverage
curve (Geifman and El-Yaniv 2017; AURC: Geifman et al. 2019), and their regression analogue
(RMSE of the rows kept against the share kept, ordered by predictive std). Pure numpy.
"""

from __future__ import annotations

import numpy as np

from ensemble.core.errors import UsageError

THRESHOLDS = np.round(np.arange(0.0, 1.0, 0.05), 2)  # tau over [0, 1)
TABLE_THRESHOLDS = (0.5, 0.7, 0.9)  # the thresholds the evaluation table prints
SHARES = np.round(np.arange(0.05, 1.0001, 0.05), 2)  # regression: share of rows kept


def _check(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y, p = np.asarray(y), np.asarray(p, np.float64)
    if p.ndim != 2 or y.shape != (p.shape[0],) or p.shape[0] == 0:
        raise UsageError(f"Expected y [n_rows] and p [n_rows, n_classes] with n_rows > 0. "
                         f"Received shapes: y {y.shape}, p {p.shape}")
    return y, p


def accuracy_vs_confidence(y: np.ndarray, p: np.ndarray, thresholds=THRESHOLDS
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy of the rows whose confidence (top probability) is `>= tau`, and the share of
    rows kept, for every `tau` of `thresholds`.

    Args:
        y: `[n_rows]` class indices; p: `[n_rows, n_classes]` probabilities.
        thresholds: `[n_tau]` values of tau in [0, 1).

    Returns:
        (accuracy `[n_tau]`, NaN where no row is kept; share kept `[n_tau]` in [0, 1]).
    """
    y, p = _check(y, p)
    return accuracy_kept(p.max(axis=1), p.argmax(axis=1) == y, thresholds)


def accuracy_kept(conf: np.ndarray, correct: np.ndarray, thresholds=THRESHOLDS
                  ) -> tuple[np.ndarray, np.ndarray]:
    """`accuracy_vs_confidence` of rows given by their confidence `conf` `[n_rows]` (top
    probability, any float type) and `correct` `[n_rows]` bool (top label right)."""
    conf = np.asarray(conf, np.float64)
    taus = np.asarray(thresholds, np.float64)
    kept = conf[None, :] >= taus[:, None]  # [n_tau, n_rows]
    n_kept = kept.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(n_kept > 0, (kept & correct).sum(axis=1) / n_kept, np.nan)
    return acc, n_kept / len(conf)


def aurc(y: np.ndarray, p: np.ndarray) -> float:
    """Area under the risk-coverage curve: rows sorted by confidence, most confident first
    (ties: stable order), the error rate of the first k rows averaged over k = 1..n
    (Geifman et al. 2019, "Bias-Reduced Uncertainty Estimation for Deep Neural Classifiers").
    Lower is better; 0 when every prediction is right."""
    y, p = _check(y, p)
    return aurc_of(p.max(axis=1), p.argmax(axis=1) == y)


def aurc_of(conf: np.ndarray, correct: np.ndarray) -> float:
    """`aurc` of rows given by their confidence `conf` `[n_rows]` (any float type: the order
    is the same) and `correct` `[n_rows]` bool."""
    errors = ~np.asarray(correct, bool)[np.argsort(-np.asarray(conf), kind="stable")]
    return float(np.mean(np.cumsum(errors) / np.arange(1, len(errors) + 1)))


def rmse_vs_kept(y: np.ndarray, mu: np.ndarray, std: np.ndarray, shares=SHARES) -> np.ndarray:
    """Regression analogue: RMSE (target units) of the share `q` of rows with the lowest
    predictive std (`ceil(q * n)` rows, at least one), for every `q` in `shares`.

    Args:
        y, mu, std: `[n_rows]` targets, predictive means and stds.

    Returns:
        `[n_shares]` RMSEs.
    """
    y, mu, std = (np.asarray(a, np.float64) for a in (y, mu, std))
    if not (y.shape == mu.shape == std.shape) or y.ndim != 1 or y.size == 0:
        raise UsageError(f"Expected y, mu, std of one shape [n_rows]. Received: {y.shape}, "
                         f"{mu.shape}, {std.shape}")
    return rmse_kept((y - mu) ** 2, std, shares)


def rmse_kept(sq: np.ndarray, std: np.ndarray, shares=SHARES) -> np.ndarray:
    """`rmse_vs_kept` of rows given by their squared errors `sq` `[n_rows]` (float64) and
    predictive stds `std` `[n_rows]`."""
    csum = np.cumsum(np.asarray(sq, np.float64)[np.argsort(std, kind="stable")])
    k = np.maximum(np.ceil(np.asarray(shares, np.float64) * len(sq) - 1e-9).astype(int), 1)
    return np.sqrt(csum[k - 1] / k)


def area_rmse_coverage(y: np.ndarray, mu: np.ndarray, std: np.ndarray) -> float:
    """The RMSE of the k rows of lowest std averaged over k = 1..n (the regression AURC;
    lower is better)."""
    y, mu, std = (np.asarray(a, np.float64) for a in (y, mu, std))
    return area_rmse_kept((y - mu) ** 2, std)


def area_rmse_kept(sq: np.ndarray, std: np.ndarray) -> float:
    """`area_rmse_coverage` of rows given by their squared errors `sq` `[n_rows]` (float64)
    and predictive stds `std` `[n_rows]`."""
    sq = np.asarray(sq, np.float64)[np.argsort(std, kind="stable")]
    return float(np.mean(np.sqrt(np.cumsum(sq) / np.arange(1, len(sq) + 1))))
