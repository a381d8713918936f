"""The estimators' table input: pandas DataFrames with text and missing values, prepared as
`ensemble train` prepares a table.

`DeepEnsembleClassifier` / `DeepEnsembleRegressor` take numeric arrays through scikit-learn's
`validate_data`. A DataFrame with text (string, categorical, boolean) columns, or any table
(or input with missing values) when the estimator's `impute` is not `"error"`, goes through
the CLI's own path instead: `ensemble.data.table_to_dataset` (the same column checks,
`categorical` rule and identifier columns, named `X` in messages) and `Preprocessing.fit`
(imputation, one-hot encoding and standardisation fitted on the training rows), so a table
gives the estimator the features it gives `ensemble train`.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import numpy as np
import pyarrow as pa

from ensemble.core import notices
from ensemble.data import sources
from ensemble.data.preprocessing import Preprocessing

SHELL_WORD = r"(?:'[^']*'|\"[^\"]*\"|[^\s'\"])+"  # a column name as shlex.quote writes it
NO_TARGET = "\0target"  # a column name no table has: the estimators take y separately

# the CLI's hints, in the estimators' terms (`notices.reworded`): every hint names a parameter
# the estimator takes
WORDING = [
    (r'set \[data\] impute = "median" or "most_frequent", or --impute, to fill them',
     'pass impute="median" or "most_frequent" to fill them'),
    (r'the run was trained with \[data\] impute = "error", which refuses them: fill them in '
     r'the data; a run trained with impute = "median" fills them',
     'the estimator was fitted with impute="error": fill them, or fit it with '
     'impute="median"'),
    (rf'--categorical ({SHELL_WORD}) \(or \[data\] categorical\)',
     lambda m: f"categorical={_names(m.group(1))!r}"),
    (rf'with --categorical ({SHELL_WORD}?)(?=\.?(?:; | |$))',  # a sentence's "." is not a name's
     lambda m: f"with categorical={_names(m.group(1))!r}"),
    (r'see --impute', 'see impute='),
    (rf' with --drop {SHELL_WORD} \(or \[data\] drop\)', " of X"),
    (rf'leave it out with --drop {SHELL_WORD}', "leave it out of X"),
    (rf'leave the column out with --drop {SHELL_WORD}', "leave the column out of X"),
    (r'\[data\] categorical', "categorical="),
    (r', carried through to predictions like an id', ""),
    (re.escape(f" besides {NO_TARGET!r}"), " (every column was left out)"),
]


def _names(word: str) -> list[str]:
    """The column names of a `--categorical` value as a hint writes it (one shell word,
    `shlex.quote`d when a name holds a space: `'dose mg,arm group'`)."""
    return shlex.split(word)[0].split(",")


def _has_missing(X) -> bool:
    try:
        import pandas as pd

        if isinstance(X, pd.DataFrame):
            return bool(X.isna().to_numpy().any())
        x = np.asarray(X)
        return x.dtype.kind == "f" and bool(np.isnan(x).any()) or x.dtype == object and \
            bool(pd.isna(x).any())
    except (TypeError, ValueError):
        return False


def _texts(values) -> bool:
    """Whether object `values` hold text among numbers and missing values only (anything
    else, e.g. a dict, is left to scikit-learn's own refusal)."""
    seen = False
    for v in values:
        if isinstance(v, str):
            seen = True
        elif not (v is None or isinstance(v, (int, float, np.number, bool))):
            return False
    return seen


def wants_table(est, X) -> bool:
    """Whether `X` takes the table path: a DataFrame with a non-numeric column, an object
    array, a `categorical` list, or, under `impute` != `"error"`, a table (2-D; its fill values
    are fitted even when no training value is missing, for the rows `predict` gets) or missing
    values."""
    import pandas as pd

    if isinstance(X, pd.DataFrame):
        if any(not (pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t))
               for t in X.dtypes):
            return True
    elif isinstance(X, np.ndarray) and X.dtype == object and X.ndim == 2:
        if _texts(X.ravel()):  # numbers held as objects stay on the array path
            return True
    if not isinstance(getattr(est, "categorical", "auto"), str):
        return True
    if getattr(est, "impute", "error") == "error":
        return False
    from ensemble.runs.estimator_rows import shape_of

    shape = shape_of(X)
    return shape is not None and len(shape) == 2 or _has_missing(X)


def array_names(n: int) -> list[str]:
    """The names of an array's `n` columns, as a table: `x0` .. `x{n-1}`."""
    return [f"x{i}" for i in range(n)]


def _array_names(names) -> bool:
    """True when `names` are an array's (`array_names`): a run fitted on an array, whose new
    arrays are read by position."""
    return set(names) == set(array_names(len(names)))


def _is_frame(X) -> bool:
    import pandas as pd

    return isinstance(X, pd.DataFrame)


def _frame(est, X, fitted: bool = False):
    """`X` as a pandas DataFrame with string column names (`x0`, ... for arrays).

    New rows for a fitted estimator (`fitted`) take the fitted columns' names by position
    unless they are a DataFrame of those very columns: as scikit-learn reads an array passed
    to an estimator fitted on a DataFrame, or a DataFrame passed to one fitted on an array
    (`validate_data` warns, and has checked the column count)."""
    import pandas as pd

    if isinstance(X, pd.DataFrame):
        frame = X.rename(columns=str)
    else:  # numbers stay numbers (`impute` tables); anything else as objects, not '<U' text
        numeric = isinstance(X, np.ndarray) and X.dtype.kind in "biuf"
        x = X if numeric else np.asarray(X, dtype=object)
        if x.ndim != 2:
            raise ValueError(f"Expected a 2D table [n_rows, n_columns]. Received: shape {x.shape}")
        frame = pd.DataFrame(x, columns=array_names(x.shape[1]))
    columns = getattr(est, "_fit_columns", None) if fitted else None  # None: a loaded run's
    if columns is not None and set(frame.columns) != set(columns):
        frame.columns = list(columns)
    return frame


def _dataset(est, X, pre: Preprocessing | None) -> sources.Dataset:
    import pandas as pd

    frame = _frame(est, X, fitted=pre is not None)
    if pre is None:  # the fitted columns, in order (new rows without their names: by position)
        est._fit_columns = tuple(frame.columns)
    for name in frame.columns:  # object columns: numbers when they all are, else text
        if frame[name].dtype == object:
            values = frame[name]
            if not _texts(values.to_numpy()):
                try:
                    frame[name] = pd.to_numeric(values)
                except (TypeError, ValueError):  # dates, lists: the column checks name them
                    pass
                continue
            frame[name] = values.where(values.isna(), values.astype(str))
            frame[name] = frame[name].astype(pd.StringDtype())
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if pre is None:
        categorical = est.categorical
        if isinstance(categorical, (set, frozenset)):  # no order of its own: a fixed one
            categorical = sorted(categorical, key=str)
        if not isinstance(categorical, str):  # a list, tuple, array or pandas Index of names
            categorical = tuple(str(c) for c in categorical)
        return sources.table_to_dataset(table, "X", NO_TARGET, False, categorical, est.impute)
    return sources.table_to_dataset(table, "X", NO_TARGET, False,
                                 tuple(pre.categories) or "none", pre.impute,
                                 expected=pre.columns, identifiers=pre.identifiers)


def check_input(est, X, y=None, reset: bool = True) -> tuple[Any, Any]:
    """scikit-learn's checks of a table input (row count, `n_features_in_`,
    `feature_names_in_`) without converting it to numbers; returns `(X, y)` with `y` as a
    1-D array, checked as `validate_data` checks it on the array path (at least one row, no
    NaN or inf).

    Raises:
        ValueError: also for an `X` that is not 2-D (a pandas Series: one row or one column),
            naming its shape.
    """
    from sklearn.utils.validation import check_array, column_or_1d, validate_data

    from ensemble.runs.estimator_rows import shape_of

    shape = shape_of(X)
    if shape is None or len(shape) != 2:
        raise ValueError(f"Expected a 2D table [n_rows, n_columns]. Received: "
                         f"{type(X).__name__} of shape {shape} (one row of a DataFrame: "
                         "X.iloc[[i]]; of an array: x.reshape(1, -1)).")
    validate_data(est, X, reset=reset, skip_check_array=True)
    if y is None:
        return X, None
    y = check_array(column_or_1d(y, warn=True), ensure_2d=False, dtype=None,
                    input_name="y", estimator=est)
    if len(y) != len(X):
        raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                         f"[{len(X)}, {len(y)}]")
    return X, y


def fit(est, X, y, classes) -> tuple[Preprocessing, np.ndarray]:
    """Fit the CLI's preprocessing on every row of table `X`.

    Args:
        y: `[n_rows]` class indices (a classifier) or None (a regressor).
        classes: `[n_classes]` labels (empty for a regressor).

    Returns:
        (the fitted `Preprocessing`, `[n_rows, n_outputs]` float32 scaled features).

    Raises:
        ValueError (UsageError): the CLI's data problems, naming `X`'s columns.
    """
    import dataclasses

    with notices.reworded(WORDING):
        ds = dataclasses.replace(_dataset(est, X, None), y=y)
        pre = Preprocessing.fit(ds, np.arange(len(ds.x)), np.asarray(classes), est.impute)
        return pre, pre.transform(ds)


def transform(est, X) -> np.ndarray:
    """Table `X` prepared with the fitted `est.preprocessing_`: `[n_rows, n_outputs]`
    float32."""
    with notices.reworded(WORDING):
        return est.preprocessing_.transform(_dataset(est, X, est.preprocessing_))


def scaled(est, X) -> np.ndarray:
    """New rows `X` for a fitted estimator, prepared by the path it was fitted on (a table;
    arrays `[n_rows, *row_shape]`, `ensemble.runs.estimator_rows`) as its members take them:
    `[n_rows, *member input shape]` float32.

    Raises:
        ValueError: columns or rows of another shape than the fitted ones.
    """
    from sklearn.utils.validation import check_is_fitted

    from ensemble.data import kinds
    from ensemble.runs import estimator_rows, fit_arrays

    check_is_fitted(est)
    if getattr(est, "table_input_", False):
        if est.table_input_ != "by-name":  # a loaded CLI run matches columns by name only
            check_input(est, X, reset=False)
        elif not _is_frame(X) and not _array_names(est.feature_names_in_):
            # a file's or DataFrame's columns: no order to read an array's columns by
            names = list(est.feature_names_in_)
            raise ValueError(f"{type(est).__name__} loaded from a run with categorical, "
                             "identifier or imputed columns predicts DataFrames, columns "
                             f"matched by name ({', '.join(names[:6])}"
                             f"{', ...' if len(names) > 6 else ''}). Received: "
                             f"{type(X).__name__}")
        return transform(est, X)
    X = estimator_rows.checked(est, X)
    pre = est.preprocessing_
    return kinds.scale_rows(pre, pre.transform(fit_arrays.dataset(X, list(
        getattr(est, "feature_names_in_", pre.feature_names)))))  # members built unscaled
