"""One-line messages about a table's columns and labels: "did you mean" for a misspelt column
name, the checks of column names (`--drop`, duplicates, a CSV header that is not UTF-8), and
the refusal of a stratified split that cannot be made."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.core.labels import text_among_numbers
from ensemble.core.notices import few, notice

UNNAMED_INDEX = r"__index_level_\d+__"  # pandas' unnamed index column (DataFrame.to_parquet)


def did_you_mean(name: str, columns: Sequence[str]) -> str:
    """` (did you mean 'X'?)` for the column of `columns` closest to the misspelt `name`
    (a match ignoring case first, then `difflib.get_close_matches`, as the options do), or
    ``."""
    import difflib

    columns = [str(c) for c in columns]
    same = [c for c in columns if c.casefold() == str(name).casefold()]
    close = same or difflib.get_close_matches(str(name), columns, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def csv_header(path) -> list[str]:
    """The column names of a CSV file's header line (`csv`, as pyarrow parses it).

    Raises:
        UsageError: the header holds bytes that are not UTF-8 (pyarrow would fail on its
            names later, with a traceback).
    """
    import csv

    from ensemble.data.csv_format import dialect, open_text

    with open_text(path) as f:
        names = next(csv.reader(f, delimiter=dialect(path)[0]), [])
    bad = [n for n in names if "\ufffd" in n]
    if bad:
        raise UsageError(f"The header of {path} holds text that is not UTF-8 (column {bad[0]!r},"
                         " the bad bytes shown as \ufffd); expected UTF-8 (re-encode the file, "
                         "e.g. `iconv -f latin1 -t utf-8`).")
    return names


TEXT_HINT = "; or, for categories, the column named in --categorical (read as text)"


def data_row(pyarrow_row: int) -> int:
    """The data-row number (0-based, the numbering of `source_row` and of every message
    here) of pyarrow's CSV `Row #N`, which counts the file's records from 1, the header
    record included."""
    return pyarrow_row - 2


def read_error(exc: Exception, source, names: Sequence[str] = (), hint: str = "") -> str:
    """One line for pyarrow's error reading `source`: a CSV value that is not a number where
    the column holds numbers names its column (`names`: the file's columns, pyarrow gives
    an index) and row, then `hint` (training: `TEXT_HINT`); anything else is pyarrow's own
    first line, its `Row #N` (a CSV parse error: a row with too many or too few cells, an
    unclosed quote) given as the data row (`data_row`) and labelled with pyarrow's count."""
    line = str(exc).splitlines()[0]
    m = re.search(r"In CSV column #(\d+): Row #(\d+): CSV conversion error to (\w+): "
                  r"invalid value '(.*)'", line)
    if m and int(m[1]) < len(names):
        return (f"Cannot read {source}: column {names[int(m[1])]!r} row {data_row(int(m[2]))} "
                f"holds {m[4]!r}; expected a number (the column holds numbers), or an empty "
                f"cell for a missing value{hint}")
    text = line.split("Invalid: ", 1)[-1]
    text = re.sub(r"Row #(\d+)", lambda r: f"row {data_row(int(r[1]))} (data rows from 0, as "
                  f"source_row; pyarrow's CSV record {r[1]}, the header record 1)", text)
    return f"Cannot read {source}: {text}"


def split_refusal(name: str, y: np.ndarray, classes: np.ndarray, counts: np.ndarray) -> str:
    """One line on a stratified split that cannot be made: how many classes are too rare
    and a few of them, the rarest first (`notices.few`: a numeric target may have hundreds),
    and `--task regression` when the labels are numbers."""
    rare = int(np.sum(counts < 3))
    order = np.argsort(counts, kind="stable")[:4]
    named = few([(classes[i].item(), int(counts[i])) for i in order if counts[i] < 3],
                show=lambda c: f"{c[0]!r} {c[1]} row{'s' * (c[1] != 1)}")
    numeric = np.asarray(y).dtype.kind in "iuf"
    markers = None if numeric else text_among_numbers(y)
    hint = ("; a numeric target to predict as a number? Pass --task regression" if numeric
            else "; merge or drop the rarest classes" if not markers else
            "; its labels are numbers but for " + few(
                list(markers.items()), show=lambda m: f"{m[1]} row{'s' * (m[1] != 1)} of "
                f"{m[0]!r}") + ": a numeric target? Leave those cells empty (rows without a "
            "label are dropped) and pass --task regression")
    if not rare:
        return (f"Cannot split {name} into stratified train/validation/test sets: its "
                f"{len(classes):,} classes outnumber the rows of its validation or test split; "
                f"expected fewer classes or more rows{hint}.")
    return (f"Cannot split {name} into stratified train/validation/test sets: {rare:,} of its "
            f"{len(classes):,} classes {'has' if rare == 1 else 'have'} fewer than 3 rows "
            f"({named}); "
            f"expected at least 3 rows per class{hint}.")


def unknown_categories(unknown: dict[str, dict]) -> str:
    """The notice of categories a run never saw, `{column: {value: rows}}` (a missing value:
    None): rows and a few values of each column, the most frequent first."""
    parts = []
    for col, values in unknown.items():
        n = sum(values.values())
        top = sorted(values, key=lambda v: -values[v])
        parts.append(f"{n} row{'s' * (n != 1)} in {col!r} ({few(top)})")
    return ("unknown categories ignored (all-zero encoding; an embedded column's "
            "out-of-vocabulary index): " + ", ".join(parts))


def merge_unknown(total: dict, part: dict) -> dict:
    """Add the unknown values `{column: {value: rows}}` of `part` (a batch) to `total`."""
    from collections import Counter

    for col, values in part.items():
        total.setdefault(col, Counter()).update(values)
    return total


def unknown_labels(where: str, unknown: dict, classes) -> str:
    """The notice of labels `{label: rows}` of `where` (`target column 'label' of x.csv`)
    that are not among the run's `classes`: their rows are predicted, with `y_true` null."""
    n = sum(unknown.values())
    top = sorted(unknown, key=lambda v: -unknown[v])
    return (f"{n:,} row{'s' * (n != 1)} of {where} hold{'s' * (n == 1)} "
            f"{'labels' if len(top) > 1 else 'a label'} the run never saw ({few(top)}): "
            f"predicted, with y_true null on {'it' if n == 1 else 'them'} (the run's classes: "
            f"{few(np.asarray(classes).tolist(), 5)})")


def missing_labels(where: str, n: int, rows: int) -> str:
    """The notice of `n` rows of `where` (`target column 'label' of x.csv`, `the y array of
    x.npz`) out of `rows` without a label: predicted, `y_true` null on them alone."""
    if n >= rows:
        return (f"{where} has no label in its {rows:,} row{'s' * (rows != 1)}: predicted, "
                "with y_true null on every row")
    return (f"{where} has {n:,} missing label{'s' * (n != 1)} in {rows:,} rows: predicted, "
            f"with y_true null on {'it' if n == 1 else 'them'} and kept on the others "
            "(`ensemble evaluate --predictions` of a `--layout long` output scores the "
            "labelled rows)")


def read_columns(names: Sequence[str], drop: Sequence[str], source,
                 index: Sequence[str] = ()) -> list[str]:
    """The columns of a table source that training reads: `names` without the `drop` ones,
    without pandas' unnamed index (`__index_level_0__`, ...: `DataFrame.to_parquet`
    writes it, `pandas.read_parquet` makes it the index again, never a column; a shuffled
    frame's index can even give the label away) and without `index`, a named pandas index
    (`identifiers.pandas_index`: row labels, which the run records as identifiers and
    `predict` carries through); a notice names each kind. `predict` carries an unnamed
    index through as an extra column.

    Raises:
        UsageError: a `drop` column `names` lacks (`check_drop`).
    """
    check_drop(drop, names, source)
    unnamed = [c for c in names if re.fullmatch(UNNAMED_INDEX, c) and c not in drop]
    if unnamed:
        notice(f"left out {', '.join(map(repr, unnamed))} of {source}: pandas' index "
               "(DataFrame.to_parquet wrote it), not a feature", once=True)
    index = [c for c in index if c in names and c not in drop]
    if index:
        notice(f"left out {', '.join(map(repr, index))} of {source}: pandas' named index "
               "(DataFrame.to_parquet wrote it), row labels, not a feature; carried through "
               "to predictions like an id (to train on it: reset_index() before to_parquet)",
               once=True)
    return [c for c in names if c not in drop and c not in unnamed and c not in index]


def check_drop(drop: Sequence[str], columns: Sequence[str], path) -> None:
    """Raises UsageError naming the `--drop` columns that `columns` (of `path`) lacks."""
    unknown = [c for c in drop if c not in columns]
    if unknown:
        raise UsageError(f"Cannot drop column{'s' * (len(unknown) > 1)} "
                         f"{', '.join(map(repr, unknown))}: not in {path}"
                         f"{did_you_mean(unknown[0], columns)} (columns: {', '.join(columns)})")


def check_unique_columns(names: Sequence[str], source: str) -> None:
    """Raises UsageError naming the first column name that `names` holds twice (a CSV header
    or Parquet schema with duplicates cannot be matched by name)."""
    seen: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in seen:
            raise UsageError(f"Data {source} has the column name {n!r} twice (columns "
                             f"{seen[n] + 1} and {i + 1}); expected unique column names.")
        seen[n] = i


def check_same_types(files: Sequence[str], schema, columns: Sequence[str]) -> None:
    """Raises UsageError naming the first Parquet file of `files` (a folder's shards) whose
    column of `columns` has another type than `schema` (the first file's) gives it."""
    import pyarrow.parquet as pq

    for f in files:
        for field in pq.read_schema(f):
            if field.name in columns and field.type != schema.field(field.name).type:
                raise UsageError(
                    f"Column {field.name!r} of {f} is {field.type}; expected "
                    f"{schema.field(field.name).type} as in {files[0]} (every file of a "
                    "folder holds the same columns, each of one type).")
