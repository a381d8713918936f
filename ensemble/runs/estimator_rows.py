"""The estimators' input rows: the row shape a fitted (or loaded) estimator takes, checked on
every input.

A row is `[n_features]` for a table or 2-D array input, and `[*row_shape]` (an image
`[height, width, channels]`) for n-d arrays (`model="cnn"`) and for runs `ensemble train` made
from an `.npz` file or an image folder, whose shape the run's `preprocessing.json` records
(`ensemble.data.kinds.row_shape`). scikit-learn's `validate_data(allow_nd=True)` compares only
`X.shape[1]`; `checked` compares the whole row, as `ensemble predict` does.
"""

from __future__ import annotations

import numpy as np

DTYPES = [np.float64, np.float32]


def row_shape(est) -> tuple[int, ...]:
    """The shape of one input row of fitted `est`: its preprocessing's row shape (arrays),
    else `(n_features_in_,)`."""
    from ensemble.data import kinds

    return kinds.row_shape(est.preprocessing_) or (int(est.n_features_in_),)


def shape_of(X) -> tuple[int, ...] | None:
    """`X`'s shape without converting it (None when it has none, e.g. a ragged list)."""
    shape = getattr(X, "shape", None)
    if shape is None:
        try:
            shape = np.shape(X)
        except (TypeError, ValueError):
            return None
    return tuple(shape)


def refuse_other_rows(name: str, got: tuple | None, expected: tuple, reference: str) -> None:
    """Raise ValueError when array `name` of shape `got` `[n_rows, ...]` has rows of another
    shape than `expected`, where either has more than one axis (two tables' column counts are
    left to scikit-learn's own "X has 3 features, but ... is expecting 4" message).
    `reference` says where `expected` comes from: "DeepEnsembleClassifier was fitted on"."""
    if got is None or len(got) < 2 or tuple(got[1:]) == tuple(expected):
        return
    if len(got) > 2 or len(expected) > 1:
        raise ValueError(f"{name} has rows of shape {list(got[1:])}; {reference} rows of shape "
                         f"{list(expected)} (expected {name} of shape "
                         f"[n_rows, {', '.join(map(str, expected))}]).")


def checked(est, X) -> np.ndarray:
    """New rows `X` `[n_rows, *row_shape(est)]` for fitted `est` through scikit-learn's
    `validate_data` (float, finite, feature names).

    Raises:
        ValueError: rows of another shape than the fitted ones, naming both.
    """
    from sklearn.utils.validation import validate_data

    refuse_other_rows("X", shape_of(X), row_shape(est), f"{type(est).__name__} was fitted on")
    return validate_data(est, X, reset=False, dtype=DTYPES, allow_nd=True)
