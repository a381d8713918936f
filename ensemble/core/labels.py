"""Label encoding: labels to class indices, shared by the inputs (`ensemble.data`) and the tasks.

Below both, because reading a data set and scoring stored predictions need the same mapping and
neither package imports the other.
"""
from __future__ import annotations

import numpy as np

from ensemble.core.errors import UsageError

UNKNOWN = -1  # `encode_known`'s class index of a label the run never saw


def encode(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Map labels `[n_rows]` to class indices `[n_rows]` int32 (`classes` sorted).

    A regression run has no classes (`classes` empty): targets come back as float64.

    Raises:
        UsageError: a label that is not among `classes`.
    """
    y, classes = np.asarray(y), np.asarray(classes)
    codes, unknown = encode_known(y, classes)
    if unknown and not _same_kind(y, classes):
        raise UsageError(
            f"Labels of type {y.dtype} do not match the run's classes {classes.tolist()}"
        )
    if unknown:
        raise UsageError(
            f"Label {y[codes == UNKNOWN][0].item()!r} is not a class of this run; expected "
            f"one of {classes.tolist()}"
        )
    return codes


def encode_known(y: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, dict]:
    """`encode` for new rows to predict: a label that is not among `classes` (or of another
    type than theirs) becomes class index `UNKNOWN` (-1; `y_true` null) instead of a refusal.

    Returns:
        (`[n_rows]` int32 class indices, or float64 targets of a regression run; {unknown
        label: its rows}).

    Raises:
        UsageError: non-numeric targets of a regression run.
    """
    y, classes = np.asarray(y), np.asarray(classes)
    if classes.size == 0:  # regression
        if y.dtype.kind not in "iuf":
            values = y.tolist()
            first = next((v for v in values if v is not None and not isinstance(
                v, (int, float))), values[0])
            raise UsageError(f"Expected numbers as the targets of this regression run. "
                             f"Received: {first!r} ({'text' if y.dtype.kind in 'USO' else y.dtype})")
        return y.astype(np.float64), {}
    pos = np.zeros(len(y), np.intp)
    known = np.zeros(len(y), bool)
    if _same_kind(y, classes):
        pos = np.clip(np.searchsorted(classes, y), 0, len(classes) - 1)
        known = classes[pos] == y
    values, counts = np.unique(y[~known], return_counts=True)
    return (np.where(known, pos, UNKNOWN).astype(np.int32),
            {v.item(): int(n) for v, n in zip(values, counts)})


def spread(codes: np.ndarray, has: np.ndarray) -> np.ndarray:
    """`codes` (`encode_known`) of the rows where `has` `[n_rows]` is True, over all rows:
    the others `UNKNOWN` (-1), or NaN for a regression run's float64 targets (`y_true`
    null on those rows either way)."""
    if codes.dtype.kind == "f":
        out = np.full(len(has), np.nan)
        out[has] = codes
        return out
    out = np.full(len(has), UNKNOWN, np.int32)
    out[has] = codes
    return out


def _same_kind(y: np.ndarray, classes: np.ndarray) -> bool:
    """Labels and classes both text, or both numbers (else no label can be a class)."""
    return (y.dtype.kind in "USO") == (classes.dtype.kind in "USO")


def text_among_numbers(y: np.ndarray) -> dict[str, int] | None:
    """The values of a text target `y` `[n_rows]` that are not numbers, when most of its
    distinct values are (a numeric target with a few markers such as `unknown` or `?`):
    `{value: rows}`; None when `y` is not text, every value is a number, or fewer than half
    of its distinct values are (class names)."""
    y = np.asarray(y)
    if y.dtype.kind not in "USO" or not len(y):
        return None
    values, counts = np.unique(y.astype(str), return_counts=True)
    number = np.array([_is_number(v) for v in values])
    if number.all() or number.mean() < 0.5:
        return None
    return {str(v): int(c) for v, c, ok in zip(values, counts, number) if not ok}


def _is_number(text: str) -> bool:
    try:
        return bool(np.isfinite(float(text)))
    except ValueError:
        return False
