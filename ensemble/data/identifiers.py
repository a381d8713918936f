"""Identifier-like text columns (names, row labels): carried through like an id, not features.

A text column with a distinct value on nearly every row would become one one-hot feature per
row (a model memorises them; nothing carries over to new rows). Tools such as AutoGluon treat
such a column as an identifier; so does a run here, by this rule, at training time:

    a string (or dictionary) column that the config does not list in `[data] categorical`,
    whose distinct non-missing values number more than `MIN_DISTINCT` (50) and at least
    `SHARE` (0.9) of its non-missing rows.

The column is left out of the features with a notice naming `--categorical` to use it anyway;
the run records it (`preprocessing.json` `identifiers`, the manifest's dataset), so `predict`
carries it through to its wide layout like any non-feature column, without the "ignoring"
notice.

A numeric column that counts the rows (`rownames` of R's `write.csv`, pandas' `Unnamed: 0`,
any name) is an identifier too (`is_row_counter`): whole numbers, strictly increasing, from 0
or 1 (or a little later: the first rows may have no label), nine steps in ten exactly 1 (the
rows without a label leave gaps), more than `MIN_DISTINCT` rows, in a table with another
feature column.

A Parquet file's named pandas index (`df.set_index('id').to_parquet(...)`, a column `id` that
the file's pandas metadata lists in `index_columns`) is an identifier too, whatever its
values: row labels, which `pandas.read_parquet` makes the index again (`pandas_index`).
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ensemble.data.columns import number_markers
from ensemble.data.messages import UNNAMED_INDEX

MIN_DISTINCT = 50
SHARE = 0.9


def pandas_index(schema: pa.Schema | None, skip: Sequence[str] = ()) -> tuple[str, ...]:
    """The columns of a Parquet schema that pandas wrote from a named index: the names its
    pandas metadata (`schema.pandas_metadata["index_columns"]`) lists that `schema` holds, in
    schema order, without `skip` (the target, `--drop`) and without pandas' unnamed index
    `__index_level_N__` (`messages.read_columns` leaves that out as before). A range index is
    a dict there and no column: nothing. A CSV, a schema without pandas metadata, or
    metadata that is not pandas' JSON: `()`.
    """
    try:
        listed = (schema.pandas_metadata or {}).get("index_columns") or ()
    except (AttributeError, ValueError, TypeError):  # no schema; bytes that are not JSON
        return ()
    if not isinstance(listed, (list, tuple)):
        return ()
    named = {c for c in listed if isinstance(c, str) and c not in skip
             and not re.fullmatch(UNNAMED_INDEX, c)}
    return tuple(n for n in schema.names if n in named)


def training_index(schema: pa.Schema | None, cfg) -> tuple[str, ...]:
    """`pandas_index` of a training source's `schema` under `cfg` (`[data]`): without the
    target, the `--drop` columns and a column `--categorical` names (a feature, as asked)."""
    listed = () if isinstance(cfg.categorical, str) else tuple(cfg.categorical)
    return pandas_index(schema, (cfg.target, *cfg.drop, *listed))


def _is_text(tp: pa.DataType) -> bool:
    return (pa.types.is_string(tp) or pa.types.is_large_string(tp)
            or pa.types.is_dictionary(tp))


def is_identifier(col: pa.ChunkedArray) -> tuple[bool, int, int]:
    """Whether the text column `col` is identifier-like (the module's rule).

    Returns:
        (identifier?, distinct non-missing values, non-missing rows).
    """
    known = len(col) - col.null_count
    if pa.types.is_dictionary(col.type):
        col = pc.dictionary_decode(col)
    distinct = int(pc.count_distinct(col, mode="only_valid").as_py()) if known else 0
    return distinct > MIN_DISTINCT and distinct >= SHARE * known, distinct, known


def is_row_counter(col: pa.ChunkedArray) -> bool:
    """Whether the numeric column `col` (the labelled rows of a training table, in file
    order) counts the rows (the module's rule): no missing value, whole numbers, strictly
    increasing, starting at most `1 + len(col) // 10`, at least `SHARE` of its steps 1."""
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)) \
            or len(col) <= MIN_DISTINCT or col.null_count:
        return False
    import numpy as np

    v = np.asarray(col.to_numpy(), np.float64)
    step = np.diff(v)
    return bool(np.all(v == np.round(v)) and 0 <= v[0] <= 1 + len(v) // 10
                and np.all(step > 0) and np.mean(step == 1) >= SHARE)


def split_identifiers(table: pa.Table, name: str, categorical: str | Sequence[str],
                      notice) -> tuple[pa.Table, tuple[str, ...]]:
    """Leave identifier-like text columns of a training table out of its features.

    Args:
        table: the training table without its target column.
        name: the data's name, for the notice.
        categorical: `[data] categorical` (`"auto"`, `"none"` or the listed columns: a listed
            column stays a feature whatever its values).
        notice: `ensemble.data.notice`, called once per identifier column.

    Returns:
        (the table without them, their names in table order).
    """
    listed = set() if isinstance(categorical, str) else set(categorical)
    found = []
    counters = []
    for f in table.schema:
        if f.name in listed:
            continue
        if is_row_counter(table.column(f.name)):
            counters.append(f.name)
        if not _is_text(f.type):
            continue
        ident, distinct, known = is_identifier(table.column(f.name))
        if ident and not number_markers(table.column(f.name)):  # numbers, refused later
            found.append((f.name, distinct, known))
    if len(counters) + len(found) == table.num_columns:  # nothing else: features after all
        counters = []
    for col in counters:
        notice(f"column {col!r} of {name} counts the rows ({table.column(col)[0]}, "
               f"{table.column(col)[1]}, ... in file order: a row label): not a feature, "
               "carried through to predictions like an id")
    if not found and not counters:
        return table, ()
    ids = [f.name for f in table.schema if f.name in counters or f.name in
           {n for n, _, _ in found}]
    if categorical == "auto":
        others = [f.name for f in table.schema if f.name not in ids and (
            _is_text(f.type) or pa.types.is_boolean(f.type))]
    else:
        others = [] if categorical == "none" else list(categorical)
    for col, distinct, known in found:
        use = ",".join([*others, col])
        notice(f"column {col!r} of {name} has {distinct} distinct values in the {known} rows "
               f"with a value (an identifier, like a name or a row label): not a feature, "
               f"carried through to "
               f"predictions like an id; to use it as a feature anyway: --categorical "
               f"{shlex.quote(use)} (or [data] categorical)")
    return table.drop_columns(ids), tuple(ids)
