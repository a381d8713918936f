"""A table's feature columns checked and converted before they become features: numeric and
category-like types, text that is not UTF-8, dates, values beyond float32, missing values, and
the columns a trained run expects.

Each check appends its problem to a list (`problems`) rather than raising, so that
`ensemble.data.sources.table_to_dataset` reports every problem of a file in one line.
"""

from __future__ import annotations

import shlex
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.core.notices import notice
from ensemble.data import spelling
from ensemble.data.messages import did_you_mean

FLOAT32_MAX = float(np.finfo(np.float32).max)  # the model's dtype: larger values do not fit


def is_numeric(tp: pa.DataType) -> bool:
    """An integer or floating-point Arrow type (a numeric feature)."""
    return pa.types.is_integer(tp) or pa.types.is_floating(tp)


def is_category_like(tp: pa.DataType) -> bool:
    """Text, boolean, dictionary or all-null: one-hot encoded under `categorical = "auto"`."""
    return (pa.types.is_string(tp) or pa.types.is_large_string(tp) or pa.types.is_boolean(tp)
            or pa.types.is_dictionary(tp) or pa.types.is_null(tp))


def not_utf8(name: str, col: pa.ChunkedArray, first_row: int) -> str:
    """The problem line of a text column holding bytes that are not UTF-8 (its first row)."""
    for r, v in enumerate(col.to_pylist()):
        if isinstance(v, bytes):
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                return (f"column {name!r} row {first_row + r} holds text that is not UTF-8 "
                        f"({v[:20]!r}); expected UTF-8 (re-encode the file, e.g. "
                        "`iconv -f latin1 -t utf-8`)")
    return f"column {name!r} holds text that is not UTF-8; expected UTF-8"


def drop_hint(name: str, expected) -> str:
    """` with --drop NAME (or [data] drop)` when training (`expected` None); at predict, where
    the run's columns decide, ` in the data` (predict has no --drop)."""
    return (f" with --drop {shlex.quote(name)} (or [data] drop)" if expected is None
            else " of the data")


def select_expected(table: pa.Table, name: str, expected: Sequence[str],
                     identifiers: Sequence[str], strict: bool, problems: list[str]) -> pa.Table:
    """Predict time: the table's columns a trained run needs (`expected`); missing ones are a
    problem, extra ones a notice (a problem when `strict`), identifiers neither."""
    missing = [c for c in expected if c not in table.column_names]
    if missing:
        shown = ", ".join(map(repr, missing[:8])) + (", ..." if len(missing) > 8 else "")
        looks = "y_pred" in table.column_names and len(missing) == len(expected)
        hint = (f"; {name} looks like `ensemble predict`'s output (predictions, not "
                f"features): score it with `ensemble evaluate --predictions {name}`"
                if looks else "")
        problems.append(f"{len(missing)} training column{'s' * (len(missing) > 1)} "
                        f"{shown} missing from the input (expected {len(expected)}){hint}")
    extra = [c for c in table.column_names if c not in expected and c not in identifiers]
    if extra and strict:
        problems.append(f"extra column{'s' * (len(extra) > 1)} {', '.join(map(repr, extra))}"
                        " (--strict-columns refuses columns the run was not trained on)")
    elif extra:
        notice(f"ignoring column{'s' * (len(extra) > 1)} {', '.join(map(repr, extra))} of "
               f"{name} as features: not features of this run (predict's wide output carries "
               "them through)")
    return table.select([c for c in table.column_names if c in expected])


def categorical_names(table: pa.Table, categorical: str | Sequence[str],
                       expected: Sequence[str] | None, problems: list[str]) -> list[str]:
    """The columns one-hot encoded: `"auto"` (string, boolean and dictionary columns),
    `"none"`, or the names given (at train time, a name not in the table is a problem)."""
    if categorical == "auto":
        names = [f.name for f in table.schema if is_category_like(f.type)
                 and not pa.types.is_null(f.type)]
        for name in names if expected is None else ():  # training decides the encoding
            marks = number_markers(table.column(name))
            if marks and marks[0]:
                problems.append(f"column {name!r} holds numbers but for {marks[1]} "
                                f"row{'s' * (marks[1] != 1)} of "
                                f"{', '.join(map(repr, marks[0]))} (markers of missing "
                                "values?); expected numbers: make those cells empty (missing, "
                                "see --impute), or one-hot encode every value with "
                                f"--categorical {shlex.quote(','.join(names))}")
            elif marks:
                first = table.column(name).drop_null()[0].as_py()
                problems.append(f"column {name!r} holds numbers read as text (such as "
                                f"{first!r}): a decimal mark other than the file's? expected "
                                "numbers written alike in the whole file, or the column named "
                                "in --categorical")
        return names
    if categorical == "none":
        return []
    unknown = [c for c in categorical if c not in table.column_names and expected is None]
    if unknown:
        problems.append(f"categorical column{'s' * (len(unknown) > 1)} "
                        f"{', '.join(map(repr, unknown))} not found"
                        f"{did_you_mean(unknown[0], table.column_names)}")
    return [c for c in categorical if c in table.column_names]


def number_markers(col) -> tuple[list[str], int] | None:
    """The text values of a text column that otherwise holds numbers: markers without a digit
    (`?`, `-`, `n.a.`: at most 3 values, in at most a tenth of its non-missing rows), most
    frequent first, and the rows holding them; `([], 0)` when every value is a number read as
    text (a decimal mark other than the file's); None for any other column (booleans,
    categories, codes such as `2A004` beside numbers)."""
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None
    numbers, other = 0, []
    for item in pc.value_counts(col.drop_null()).to_pylist():
        try:
            float(item["values"])
            numbers += item["counts"]
        except ValueError:
            if any(c.isdigit() for c in item["values"]) or len(other) == 3:
                return None  # a code, or more than a few markers: categories
            other.append((item["counts"], item["values"]))
    rows = sum(n for n, _ in other)
    if not numbers or rows * 10 > numbers + rows:
        return None
    return [v for _, v in sorted(other, key=lambda t: -t[0])], rows


def nested_problem(f: pa.Field, expected) -> str:
    """The problem line of a list, struct or map column: neither a number nor a category."""
    return (f"column {f.name!r} is {f.type}, values nested in each row; expected numbers, "
            f"text or booleans: leave it out{drop_hint(f.name, expected)}")


def category_values(f: pa.Field, col, first_row: int, problems: list[str], expected=None):
    """A categorical column's values as text in their canonical spelling (`[n_rows]` object
    array, None where missing: `spelling.arrow_text`, so that a CSV's `1935.0` and a Parquet
    1935 are one category), or None with a problem appended (bytes that are not UTF-8, a
    nested column)."""
    if pa.types.is_nested(f.type):
        problems.append(nested_problem(f, expected))
        return None
    try:
        values = spelling.arrow_text(col)
    except pa.ArrowInvalid:  # bytes that are not UTF-8 (a Latin-1 file)
        problems.append(not_utf8(f.name, col, first_row))
        return None
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=object)


def held(t: pa.DataType) -> str:
    """What a column of Arrow type `t` holds, in words: "text (large_string)" (nested columns
    have a problem line of their own, `nested_problem`)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return f"text ({t})"
    return f"values of type {t}"


def numeric_values(f: pa.Field, col, first_row: int, expected: Sequence[str] | None,
                    problems: list[str]) -> np.ndarray | None:
    """A numeric, decimal, boolean or all-null column as numbers (`[n_rows]`: an integer or
    float column in its own numpy dtype, float64 where it has NaN or nulls or is decimal,
    boolean or null: all missing, as a Parquet float column of NaN is), or
    None when its type cannot be a feature; a problem is appended for that, inf, or |x|
    beyond float32."""
    if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type):
        problems.append(not_utf8(f.name, col, first_row))
        return None
    if pa.types.is_temporal(f.type):
        problems.append(f"column {f.name!r} holds dates or times ({f.type}); expected "
                        f"numbers: leave it out{drop_hint(f.name, expected)}, or "
                        "convert it to a number (days since a date) in the data")
        return None
    if pa.types.is_nested(f.type):
        problems.append(nested_problem(f, expected))
        return None
    if not (is_numeric(f.type) or pa.types.is_boolean(f.type) or pa.types.is_decimal(f.type)
            or pa.types.is_null(f.type)):  # null: a CSV column with every cell empty
        problems.append(f"column {f.name!r} holds {held(f.type)}; expected numbers (or list it "
                        "in [data] categorical to one-hot encode it)")
        return None
    if is_numeric(f.type):  # its own dtype (float64 where nulls are): stacked at once later
        values = col.to_numpy(zero_copy_only=False)
        if values.dtype.kind in "iu" and values.dtype.itemsize == 8:
            values = values.astype(np.float64)  # rounded to float32 through float64, as ever
        elif values.dtype == np.float16:  # (exact) so that the check below sees its inf
            values = values.astype(np.float32)
        if values.dtype.kind != "f" or (np.isfinite(values).all() if values.dtype.itemsize
                                         == 4 else (np.abs(values) <= FLOAT32_MAX).all()):
            return values  # the usual case, one pass: no NaN, no inf, nothing too big
    values = np.asarray(pc.cast(col, pa.float64(), safe=False)  # (ints beyond 2**53 round)
                        .to_numpy(zero_copy_only=False), np.float64)
    too_big = np.isfinite(values) & (np.abs(values) > FLOAT32_MAX)
    if too_big.any():
        r = int(np.flatnonzero(too_big)[0])
        problems.append(f"column {f.name!r} row {first_row + r} holds {values[r]:.6g}, "
                        f"beyond float32 (the model's dtype: |x| <= {FLOAT32_MAX:.4g})")
    if np.isinf(values).any():
        r = first_row + int(np.flatnonzero(np.isinf(values))[0])
        problems.append(f"column {f.name!r} holds NaN or inf (inf at row {r}); "
                        "expected finite numbers")
    return values


def missing_problem(missing_values: list[tuple[str, int]],
                     expected: Sequence[str] | None) -> str:
    """The problem of missing feature values under `impute = "error"`: `missing_values` is
    (column, rows missing) per column; the fix named differs at train and predict time."""
    cols = ", ".join(f"{c!r} ({n} row{'s' * (n > 1)})" for c, n in missing_values)
    one = len(missing_values) == 1
    fix = ("set [data] impute = \"median\" or \"most_frequent\", or --impute, to fill them"
           if expected is None else  # predict: the run's setting decides (no --impute)
           "the run was trained with [data] impute = \"error\", which refuses them: fill "
           "them in the data; a run trained with impute = \"median\" fills them")
    return (f"column{'' if one else 's'} {cols} hold{'s' * one} missing values (empty "
            f"cells, nulls or NaN; {fix})")


def features(table: pa.Table, cat_names: Sequence[str], first_row: int,
             expected: Sequence[str] | None, problems: list[str]):
    """Every column of `table` as a feature, in the table's order.

    Returns:
        (numeric names, `[n_rows, n_numeric]` float32 numeric features (NaN where missing),
        categorical: name -> `[n_rows]` object array, missing: list of (name, rows missing)
        per column with missing values); columns that cannot be features are left out with
        a problem appended. The numeric columns are stacked in blocks of rows, each column
        cast to float32 from its own dtype (64-bit integers already float64): the same
        values as each column through float64, which holds every other integer and float
        type exactly.
    """
    numeric, cats, missing_values = [], {}, []
    for f in table.schema:
        col = table.column(f.name)
        values = (category_values(f, col, first_row, problems, expected) if f.name in cat_names
                  else numeric_values(f, col, first_row, expected, problems))
        if values is None:
            continue
        if f.name in cat_names:
            cats[f.name] = values
            missing = col.null_count
        else:
            numeric.append((f.name, values))
            missing = int(np.isnan(values).sum()) if values.dtype.kind == "f" else 0
        if missing:
            missing_values.append((f.name, missing))
    return tuple(n for n, _ in numeric), _stacked([v for _, v in numeric], table.num_rows), \
        cats, missing_values


def _stacked(columns: list[np.ndarray], n_rows: int, block_bytes: int = 2 << 20) -> np.ndarray:
    """`[n_rows, len(columns)]` float32: the columns side by side. A block of rows of every
    column is copied into a column-major float32 buffer of about `block_bytes` (each column
    cast to float32 there: its value through its own dtype's exact float64, as one common
    dtype would give) and written transposed, so the block stays in the cache: half the time
    of `numpy.stack` by blocks of rows, a third of column by column."""
    x = np.empty((n_rows, len(columns)), np.float32)
    if not columns or not n_rows:
        return x
    block = max(256, min(n_rows, block_bytes // (4 * len(columns))))
    buf = np.empty((len(columns), block), np.float32)
    with np.errstate(over="ignore"):  # a value beyond float32 is a problem appended above
        for lo in range(0, n_rows, block):
            hi = min(lo + block, n_rows)
            for j, c in enumerate(columns):
                buf[j, :hi - lo] = c[lo:hi]
            x[lo:hi] = buf[:, :hi - lo].T
    return x
