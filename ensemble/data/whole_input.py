"""What a streamed input decides once for the whole input, never per batch: its bad rows
(`error`), its unknown categories (`unknown_categories`, counted without encoding).

A streamed input (`ensemble.data.stream.InputStream`) validates each batch as it reads it; the
first bad batch stops the prediction. Its message names that batch's problems and counts; this
module reads on to the end of the input (features only, nothing kept) and adds, per column, the
rows over the whole input that hold a missing value (when the run refuses them), an infinity, or
a value beyond float32, with the first such row, so a user fixes the file once.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.core.errors import UsageError
from ensemble.data import spelling
from ensemble.data.preprocessing import BOOL_WORDS, is_boolean
from ensemble.data.columns import FLOAT32_MAX

KINDS = ("missing", "inf", "beyond float32")


def bad_rows(table: pa.Table, numeric: Iterable[str], categorical: Iterable[str],
             missing: bool, keep: np.ndarray | None = None
             ) -> dict[tuple[str, str], tuple[int, int]]:
    """`{(column, kind): (bad rows, first bad row's position in `table`)}` of one table.

    Args:
        numeric, categorical: the run's feature columns of each kind (absent ones skipped;
            a numeric column that does not convert to numbers is skipped: its message names it).
        missing: count missing values (the run refuses them: `impute = "error"`).
        keep: `[n_rows]` bool, the rows to count (None: all; training drops unlabelled rows).
    """
    found = {}

    def note(name: str, kind: str, mask: np.ndarray) -> None:
        if keep is not None:
            mask = mask & keep
        if mask.any():
            found[name, kind] = (int(mask.sum()), int(np.argmax(mask)))

    names = set(table.column_names)
    for name in (n for n in numeric if n in names):
        try:
            values = pc.cast(table.column(name), pa.float64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        values = np.asarray(values, np.float64)  # nulls are NaN here
        if missing:
            note(name, "missing", np.isnan(values))
        note(name, "inf", np.isinf(values))
        note(name, "beyond float32", np.isfinite(values) & (np.abs(values) > FLOAT32_MAX))
    if missing:
        for name in (n for n in categorical if n in names):
            note(name, "missing", table.column(name).is_null().to_numpy(zero_copy_only=False))
    return found


def error(exc: UsageError, pre, table: pa.Table, first_row: int,
          rest: Iterable[pa.Table], keep=None) -> UsageError:
    """The error of the first bad batch `table` (rows from `first_row`), with the bad rows of
    every column counted over the whole input: that batch and every table of `rest` (the
    batches after it; the batches before it passed, so held none).

    Args:
        pre: the run's preprocessing (`feature_names`, `categories`, `impute`), or at training
            the same names of the source's columns.
        keep: `keep(table)`, the `[n_rows]` bool rows of a table to count (None: all).

    Returns:
        A UsageError: `exc`'s message, then the whole-input counts (when any were found),
        saying what they count (the file's rows; at training its labelled rows) and the
        first bad row of each (data rows from 0, as `source_row`).
    """
    numeric, categorical = pre.feature_names, tuple(pre.categories)
    missing = getattr(pre, "impute", "error") == "error"
    totals: dict[tuple[str, str], list[int]] = {}
    position = first_row
    try:
        for t in itertools.chain([table], rest):
            kept = None if keep is None else keep(t)
            for key, (n, at) in bad_rows(t, numeric, categorical, missing, kept).items():
                entry = totals.setdefault(key, [0, position + at])
                entry[0] += n
            position += t.num_rows
    except UsageError:  # the input became unreadable further on: count what was read
        pass
    if not totals:
        return exc
    parts = [f"column {name!r} {n:,} row{'s' * (n > 1)} {kind} (first at row {at:,})"
             for (name, kind), (n, at) in sorted(totals.items(), key=lambda kv: kv[1][1])]
    what = f"{position:,} rows in the file" + (
        "" if keep is None else "; its labelled rows counted, the rows training reads")
    return UsageError(f"{exc} In the whole input ({what}): " + "; ".join(parts) + ".")



def unknown_categories(table: pa.Table, pre) -> dict[str, Counter]:
    """`{categorical column: {category the run never saw: rows}}` of a checked batch
    `table`, as `Preprocessing.encode_scaled` counts them (values as text; a missing value
    takes the column's fill category when the run has one, else is unknown; a column with an
    infrequent group has none), without encoding the rows (Arrow's hash lookup); values in
    their canonical spelling (`spelling.arrow_text`), as `columns.category_values` gives them."""
    found = {}
    grouped = set(getattr(pre, "infrequent", ()))  # unknown values join the infrequent column
    for name, cats in pre.categories.items():
        if name in grouped:
            continue
        col = spelling.arrow_text(table.column(name))  # `1935.0`: `1935`, as training spelt it
        if is_boolean(cats):  # `True`, `1`: as `Preprocessing` matches a boolean column
            for word, spellings in BOOL_WORDS.items():
                col = pc.if_else(pc.fill_null(pc.is_in(col, pa.array(spellings)), False),
                                 word, col)
        fill = getattr(pre, "category_fill", {}).get(name)
        cats = [*cats, *getattr(pre, "rare", {}).get(name, [])]  # embedded: infrequent ones
        known = pc.fill_null(pc.is_in(col, value_set=pa.array([str(c) for c in cats],
                                                               pa.string())), False)
        if fill is not None and str(fill) in map(str, cats):
            known = pc.or_(known, pc.is_null(col))  # a missing value is the fill category
        counts = pc.value_counts(col.filter(pc.invert(known))).to_pylist()
        if counts:
            found[name] = Counter({c["values"]: c["counts"] for c in counts})
    return found
