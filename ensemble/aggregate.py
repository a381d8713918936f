"""Aggregators: combine member predictions into ensemble predictions (numpy, pure).

Every aggregator maps member probabilities `[n_members, n_rows, n_classes]` to ensemble
probabilities `[n_rows, n_classes]` whose rows sum to 1. The in-graph builder has a TensorFlow
twin of each (`ensemble.in_graph.aggregate_tf`); a test proves they agree.
"""

from __future__ import annotations

import numpy as np

from ensemble.errors import UsageError


def _check(probs: np.ndarray) -> np.ndarray:
    probs = np.asarray(probs)
    if probs.ndim != 3 or 0 in probs.shape:
        raise UsageError(
            "Expected member probabilities of shape [n_members, n_rows, n_classes]. "
            f"Received shape: {probs.shape}"
        )
    return probs


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
    (ties to the smallest class index, as `np.argmax`) is the majority label.
    """
    probs = _check(probs)
    n_members, _, n_classes = probs.shape
    votes = np.argmax(probs, axis=2)  # [n_members, n_rows]
    counts = np.eye(n_classes, dtype=np.float64)[votes].sum(axis=0)  # [n_rows, n_classes]
    return (counts / n_members).astype(np.float32)


AGGREGATORS = {"mean": soft_vote, "vote": hard_vote}


def aggregate(probs: np.ndarray, name: str) -> np.ndarray:
    """Apply the aggregator `name` (`mean` or `vote`) to `[n_members, n_rows, n_classes]`.

    Raises:
        UsageError: unknown aggregator name.
    """
    if name not in AGGREGATORS:
        raise UsageError(
            f"Expected an aggregator from {', '.join(AGGREGATORS)}. Received: aggregator={name!r}"
        )
    return AGGREGATORS[name](probs)


def disagreement(probs: np.ndarray) -> float:
    """Mean pairwise disagreement: share of rows where two members' labels differ, averaged
    over member pairs (0 for a single member). Input `[n_members, n_rows, n_classes]`."""
    labels = np.argmax(_check(probs), axis=2)
    n = labels.shape[0]
    if n < 2:
        return 0.0
    pairs = [(labels[i] != labels[j]).mean() for i in range(n) for j in range(i + 1, n)]
    return float(np.mean(pairs))
