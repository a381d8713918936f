"""The decision threshold of a binary classification run: `y_pred` from the positive class's
probability instead of the most probable class.

`training.threshold` (`--threshold`) is `"none"` (the default: `y_pred` is the argmax), a
number `t` in (0, 1), or `"auto:<metric>"`: per aggregator whose rows are probabilities (not
`vote`'s vote shares), the `t` that maximises `<metric>` of `p_positive >= t` on the
validation split, among the distinct validation probabilities (scikit-learn's `roc_curve`
gives the true and false positives at each; ties go to the highest `t`). The positive class
is the second of the run's two sorted classes (`1`, `True`, or the later string), the class
ROC AUC and average precision score. Each aggregator's `t` is stored with its parameters in
`aggregators.json` (`params[name]["threshold"]`, float32-exact), so every surface that
applies the aggregator (the metrics tables, `predict`, the exported SavedModel's `labels`
and `class_index`, hence `serve`, the estimators' `predict`) sets `y_pred` to the positive
class exactly where `p_positive >= t`. Members' rows keep the argmax.

Metrics (`<metric>`), from the confusion counts at `t`:

- `f1`: `2 TP / (2 TP + FP + FN)`;
- `balanced_accuracy`: `(TPR + TNR) / 2` (Youden's J plus 1/2, scikit-learn's
  `balanced_accuracy_score`);
- `mcc`: Matthews' correlation coefficient (scikit-learn's `matthews_corrcoef`);
- `accuracy`: `(TP + TN) / n`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ensemble.core.errors import UsageError

METRICS = ("f1", "balanced_accuracy", "mcc", "accuracy")
AUTO = "auto:"
KEY = "threshold"  # its key in an aggregator's parameters (`aggregators.json`)


def parse(value: Any, key: str = "training.threshold") -> float | str | None:
    """The threshold setting `value` as None (`"none"`), a float in (0, 1) or a metric name
    of `METRICS` (from `"auto:<metric>"`).

    Raises:
        UsageError: anything else (names `key`, the value and what is expected).
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, str) and value.strip().lower().startswith(AUTO):
        metric = value.strip()[len(AUTO):].lower()
        if metric in METRICS:
            return metric
    else:
        try:
            t = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            t = math.nan
        if 0.0 < t < 1.0:
            return t
    choices = ", ".join(f"{AUTO}{m}" for m in METRICS)
    raise UsageError(f"Expected `{key}` (--threshold) to be \"none\", a number in (0, 1) or "
                     f"one of {choices}. Received: {value!r}")


def check_task(setting: float | str | None, n_classes: int, task_name: str,
               target: str | None = None) -> None:
    """Refuse a threshold on a task that is not binary classification.

    Raises:
        UsageError: a threshold for regression or for more than two classes.
    """
    if setting is None:
        return
    what = (f"a {task_name} target" if task_name != "classification"
            else f"{n_classes} classes")
    if task_name != "classification" or n_classes != 2:
        raise UsageError(f"Expected a binary classification target for `training.threshold` "
                         f"(--threshold, a decision threshold on the positive class's "
                         f"probability). Received: {what}"
                         f"{f' in target {target!r}' if target else ''}; "
                         "expected --threshold none.")


def _counts(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, ...]:
    """(candidate thresholds `[k]` descending, TP, FP `[k]`, positives, negatives) of
    positive-class probabilities `p` `[n]` against binary labels `y` `[n]`."""
    from sklearn.metrics import roc_curve

    positives = int(np.sum(y == 1))
    negatives = len(y) - positives
    if positives == 0 or negatives == 0:  # roc_curve needs both; every row one class
        values = np.unique(p)[::-1]
        above = np.array([np.sum(p >= v) for v in values], np.float64)
        return values, above * (positives > 0), above * (negatives > 0), positives, negatives
    fpr, tpr, thresholds = roc_curve(y, p, drop_intermediate=False)
    keep = np.isfinite(thresholds) & (thresholds <= 1.0)  # the first is "nothing positive"
    return thresholds[keep], tpr[keep] * positives, fpr[keep] * negatives, positives, negatives


def score(metric: str, tp: np.ndarray, fp: np.ndarray, positives: int, negatives: int
          ) -> np.ndarray:
    """`metric` (`METRICS`) at each threshold from its true and false positive counts `[k]`
    (0 where it is undefined, as scikit-learn's `zero_division=0`)."""
    tp, fp = np.asarray(tp, np.float64), np.asarray(fp, np.float64)
    fn, tn = positives - tp, negatives - fp
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric == "f1":
            out = 2 * tp / (2 * tp + fp + fn)
        elif metric == "balanced_accuracy":
            out = 0.5 * (tp / max(positives, 1) + tn / max(negatives, 1))
        elif metric == "mcc":
            out = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        elif metric == "accuracy":
            out = (tp + tn) / (positives + negatives)
        else:
            raise UsageError(f"Expected a threshold metric from {', '.join(METRICS)}. "
                             f"Received: {metric!r}")
    return np.nan_to_num(out, nan=0.0)


def pick(metric: str, y: np.ndarray, p_positive: np.ndarray) -> float:
    """The threshold maximising `metric` of `p_positive >= t` (`p_positive` `[n_rows]`, the
    positive class's validation probabilities; `y` `[n_rows]` class indices 0/1), among the
    distinct values of `p_positive` (ties: the highest); a float32 value, returned as float.

    Raises:
        UsageError: no validation row.
    """
    y = np.asarray(y, np.int64)
    p = np.asarray(p_positive, np.float32)
    if not len(y):
        raise UsageError("Expected labelled validation rows to pick the decision threshold "
                         "(--threshold auto:...). Received: 0 rows; give a number instead.")
    values, tp, fp, positives, negatives = _counts(y, p)
    best = int(np.argmax(score(metric, tp, fp, positives, negatives)))
    return float(np.float32(values[best]))


def fit(setting: float | str | None, y: np.ndarray, p_positive: np.ndarray) -> dict | None:
    """An aggregator's threshold entries (`{"threshold": t, "threshold_metric": metric or
    None}`) for `setting` (`parse`'s), or None without a threshold."""
    if setting is None:
        return None
    if isinstance(setting, str):
        return {KEY: pick(setting, y, p_positive), "threshold_metric": setting}
    return {KEY: float(np.float32(setting)), "threshold_metric": None}


def of(params: dict | None) -> float | None:
    """The threshold in an aggregator's parameters, None when it has none."""
    t = (params or {}).get(KEY)
    return None if t is None else float(t)


def labels(p: np.ndarray, threshold: float | None) -> np.ndarray:
    """Class indices `[n_rows]` int64 of probabilities `p` `[n_rows, n_classes]`: the argmax,
    or with a `threshold` (binary) 1 where `p[:, 1] >= threshold`, else 0."""
    p = np.asarray(p)
    if threshold is None:
        return np.argmax(p, axis=1).astype(np.int64)
    return (np.asarray(p[:, 1], np.float32) >= np.float32(threshold)).astype(np.int64)


def metadata(params: dict | None) -> dict[bytes, bytes]:
    """Parquet key-value metadata holding the thresholds `{aggregator: t}` in fitted
    parameters `params` (`aggregators.json`'s); none without one."""
    found = {a: of(p) for a, p in (params or {}).items() if of(p) is not None}
    return {b"thresholds": json.dumps(found).encode()} if found else {}


def from_metadata(metadata: dict | None) -> dict[str, float]:
    """The `{aggregator: t}` that `metadata` stored, `{}` without one."""
    raw = (metadata or {}).get(b"thresholds")
    return {} if raw is None else {a: float(t) for a, t in json.loads(raw).items()}
