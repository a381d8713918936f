"""Classification metrics over probabilities (numpy, pure).

Inputs are integer class indices `y` of shape `[n_rows]` and probabilities `p` of shape
`[n_rows, n_classes]`. Every metric is numpy, so that a between-graph client, which scores its
member on the validation split every epoch, never loads scikit-learn, and a run's tables and
ensemble-size curve (dozens of calls) pay no per-call validation: the Brier score reproduces
`sklearn.metrics.brier_score_loss`, accuracy is
`sklearn.metrics.accuracy_score` on 1-D labels. NLL and ECE follow the definitions of
docs/reference/run-directory.md (NLL clips at 1e-12, which `sklearn.metrics.log_loss` does not; scikit-learn has no ECE).
"""

from __future__ import annotations

import numpy as np

NLL_CLIP = 1e-12
ECE_BINS = 15
METRICS = ("accuracy", "nll", "brier", "ece")
LOWER_IS_BETTER = frozenset({"nll", "brier", "ece"})


def _check(y: np.ndarray, p: np.ndarray, float64: bool = True
           ) -> tuple[np.ndarray, np.ndarray]:
    """`(y as int64, p)`, `p` as float64 unless not `float64` (then as given: a function
    that only compares or picks its values needs no `[n_rows, n_classes]` float64 copy)."""
    y = np.asarray(y)
    p = np.asarray(p, dtype=np.float64) if float64 else np.asarray(p)
    if p.ndim != 2 or y.shape != (p.shape[0],) or p.shape[0] == 0:
        raise ValueError(
            f"Expected y [n_rows] and p [n_rows, n_classes]. Received: {y.shape}, {p.shape}"
        )
    return y.astype(np.int64), p


def accuracy(y: np.ndarray, p: np.ndarray) -> float:
    """Share of rows whose argmax class equals `y` (ties to the smallest index)."""
    y, p = _check(y, p, float64=False)  # (the argmax of float32 is that of its float64)
    return float(np.mean(np.argmax(p, axis=1) == y))


def nll(y: np.ndarray, p: np.ndarray) -> float:
    """Mean negative log-likelihood (natural log) of the true class, `p` clipped at 1e-12."""
    y, p = _check(y, p, float64=False)  # the true class's column picked, then float64
    picked = np.asarray(p[np.arange(len(y)), y], np.float64)
    return float(-np.mean(np.log(np.clip(picked, NLL_CLIP, 1.0))))


def brier(y: np.ndarray, p: np.ndarray) -> float:
    """Multiclass Brier score: mean over rows of `sum_c (p_c - onehot_c)^2` (Brier 1950),
    halved for two classes (scikit-learn's `brier_score_loss(y, p, labels=...)` with its
    default `scale_by_half="auto"`, whose value this reproduces in float64 without its
    per-call validation; `tests/test_metrics.py` checks the two agree)."""
    y, p = _check(y, p)
    d = p.copy()
    d[np.arange(len(y)), y] -= 1.0  # p - onehot(y)
    return float(np.mean(np.einsum("ij,ij->i", d, d)) * (0.5 if p.shape[1] == 2 else 1.0))


def ece(y: np.ndarray, p: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Top-label expected calibration error (Guo et al. 2017, "On Calibration of Modern
    Neural Networks"): rows go to bin `min(floor(n_bins * c), n_bins - 1)` of their top
    probability `c`; ECE = `sum_b n_b / n * |acc_b - conf_b|`."""
    y, p = _check(y, p)
    conf = p.max(axis=1)
    correct = (np.argmax(p, axis=1) == y).astype(np.float64)
    bins = np.minimum(np.floor(n_bins * conf).astype(np.int64), n_bins - 1)
    acc_sum = np.bincount(bins, weights=correct, minlength=n_bins)
    conf_sum = np.bincount(bins, weights=conf, minlength=n_bins)
    return float(np.abs(acc_sum - conf_sum).sum() / len(y))


def all_metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """Every metric of `METRICS` for one model: `{"accuracy": ..., "nll": ..., ...}`."""
    return {"accuracy": accuracy(y, p), "nll": nll(y, p), "brier": brier(y, p), "ece": ece(y, p)}


def entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of each row of `p` `[n_rows, n_classes]` (or of the last axis of
    any array), with `0 log 0 = 0`. Returns `[n_rows]` float64."""
    p = np.asarray(p, dtype=np.float64)
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def uncertainty(member_probs: np.ndarray, ensemble_probs: np.ndarray,
                weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-row uncertainty of an ensemble (Lakshminarayanan et al. 2017; Depeweg et al. 2018).

    Args:
        member_probs: `[n_members, n_rows, n_classes]`.
        ensemble_probs: `[n_rows, n_classes]`, the ensemble's predictive distribution.
        weights: `[n_members]` weights of the expected member entropy (uniform when None).

    Returns:
        `{"entropy": H(ensemble), "expected_entropy": sum_m w_m H(p_m), "mutual_information":
        H(sum_m w_m p_m) - sum_m w_m H(p_m)}`, each `[n_rows]` float64. The mutual information
        (BALD) is that of the members' mixture, >= 0 (Jensen), whatever the aggregator: for the
        mean (or a weighted mean with the same weights) it is `entropy - expected_entropy`; a
        sharpened ensemble (temperature, geometric mean, stacking) has an entropy below its
        members' and made that difference negative.
    """
    member_probs = np.asarray(member_probs, np.float64)
    member_h = entropy(member_probs)  # [n_members, n_rows]
    n = member_h.shape[0]
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, np.float64)
    expected = w @ member_h
    mixture = np.einsum("m,mrc->rc", w, member_probs)
    return {"entropy": entropy(ensemble_probs), "expected_entropy": expected,
            "mutual_information": entropy(mixture) - expected}


def mean_pairwise_kl(member_probs: np.ndarray) -> float:
    """Mean KL divergence `KL(p_i || p_j)` (nats) over ordered member pairs `i != j` and rows,
    probabilities clipped at 1e-12; 0 for a single member. Input `[n_members, n_rows,
    n_classes]`."""
    p = np.clip(np.asarray(member_probs, np.float64), NLL_CLIP, 1.0)
    n = p.shape[0]
    if n < 2:
        return 0.0
    logp = np.log(p)
    kl = [np.mean(np.sum(p[i] * (logp[i] - logp[j]), axis=1))
          for i in range(n) for j in range(n) if i != j]
    return float(np.mean(kl))
