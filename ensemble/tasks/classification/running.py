"""Classification metrics over row chunks: exact running sums and exact rank counts.

`Running.update(y, p)` takes one chunk of class indices `y` `[n]` and float32 probabilities
`p` `[n, n_classes]`; `Running.result()` gives what `ensemble.tasks.classification.metrics`
gives on the rows put together, whatever the chunks:

- means (accuracy, NLL, Brier, the ECE's per-bin sums) as float64 running sums;
- per-class counts (recall, balanced accuracy: scikit-learn's `recall_score(average=None)`
  and `balanced_accuracy_score`, over the classes with a true row);
- ROC AUC and average precision from exact counts: per class, the number of positive and
  negative rows at each distinct float32 score (`np.unique` per chunk, merged), from which the
  ROC curve's trapezoids and the precision-recall steps are summed exactly as scikit-learn's
  `roc_auc_score` and `average_precision_score` compute them on the whole array (one-vs-rest
  macro averages over the classes with both positive and negative rows; the binary task
  scores class 1), one class at a time (`rank_metrics`): memory holds one class's counts, at
  most one entry per row of the split.
"""

from __future__ import annotations

import numpy as np

from ensemble.tasks.classification.metrics import ECE_BINS, NLL_CLIP
from ensemble.tasks.classification.threshold import labels

RANK_METRICS = ("roc_auc", "average_precision", "balanced_accuracy")


class ScoreCounts:
    """Positive and negative row counts per distinct float32 score of one class, merged over
    chunks: `values` `[n_distinct]` ascending, `pos`, `neg` `[n_distinct]` int64."""

    def __init__(self) -> None:
        self.values = np.zeros(0, np.float32)
        self.pos = np.zeros(0, np.int64)
        self.neg = np.zeros(0, np.int64)

    def update(self, scores: np.ndarray, positive: np.ndarray) -> None:
        """Add a chunk: `scores` `[n]` (taken as float32), `positive` `[n]` bool."""
        values = np.concatenate([self.values, np.asarray(scores, np.float32)])
        pos = np.concatenate([self.pos, positive.astype(np.int64)])
        neg = np.concatenate([self.neg, (~positive).astype(np.int64)])
        self.values, inverse = np.unique(values, return_inverse=True)
        self.pos = np.bincount(inverse, weights=pos, minlength=len(self.values)).astype(np.int64)
        self.neg = np.bincount(inverse, weights=neg, minlength=len(self.values)).astype(np.int64)

    def roc_auc(self) -> float | None:
        """Area under the ROC curve (ties count half); None without positive or negative rows."""
        n_pos, n_neg = int(self.pos.sum()), int(self.neg.sum())
        if n_pos == 0 or n_neg == 0:
            return None
        below = np.cumsum(self.neg) - self.neg  # negatives strictly below each score
        total = np.sum(self.pos * below.astype(np.float64)) + 0.5 * np.sum(
            self.pos * self.neg.astype(np.float64))
        return float(total / (float(n_pos) * float(n_neg)))

    def average_precision(self) -> float | None:
        """`sum_k (R_k - R_{k-1}) P_k` over the distinct scores from the highest down
        (scikit-learn's `average_precision_score`); None without a positive row."""
        n_pos = int(self.pos.sum())
        if n_pos == 0:
            return None
        tp = np.cumsum(self.pos[::-1]).astype(np.float64)
        fp = np.cumsum(self.neg[::-1]).astype(np.float64)
        precision = tp / (tp + fp)
        recall_steps = self.pos[::-1] / n_pos
        return float(np.sum(recall_steps * precision))


class Running:
    """The running sums of one model's classification metrics over chunks of rows (module
    docstring); `rank_metrics` gives ROC AUC and average precision.

    Args:
        n_classes: the probabilities' width.
    """

    def __init__(self, n_classes: int) -> None:
        self.k = int(n_classes)
        self.n = 0
        self.correct = 0
        self.nll_sum = 0.0
        self.brier_sum = 0.0
        self.acc_bins = np.zeros(ECE_BINS)
        self.conf_bins = np.zeros(ECE_BINS)
        self.true_counts = np.zeros(self.k, np.int64)
        self.hit_counts = np.zeros(self.k, np.int64)

    def update(self, y: np.ndarray, p: np.ndarray, threshold: float | None = None) -> None:
        """Add one chunk: `y` `[n]` class indices, `p` `[n, n_classes]` probabilities;
        `threshold`: a binary run's decision threshold, the predicted labels of accuracy,
        recall and balanced accuracy (`threshold.labels`; the ECE keeps the top label).

        Raises:
            ValueError: shapes that do not match (names them).
        """
        y = np.asarray(y, np.int64)
        p32 = np.asarray(p, np.float32)
        if p32.ndim != 2 or p32.shape[1] != self.k or y.shape != (p32.shape[0],):
            raise ValueError(f"Expected y [n_rows] and p [n_rows, {self.k}]. "
                             f"Received: {y.shape}, {p32.shape}")
        if not len(y):
            return
        p = p32.astype(np.float64)
        rows = np.arange(len(y))
        hit = np.argmax(p, axis=1) == y  # the top label: the ECE's
        decided = hit if threshold is None else labels(p32, threshold) == y
        self.n += len(y)
        self.correct += int(decided.sum())
        self.nll_sum += float(-np.sum(np.log(np.clip(p[rows, y], NLL_CLIP, 1.0))))
        d = p.copy()
        d[rows, y] -= 1.0
        self.brier_sum += float(np.sum(np.einsum("ij,ij->i", d, d)))
        conf = p.max(axis=1)
        bins = np.minimum(np.floor(ECE_BINS * conf).astype(np.int64), ECE_BINS - 1)
        self.acc_bins += np.bincount(bins, weights=hit.astype(np.float64), minlength=ECE_BINS)
        self.conf_bins += np.bincount(bins, weights=conf, minlength=ECE_BINS)
        self.true_counts += np.bincount(y, minlength=self.k)[:self.k]
        self.hit_counts += np.bincount(y[decided], minlength=self.k)[:self.k]

    def recall(self) -> list[float | None]:
        """Per class: the share of its true rows predicted as it; None without a true row."""
        return [float(h / t) if t else None for h, t in zip(self.hit_counts, self.true_counts)]

    def result(self) -> dict[str, float | None]:
        """`accuracy`, `nll`, `brier`, `ece` (as `metrics.all_metrics`), `roc_auc`,
        `average_precision`, `balanced_accuracy`, and `recall` (a list, class order).

        Raises:
            ValueError: no row was added.
        """
        if self.n == 0:
            raise ValueError("Expected at least one row. Received: 0")
        recall = self.recall()
        present = [r for r in recall if r is not None]
        out = {"accuracy": self.correct / self.n, "nll": self.nll_sum / self.n,
               "brier": self.brier_sum / self.n * (0.5 if self.k == 2 else 1.0),
               "ece": float(np.abs(self.acc_bins - self.conf_bins).sum() / self.n),
               "roc_auc": None, "average_precision": None,
               "balanced_accuracy": float(np.mean(present)), "recall": recall}
        return out


def _macro(values: list[float | None]) -> float | None:
    """The mean of the defined values, None when none is."""
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def metrics(y: np.ndarray, p: np.ndarray, chunk_rows: int = 65536,
            rank: bool = True, threshold: float | None = None) -> dict[str, float | None]:
    """`Running.result()` of `y` `[n_rows]` and `p` `[n_rows, n_classes]` (an array or a
    memory map) added `chunk_rows` rows at a time (`threshold`: `Running.update`'s)."""
    k = np.shape(p)[1]
    acc = Running(k)
    for lo in range(0, len(y), chunk_rows):
        acc.update(y[lo:lo + chunk_rows], p[lo:lo + chunk_rows], threshold)
    out = acc.result()
    if rank:
        out.update(rank_metrics(y, p, chunk_rows))
    return out


def rank_metrics(y: np.ndarray, p: np.ndarray, chunk_rows: int = 65536
                 ) -> dict[str, float | None]:
    """`roc_auc` and `average_precision` of `y` `[n_rows]` and `p` `[n_rows, n_classes]` (an
    array or a memory map): one class at a time (its `ScoreCounts` over chunks of
    `chunk_rows` rows), so memory holds one class's counts, at most one entry per row; the
    binary task scores class 1, more classes average one-vs-rest over the classes with both
    positive and negative rows (macro)."""
    k = np.shape(p)[1]
    aucs, aps = [], []
    for c in ([1] if k == 2 else range(k)):
        counts = ScoreCounts()
        for lo in range(0, len(y), chunk_rows):
            part = np.asarray(p[lo:lo + chunk_rows, c], np.float32)
            counts.update(part, np.asarray(y[lo:lo + chunk_rows]) == c)
        aucs.append(counts.roc_auc())
        aps.append(counts.average_precision())
    return {"roc_auc": _macro(aucs), "average_precision": _macro(aps)}
