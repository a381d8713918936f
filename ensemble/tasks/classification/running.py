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
  scores class 1), one class and one range of scores at a time (`rank_metrics`): memory
  holds at most `MAX_ENTRIES` distinct scores' counts (2**16 when one score prefix holds
  more rows), whatever the rows of the split.
"""

from __future__ import annotations

import numpy as np

from ensemble.tasks.classification.metrics import ECE_BINS, NLL_CLIP
from ensemble.tasks.classification.threshold import labels

RANK_METRICS = ("roc_auc", "average_precision", "balanced_accuracy")
MAX_ENTRIES = 1 << 20  # distinct scores of one class held at once (`rank_metrics`)


class ScoreCounts:
    """Positive and negative row counts per distinct float32 score of one class, merged over
    chunks: `values` `[n_distinct]` ascending, `pos`, `neg` `[n_distinct]` int64.

    Chunks are kept as given until they hold as many rows as the counts hold scores (and at
    least `limit` rows), then merged into the counts with one `np.unique`: each row is
    sorted a bounded number of times (merging every chunk into the counts would sort every
    count again per chunk), and memory holds at most `max(limit, n_distinct)` pending rows
    (5 bytes each) besides the counts.

    Args:
        limit: rows kept pending at least before a merge.
    """

    def __init__(self, limit: int = 1 << 16) -> None:
        self._values = np.zeros(0, np.float32)
        self._pos = np.zeros(0, np.int64)
        self._neg = np.zeros(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_rows = 0
        self.limit = max(1, int(limit))

    def update(self, scores: np.ndarray, positive: np.ndarray) -> None:
        """Add a chunk: `scores` `[n]` (taken as float32), `positive` `[n]` bool."""
        self._pending.append((np.asarray(scores, np.float32), np.asarray(positive, bool)))
        self._pending_rows += len(self._pending[-1][0])
        if self._pending_rows >= max(self.limit, len(self._values)):
            self._merge()

    def _merge(self) -> None:
        """The pending chunks merged into the counts (exact integer counts)."""
        if not self._pending:
            return
        scores = np.concatenate([self._values, *(s for s, _ in self._pending)])
        positive = np.concatenate([p for _, p in self._pending])
        self._pending, self._pending_rows = [], 0
        values, inverse = np.unique(scores, return_inverse=True)
        del scores
        held, new = inverse[:len(self._values)], inverse[len(self._values):]
        pos = np.zeros(len(values), np.int64)
        neg = np.zeros(len(values), np.int64)
        pos[held], neg[held] = self._pos, self._neg  # (held scores are distinct)
        pos += np.bincount(new[positive], minlength=len(values))
        neg += np.bincount(new[~positive], minlength=len(values))
        self._values, self._pos, self._neg = values, pos, neg

    @property
    def values(self) -> np.ndarray:
        self._merge()
        return self._values

    @property
    def pos(self) -> np.ndarray:
        self._merge()
        return self._pos

    @property
    def neg(self) -> np.ndarray:
        self._merge()
        return self._neg

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
            rank: bool = True, threshold: float | None = None,
            max_entries: int = MAX_ENTRIES) -> dict[str, float | None]:
    """`Running.result()` of `y` `[n_rows]` and `p` `[n_rows, n_classes]` (an array or a
    memory map) added `chunk_rows` rows at a time (`threshold`: `Running.update`'s;
    `max_entries`: `rank_metrics`')."""
    k = np.shape(p)[1]
    acc = Running(k)
    for lo in range(0, len(y), chunk_rows):
        acc.update(y[lo:lo + chunk_rows], p[lo:lo + chunk_rows], threshold)
    out = acc.result()
    if rank:
        out.update(rank_metrics(y, p, chunk_rows, max_entries))
    return out


def rank_metrics(y: np.ndarray, p: np.ndarray, chunk_rows: int = 65536,
                 max_entries: int = MAX_ENTRIES) -> dict[str, float | None]:
    """`roc_auc` and `average_precision` of `y` `[n_rows]` and `p` `[n_rows, n_classes]` (an
    array or a memory map), in bounded memory: the binary task scores class 1, more classes
    average one-vs-rest over the classes with both positive and negative rows (macro).

    One class at a time, its scores are taken as float32 and keyed by their bits (`_keys`,
    ordered as the values); a first pass over the chunks counts the rows of each of the
    2**16 key prefixes, which are then cut into ranges of at most `max_entries` rows (a
    prefix holding more is a range of its own: at most 2**16 distinct scores). Each range,
    from the highest scores down, is one more pass over the chunks that merges the exact
    counts of its distinct scores (`ScoreCounts`), and adds its ROC trapezoids (negatives
    below a score: the class's negatives less those at or above it) and precision-recall
    steps (true and false positives above carried down). Memory holds at most
    `max(max_entries, 2**16)` distinct scores of one class and one chunk, whatever the
    rows; a split of `n` rows costs `1 + ceil(n / max_entries)` passes per class at least.
    The areas are scikit-learn's (`roc_auc_score`, `average_precision_score`): ROC AUC as a
    sum of integer counts (exact below 2**53), average precision summed by ranges.
    """
    k = np.shape(p)[1]
    aucs, aps = [], []
    for c in ([1] if k == 2 else range(k)):
        auc, ap = _class_areas(y, p, c, chunk_rows, max(1, int(max_entries)))
        aucs.append(auc)
        aps.append(ap)
    return {"roc_auc": _macro(aucs), "average_precision": _macro(aps)}


def _keys(scores: np.ndarray) -> np.ndarray:
    """`[n]` uint32 keys of float32 `scores`, ordered as the scores (`-0.0` as `0.0`):
    positive floats' bits with the sign bit set, negative floats' bits inverted."""
    bits = (np.asarray(scores, np.float32) + np.float32(0.0)).view(np.uint32)
    return np.where(bits >> 31 == 1, ~bits, bits | np.uint32(1 << 31))


def _chunks(y, p, c, chunk_rows):
    """`(float32 scores, positive, uint32 keys)` of class `c`, a chunk of rows at a time."""
    for lo in range(0, len(y), chunk_rows):
        scores = np.asarray(p[lo:lo + chunk_rows, c], np.float32)
        yield scores, np.asarray(y[lo:lo + chunk_rows]) == c, _keys(scores)


def _class_areas(y, p, c, chunk_rows: int, max_entries: int
                 ) -> tuple[float | None, float | None]:
    """(ROC AUC, average precision) of class `c` against the rest (`rank_metrics`). A split
    of at most `max_entries` rows is one range of every prefix (what `_ranges` gives it):
    no counting pass."""
    n_rows = len(y)
    if n_rows <= max_entries:
        ranges = [(0, (1 << 16) - 1)]
        n_pos = int(np.count_nonzero(np.asarray(y) == c))  # at most max_entries rows
    else:
        prefix_rows = np.zeros(1 << 16, np.int64)
        n_pos = 0
        for _, positive, keys in _chunks(y, p, c, chunk_rows):
            prefix_rows += np.bincount(keys >> 16, minlength=1 << 16)
            n_pos += int(positive.sum())
        ranges = _ranges(prefix_rows, max_entries)
    n_neg = n_rows - n_pos
    if n_pos == 0:
        return None, None
    auc_sum, ap_sum = 0.0, 0.0
    neg_above, tp, fp = 0, 0, 0
    for lo, hi in ranges:  # the highest scores first
        counts = ScoreCounts(max_entries)
        for scores, positive, keys in _chunks(y, p, c, chunk_rows):
            if len(ranges) > 1:
                inside = (keys >> 16 >= lo) & (keys >> 16 <= hi)
                scores, positive = scores[inside], positive[inside]
            if len(scores):
                counts.update(scores, positive)
        pos, neg = counts.pos[::-1], counts.neg[::-1]  # descending scores
        at_or_above = neg_above + np.cumsum(neg)
        below = n_neg - at_or_above
        auc_sum += float(np.sum(pos * below.astype(np.float64))
                         + 0.5 * np.sum(pos * neg.astype(np.float64)))
        tps = (tp + np.cumsum(pos)).astype(np.float64)
        fps = (fp + np.cumsum(neg)).astype(np.float64)
        ap_sum += float(np.sum(pos / n_pos * (tps / (tps + fps))))
        neg_above, tp, fp = int(at_or_above[-1]), int(tps[-1]), int(fps[-1])
    auc = None if n_neg == 0 else float(auc_sum / (float(n_pos) * float(n_neg)))
    return auc, ap_sum


def _ranges(prefix_rows: np.ndarray, max_entries: int) -> list[tuple[int, int]]:
    """Ranges `(lo, hi)` of key prefixes holding rows, from the highest down, each of at
    most `max_entries` rows or a single prefix."""
    out, lo, hi, rows = [], 0, None, 0
    for b in np.flatnonzero(prefix_rows)[::-1].tolist():
        n = int(prefix_rows[b])
        if hi is not None and rows + n > max_entries:
            out.append((lo, hi))
            hi = None
        if hi is None:
            hi, rows = b, 0
        lo, rows = b, rows + n
    if hi is not None:
        out.append((lo, hi))
    return out
