"""Aggregators: combine member predictions into ensemble predictions (numpy, pure).

Every aggregator maps member probabilities `[n_members, n_rows, n_classes]` to ensemble
probabilities `[n_rows, n_classes]` whose rows sum to 1. Four are *fitted* on the validation
split (`ensemble.tasks.classification.fitted` fits them; their parameters are plain JSON, see `aggregators.json`):
`weighted`, `greedy`, `stacking`, `temperature`. The in-graph inference graph applies the
same parameters with the TensorFlow twins of `ensemble.tasks.classification.aggregators_tf`; a test proves they agree.

References: soft/hard voting as scikit-learn's `VotingClassifier`; the normalised geometric
mean of probabilities (a "product of experts", Hinton 2002); ensemble selection (Caruana et
al. 2004); stacking (Wolpert 1992); temperature scaling (Guo et al. 2017).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.tasks.base import Aggregator, check_weights, registry

LOG_CLIP = 1e-12  # as the NLL of docs/reference/run-directory.md


def _check(probs: np.ndarray) -> np.ndarray:
    probs = np.asarray(probs)
    if probs.ndim != 3 or 0 in probs.shape:
        raise UsageError(
            "Expected member probabilities of shape [n_members, n_rows, n_classes]. "
            f"Received shape: {probs.shape}"
        )
    return probs


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of `[n_rows, n_classes]` logits, float64."""
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def soft_vote(probs: np.ndarray) -> np.ndarray:
    """Soft voting: the mean of the members' probabilities.

    Args:
        probs: `[n_members, n_rows, n_classes]` probabilities.

    Returns:
        `[n_rows, n_classes]` float32 probabilities.
    """
    return _check(probs).astype(np.float64).mean(axis=0).astype(np.float32)


def hard_vote(probs: np.ndarray) -> np.ndarray:
    """Hard (majority) voting: each member votes for its argmax class.

    Returns the share of member votes per class, `[n_rows, n_classes]` float32; its argmax
    (ties to the smallest class index, as `np.argmax`) is the majority label. Vote shares are
    not probabilities: their NLL, Brier score and ECE are left null.
    """
    probs = _check(probs)
    n_members, _, n_classes = probs.shape
    votes = np.argmax(probs, axis=2)  # [n_members, n_rows]
    counts = np.eye(n_classes, dtype=np.float64)[votes].sum(axis=0)  # [n_rows, n_classes]
    return (counts / n_members).astype(np.float32)


def geometric(probs: np.ndarray) -> np.ndarray:
    """Normalised geometric mean: `softmax(mean_m log p_m)`, `p` clipped at 1e-12.

    Args:
        probs: `[n_members, n_rows, n_classes]`. Returns `[n_rows, n_classes]` float32.
    """
    logp = np.log(np.clip(_check(probs).astype(np.float64), LOG_CLIP, 1.0))
    return softmax(logp.mean(axis=0)).astype(np.float32)


def weighted(probs: np.ndarray, weights: Any) -> np.ndarray:
    """Weighted soft voting: `sum_m w_m p_m` with `w` normalised to sum 1.

    Args:
        probs: `[n_members, n_rows, n_classes]`; weights: `[n_members]`.
    """
    probs = _check(probs)
    w = check_weights(weights, probs.shape[0])
    return np.tensordot(w, probs.astype(np.float64), axes=1).astype(np.float32)


def stacking_features(probs: np.ndarray) -> np.ndarray:
    """The stacker's input: each row's member probabilities side by side,
    `[n_rows, n_members * n_classes]` (member-major: member 0's classes first)."""
    probs = _check(probs)
    m, n, c = probs.shape
    return probs.astype(np.float64).transpose(1, 0, 2).reshape(n, m * c)


def stacked(probs: np.ndarray, coef: Any, intercept: Any) -> np.ndarray:
    """Stacking: multinomial logistic regression over `stacking_features`:
    `softmax(X @ coef.T + intercept)`.

    Args:
        coef: `[n_classes, n_members * n_classes]`; intercept: `[n_classes]`.

    Raises:
        UsageError: coefficients whose shape does not fit `probs`.
    """
    x = stacking_features(probs)
    coef, intercept = np.asarray(coef, np.float64), np.asarray(intercept, np.float64)
    c = probs.shape[2]
    if coef.shape != (c, x.shape[1]) or intercept.shape != (c,):
        raise UsageError(f"Stacking coefficients of shape {coef.shape} (+{intercept.shape}) do "
                         f"not fit {probs.shape[0]} members and {c} classes.")
    return softmax(x @ coef.T + intercept).astype(np.float32)


def temperature_scaled(probs: np.ndarray, temperature: float) -> np.ndarray:
    """Temperature scaling of the mean: `softmax(log(mean_m p_m) / T)`, mean clipped at 1e-12.

    Raises:
        UsageError: `temperature` not positive.
    """
    if not temperature > 0:
        raise UsageError(f"Expected a positive temperature. Received: temperature={temperature}")
    mean = np.clip(_check(probs).astype(np.float64).mean(axis=0), LOG_CLIP, 1.0)
    return softmax(np.log(mean) / float(temperature)).astype(np.float32)


_TF = "ensemble.tasks.classification.aggregators_tf:"
_FIT = "ensemble.tasks.classification.fitted:"
REGISTRY = registry(  # the classification task's aggregators (`ensemble.tasks.base.Aggregator`)
    Aggregator("mean", lambda p, _: soft_vote(p), _TF + "mean"),
    Aggregator("vote", lambda p, _: hard_vote(p), _TF + "vote", probabilities=False),
    Aggregator("geometric", lambda p, _: geometric(p), _TF + "geometric"),
    Aggregator("weighted", lambda p, q: weighted(p, q["weights"]), _TF + "weighted",
               _FIT + "fit_weighted"),
    Aggregator("greedy", lambda p, q: weighted(p, q["weights"]), _TF + "weighted",
               _FIT + "fit_greedy", selects=True),
    Aggregator("stacking", lambda p, q: stacked(p, q["coef"], q["intercept"]),
               _TF + "stacking", _FIT + "fit_stacking_on"),
    Aggregator("temperature", lambda p, q: temperature_scaled(p, q["temperature"]),
               _TF + "temperature", _FIT + "fit_temperature_on"),
)
AGGREGATORS = tuple(REGISTRY)
FITTED = tuple(a.name for a in REGISTRY.values() if a.fitted)


def aggregate(probs: np.ndarray, name: str, params: dict | None = None) -> np.ndarray:
    """Apply the aggregator `name` of `REGISTRY` to `[n_members, n_rows, n_classes]`.

    Args:
        params: the fitted parameters of a fitted aggregator (one entry of
            `aggregators.json`): `weights` for `weighted`/`greedy`, `coef` and `intercept` for
            `stacking`, `temperature` for `temperature`.

    Raises:
        UsageError: unknown aggregator name, or a fitted one without parameters.
    """
    if name not in REGISTRY:
        raise UsageError(unknown(name))
    return REGISTRY[name](probs, params)


def unknown(name: str) -> str:
    """The message refusing an aggregator name classification does not have."""
    if name == "std-scaling":
        return "Aggregator 'std-scaling' is for regression runs; classification has 'temperature'."
    return f"Expected an aggregator from {', '.join(AGGREGATORS)}. Received: aggregator={name!r}"


def member_weights(name: str, n_members: int, params: dict | None) -> np.ndarray:
    """The members' weights in an ensemble row's *expected* member entropy: the fitted weights
    of `weighted`/`greedy`, otherwise uniform. `[n_members]` float64."""
    if params and "weights" in params:  # an aggregator that fitted member weights
        return check_weights(params["weights"], n_members)
    return np.full(n_members, 1.0 / n_members)


def disagreement(probs: np.ndarray) -> float:
    """Mean pairwise disagreement: share of rows where two members' labels differ, averaged
    over member pairs (0 for a single member). Input `[n_members, n_rows, n_classes]`."""
    labels = np.argmax(_check(probs), axis=2)
    n = labels.shape[0]
    if n < 2:
        return 0.0
    pairs = [(labels[i] != labels[j]).mean() for i in range(n) for j in range(i + 1, n)]
    return float(np.mean(pairs))
