"""Streaming prediction I/O: the input read in record batches, the predictions written batch by
batch, so resident memory stays flat however large the input is.

- `InputStream` reads a `.parquet` or `.csv` file, or a folder of such files (sorted by name),
  with `pyarrow.dataset` (readahead of one batch; Parquet without pre-buffering), re-batches
  to `batch_rows` rows and yields
  each batch checked, encoded and scaled exactly as `Preprocessing.transform` does. `check()`
  validates the schema and the first batch (every problem in one message, before TensorFlow
  loads); a bad value further on stops the prediction with a `UsageError` naming its rows,
  with the bad rows of each column counted over the whole input (`ensemble.data.whole_input`).
  Each notice is printed once, with counts over the whole input. A row without a label (an
  empty cell, a null, a float NaN) or with a label the run never saw is class index -1
  (regression: NaN); `y_true` is null on that row alone, the other rows keep theirs.
  `survey()` checks every batch before any prediction (a between-graph launcher).
  Built-in data sets (`digits`, ...) are small and read whole, then sliced.
- `PredictionWriter` (`ensemble.data.prediction_io`) writes tables with one
  `pyarrow.parquet.ParquetWriter` to a temporary name beside the output and renames it into
  place at the end (removed on error).

No TensorFlow here: between-graph clients and the launcher's early check use it too.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Iterator

import pyarrow as pa

from ensemble.data import whole_input
from ensemble.data import csv_format, messages, sources
from ensemble.core.notices import notice
from ensemble.core.labels import encode_known, spread
from ensemble.data.containers import Batch
from ensemble.data.identifiers import pandas_index
from ensemble.core.errors import UsageError
from ensemble.data.preprocessing import Preprocessing

DEFAULT_BATCH_ROWS = 65536
BATCH_BYTES = 64 << 20  # bytes of input values a default batch holds at most (8 per value)


def default_batch_rows(values_per_row: int) -> int:
    """Rows of a batch when `--batch-size` is not given: `DEFAULT_BATCH_ROWS`, fewer for wide
    rows (a 2,000-column table, images), so that a batch holds at most `BATCH_BYTES` of
    values read as float64 (a 2,000-column table: 4,194 rows), and at least 256 rows."""
    return max(256, min(DEFAULT_BATCH_ROWS, BATCH_BYTES // (8 * max(1, values_per_row))))


_CHECKED: set = set()  # inputs whose check passed in this process


class InputStream:
    """New data for a trained run, in batches of at most `batch_rows` rows.

    Args:
        pre: the run's preprocessing (its columns are matched by name; extra columns are
            ignored with one notice, refused with `strict`).
        source: built-in name, `.parquet` / `.csv` file, or a folder of them.
        target: label column (used for `y` when present).

    Raises:
        UsageError: unreadable source, or (from `check` and iteration) bad columns or values.
    """

    def __init__(self, pre: Preprocessing, source: str, target: str, strict: bool = False,
                 batch_rows: int = DEFAULT_BATCH_ROWS, quiet: bool = False):
        if batch_rows < 1:
            raise UsageError(f"Expected --batch-size >= 1. Received: {batch_rows}")
        self.pre, self.source, self.target = pre, str(source), target
        self.strict, self.batch_rows, self.quiet = strict, int(batch_rows), quiet
        self.unknown: dict[str, Counter] = {}  # unknown categories seen: column -> value -> rows
        self.unknown_labels: Counter = Counter()  # labels the run never saw -> rows
        self.passthrough = False  # carry the non-feature columns (an id) in `Batch.extra`
        self.dropped: tuple = ()  # columns training dropped: neither named nor refused
        self.index: tuple = ()  # the input's named pandas index: carried, neither named nor refused
        self._dataset = None
        self.missing_labels = 0  # rows of the input without a label (a target column present)
        if self.source not in sources.BUILTIN:
            import pyarrow.dataset as ds

            files, fmt = csv_format.table_files(self.source, sources.BUILTIN)
            if fmt == "csv":
                for f in files:
                    # names of bytes that are not UTF-8, or a name twice: refused
                    messages.check_unique_columns(messages.csv_header(f), f)
                types = {n: pa.float64() for n in pre.feature_names}
                types.update({n: pa.string() for n in pre.categories})
                parse, convert = csv_format.read_options(  # a folder's files alike: the first
                    files[0], strings_can_be_null=True, column_types=types)
            try:
                if fmt == "csv":  # (carried columns empty in the first block: typed by all)
                    self._dataset = csv_format.csv_dataset(files, parse, convert)
                else:  # pre-buffering reads row groups far ahead: memory would grow with it
                    self._dataset = ds.dataset(files, format=ds.ParquetFileFormat(
                        default_fragment_scan_options=ds.ParquetFragmentScanOptions(
                            pre_buffer=False)))
            except (pa.ArrowInvalid, OSError) as exc:
                if fmt == "parquet":  # name a duplicate column if any
                    import pyarrow.parquet as pq

                    for f in files:
                        try:
                            names = pq.read_schema(f).names
                        except (pa.ArrowInvalid, OSError):
                            continue
                        messages.check_unique_columns(names, f)
                raise UsageError(messages.read_error(exc, self.source, self._header(files))) \
                    from None
            messages.check_unique_columns(self._dataset.schema.names, self.source)
            # a named pandas index (Parquet schema metadata, read once): row labels, carried
            # through like the run's identifiers, unless the run has it as a feature
            self.index = pandas_index(self._dataset.schema, (*pre.columns, target))

    @staticmethod
    def _header(files: list[str]) -> list[str]:
        """The columns of a single CSV file, for `messages.read_error` (none otherwise)."""
        return messages.csv_header(files[0]) if len(files) == 1 and csv_format.table_format(
            files[0]) == "csv" else []

    @property
    def n_rows(self) -> int | None:
        """Rows of the input when known without reading it (Parquet metadata), else None."""
        import pyarrow.dataset as ds

        if self._dataset is None or not isinstance(self._dataset.format, ds.ParquetFileFormat):
            return None
        return self._dataset.count_rows()

    def check_target(self) -> None:
        """Refuse a target column the input lacks, for a `--target` given explicitly (the
        run's own target stays optional: new rows seldom have labels). Built-in sets pass.

        Raises:
            UsageError: the column is not in the input (names the closest one), or it is a
                feature of the run (it was refused as "missing from the input").
        """
        if self.target in self.pre.columns:
            raise UsageError(f"Target column {self.target!r} (--target) is a feature of this "
                             "run, not its label; expected the column the run was trained to "
                             "predict, or no --target (the run's own is used when present)")
        names = self._dataset.schema.names if self._dataset is not None else [self.target]
        if self.target not in names:
            raise UsageError(f"Target column {self.target!r} (--target) not found in "
                             f"{self.source}{messages.did_you_mean(self.target, names)}; "
                             "expected a column of the input, or no --target for rows "
                             "without labels")

    def check_csv_out(self, out) -> None:
        """Refuse a CSV `out` for an input with a list, struct or map column, which a wide
        output carries through and `pyarrow.csv` cannot write (before TensorFlow loads).

        Raises:
            UsageError: names the column and the Parquet output that holds it.
        """
        names = (*self.pre.columns, self.target)
        nested = [f for f in (self._dataset.schema if self._dataset is not None else ())
                  if pa.types.is_nested(f.type) and f.name not in names]
        if nested:
            raise UsageError(f"Cannot write column {nested[0].name!r} of {self.source} "
                             f"({nested[0].type}, carried through to the output) to the CSV "
                             f"{out}: CSV holds no nested values; expected --out ending in "
                             ".parquet, --layout long, or the input without that column.")

    def _to_dataset(self, table: pa.Table, name: str, strict: bool,
                    first_row: int = 0) -> sources.Dataset:
        pre = self.pre
        return sources.table_to_dataset(table, name, self.target, require_target=False,
                                        categorical=tuple(pre.categories) or "none",
                                        impute=pre.impute, expected=pre.columns, strict=strict,
                                        first_row=first_row,
                                        identifiers=(*pre.identifiers, *self.dropped,
                                                     *self.index))

    def check(self) -> None:
        """Check the columns (missing, extra, types) and the first batch's values; prints the
        extra-columns notice. A check already passed in this process (same files, unchanged)
        is not repeated, so the notice shows once. Raises UsageError with every problem."""
        if self._dataset is None:
            self.pre.read_input(self.source, self.target, self.strict)  # cached: read once
            return
        key = (tuple((f, os.stat(f).st_size, os.stat(f).st_mtime_ns)
                     for f in self._dataset.files), self.pre.columns, self.target, self.strict,
               self.batch_rows)
        if key in _CHECKED:
            return
        tables = self._tables(all_columns=True)
        first = next(tables, None)
        if first is None:
            raise UsageError(f"Data {self.source} has no rows; expected at least one.")
        try:
            self._to_dataset(first, self.source, self.strict)
        except UsageError as exc:
            raise whole_input.error(exc, self.pre, first, 0, tables) from None
        _CHECKED.add(key)

    def survey(self) -> None:
        """Check every batch of the input before any prediction (one pass, nothing encoded
        kept): a bad value anywhere is refused now, with its rows counted over the whole input
        (`whole_input.error`), and unknown categories are counted over the whole input and
        noticed once (unless `quiet`). What a between-graph launcher does before starting its
        clients, which then stream the input quietly.

        Raises:
            UsageError: bad columns or values (every problem of the first bad batch, and the
            bad rows of each column over the whole input).
        """
        self.check()
        if self._dataset is None:
            return
        rows = 0
        for part, _, table in self._validated(False):  # checked, not encoded
            messages.merge_unknown(self.unknown, whole_input.unknown_categories(table, self.pre))
            self._labels(part)
            rows += table.num_rows
        self._notice_unknown(rows)

    def _tables(self, all_columns: bool = False) -> Iterator[pa.Table]:
        """The input as tables of exactly `batch_rows` rows (the last one shorter)."""
        import pyarrow.dataset as ds

        names = self._dataset.schema.names
        cols = None if all_columns else [c for c in names if c in (*self.pre.columns,
                                                                  self.target)]
        pending, size = [], 0
        try:
            # one thread and readahead of one batch: threaded scans run ahead of a slow
            # consumer (the model), and memory would grow with the input; CSV: a block at a time
            batches = (csv_format.record_batches(self._dataset.files, self._dataset.format,
                                                 self._dataset.schema, cols)
                       if isinstance(self._dataset.format, ds.CsvFileFormat) else
                       self._dataset.to_batches(columns=cols, batch_size=self.batch_rows,
                                                batch_readahead=1, fragment_readahead=1,
                                                use_threads=False))
            for rb in batches:
                pending.append(rb)
                size += rb.num_rows
                while size >= self.batch_rows:
                    table = pa.Table.from_batches(pending)
                    yield table.slice(0, self.batch_rows).combine_chunks()
                    rest = table.slice(self.batch_rows)
                    pending, size = rest.to_batches(), rest.num_rows
        except (pa.ArrowInvalid, OSError) as exc:
            if isinstance(self._dataset.format, ds.ParquetFileFormat) and len(
                    self._dataset.files) > 1:  # the shard whose column differs, named
                messages.check_same_types(self._dataset.files, self._dataset.schema,
                                          cols or names)
            files = self._dataset.files if len(self._dataset.files) == 1 else []
            raise UsageError(messages.read_error(exc, self.source, self._header(files))) \
                from None
        if size:
            yield pa.Table.from_batches(pending).combine_chunks()

    def __iter__(self) -> Iterator[Batch]:
        if self._dataset is None:
            whole = self.pre.read_input(self.source, self.target, self.strict)
            for lo in range(0, len(whole.x), self.batch_rows):
                span = slice(lo, lo + self.batch_rows)
                part = sources.Dataset(whole.name, whole.x[span],
                                       None if whole.y is None else whole.y[span],
                                       whole.feature_names,
                                       {k: v[span] for k, v in whole.categorical.items()})
                yield self._batch(part, lo)  # a built-in set has no columns beyond features
            self._notice_unknown(len(whole.x))
            return
        rows = 0
        for part, first, extra in self._validated(self.passthrough):
            batch = self._batch(part, first)
            batch.extra = extra
            yield batch
            rows = first + len(part.x)
        if rows == 0:
            raise UsageError(f"Data {self.source} has no rows; expected at least one.")
        self._notice_unknown(rows)

    def _validated(self, passthrough: bool) -> Iterator[tuple[sources.Dataset, int, pa.Table]]:
        """`(checked rows, their first row, their non-feature columns)` per batch of the input
        (without `passthrough`: the batch's table of features and target instead); the first
        bad batch raises with the bad rows counted over the whole input
        (`whole_input.error`)."""
        first = 0
        tables = self._tables(all_columns=passthrough)
        for table in tables:
            name = f"{self.source} (rows {first}..{first + table.num_rows - 1})"
            extra = None
            if passthrough:
                extra = table.select([c for c in table.column_names
                                      if c not in self.pre.columns and c != self.target])
                table = table.select([c for c in table.column_names
                                      if c in self.pre.columns or c == self.target])
            try:
                part = self._to_dataset(table, name, False, first)
            except UsageError as exc:  # count the bad rows over the rest of the input too
                raise whole_input.error(exc, self.pre, table, first, tables) from None
            yield part, first, extra if passthrough else table
            first += table.num_rows

    def passthrough_batches(self) -> Iterator[tuple[pa.Table | None, None]]:
        """`(the input's non-feature columns, None)` in batches of `batch_rows` rows, what a
        between-graph aggregator carries through; `(None, None)` for a built-in set."""
        if self._dataset is None:
            while True:
                yield None, None
        keep = [c for c in self._dataset.schema.names
                if c not in self.pre.columns and c != self.target]
        for table in self._tables(all_columns=True):
            yield table.select(keep), None

    def _batch(self, part: sources.Dataset, first: int) -> Batch:
        x, unknown = self.pre.encode_scaled(part, first)
        messages.merge_unknown(self.unknown, unknown)
        return Batch(first, x, self._labels(part))

    def _labels(self, part: sources.Dataset):
        """`[n_rows]` class indices of `part` (-1: no label, or one the run never saw;
        regression: float64 targets, NaN without one), or None when no row has a label;
        counts the rows without one and the labels the run never saw."""
        if part.labelled is not None:
            self.missing_labels += int(len(part.labelled) - part.labelled.sum())
        if part.y is None:
            return None
        y, unseen = encode_known(part.y, self.pre.classes)
        self.unknown_labels.update(unseen)
        return y if part.labelled is None else spread(y, part.labelled)

    def _notice_unknown(self, rows: int) -> None:
        """The notices of the whole input (`rows` rows): unknown categories, missing labels,
        labels the run never saw."""
        if self.quiet:
            return
        if self.unknown:
            notice(messages.unknown_categories(self.unknown))
        if self.missing_labels:
            notice(messages.missing_labels(
                f"target column {self.target!r} of {self.source}", self.missing_labels, rows),
                once=True)
        if self.unknown_labels:
            notice(messages.unknown_labels(
                f"target column {self.target!r} of {self.source}", self.unknown_labels,
                self.pre.classes))
