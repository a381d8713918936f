"""Classification metrics over probabilities (numpy, pure).

Inputs are integer class indices `y` of shape `[n_rows]` and probabilities `p` of shape
`[n_rows, n_classes]`. Accuracy and the multiclass Brier score come from scikit-learn; NLL and
ECE follow the definitions of DESIGN.md (NLL clips at 1e-12, which `sklearn.metrics.log_loss`
does not; scikit-learn has no ECE).
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.metrics import accuracy_score, brier_score_loss

NLL_CLIP = 1e-12
ECE_BINS = 15
METRICS = ("accuracy", "nll", "brier", "ece")


def _check(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y)
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or y.shape != (p.shape[0],) or p.shape[0] == 0:
        raise ValueError(
            f"Expected y [n_rows] and p [n_rows, n_classes]. Received: {y.shape}, {p.shape}"
        )
    return y.astype(np.int64), p


def accuracy(y: np.ndarray, p: np.ndarray) -> float:
    """Share of rows whose argmax class equals `y` (ties to the smallest index)."""
    y, p = _check(y, p)
    return float(accuracy_score(y, np.argmax(p, axis=1)))


def nll(y: np.ndarray, p: np.ndarray) -> float:
    """Mean negative log-likelihood (natural log) of the true class, `p` clipped at 1e-12."""
    y, p = _check(y, p)
    return float(-np.mean(np.log(np.clip(p[np.arange(len(y)), y], NLL_CLIP, 1.0))))


def brier(y: np.ndarray, p: np.ndarray) -> float:
    """Multiclass Brier score: mean over rows of `sum_c (p_c - onehot_c)^2` (Brier 1950);
    computed by `sklearn.metrics.brier_score_loss` with every class listed."""
    y, p = _check(y, p)
    with warnings.catch_warnings():  # float32 rows sum to 1 within 1e-6, not sklearn's 1e-8
        warnings.filterwarnings("ignore", message="The y_prob values do not sum to one")
        return float(brier_score_loss(y, p, labels=np.arange(p.shape[1])))


def ece(y: np.ndarray, p: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Top-label expected calibration error (Guo et al. 2017, "On Calibration of Modern
    Neural Networks"): rows go to bin `min(floor(n_bins * c), n_bins - 1)` of their top
    probability `c`; ECE = `sum_b n_b / n * |acc_b - conf_b|`."""
    y, p = _check(y, p)
    conf = p.max(axis=1)
    correct = (np.argmax(p, axis=1) == y).astype(np.float64)
    bins = np.minimum(np.floor(n_bins * conf).astype(np.int64), n_bins - 1)
    n_b = np.bincount(bins, minlength=n_bins)
    acc_sum = np.bincount(bins, weights=correct, minlength=n_bins)
    conf_sum = np.bincount(bins, weights=conf, minlength=n_bins)
    return float(np.abs(acc_sum - conf_sum).sum() / len(y))


def all_metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """Every metric of `METRICS` for one model: `{"accuracy": ..., "nll": ..., ...}`."""
    return {"accuracy": accuracy(y, p), "nll": nll(y, p), "brier": brier(y, p), "ece": ece(y, p)}
