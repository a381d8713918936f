"""A table source read in chunks: labels first, then the feature rows a bounded chunk at a time.

A file (`.csv`, `.parquet`) or a folder of Parquet shards is opened as a `pyarrow.dataset`
and read in record batches of at most `chunk_rows` rows, so no step holds more than a few
chunks of rows (the one worked on and the next, read ahead by `background.prefetch`; plus
`[n_rows]` label and index arrays). The target column is read alone first: the
task, the split and the class list need every label. The first chunk decides what every
chunk must be (its columns are checked as a whole file's were: identifier-like text columns,
categorical columns); each chunk is then checked and converted by
`sources.table_to_dataset`, so a bad value is reported with its row in the file. A built-in
data set (in memory anyway) is cut into chunks of the same size.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.core import background, memory
from ensemble.core.errors import UsageError
from ensemble.data import columns, csv_format, messages, sources
from ensemble.core.notices import notice
from ensemble.data.identifiers import training_index
from ensemble.data.settings import DataConfig

CHUNK_ROWS = 1 << 16


def _open(path: Path, categorical=()):
    """(the `pyarrow.dataset` of `path`, its kind); a CSV file's `categorical` columns (names
    given, not `"auto"`) are read as text (bytes, whose UTF-8 `columns.category_values`
    checks), whatever their first block looks like."""
    import pyarrow.dataset as pds

    if path.is_dir():
        shards = [p for p in csv_format.folder_files(path)
                  if csv_format.table_format(p) == "parquet"]
        if not shards:
            raise UsageError(f"Data folder {path} holds no .parquet files.")
        return pds.dataset([str(p) for p in shards], format="parquet"), "Parquet"
    if csv_format.table_format(path) is None:
        raise UsageError(
            f"Unknown data source {str(path)!r}; expected one of {', '.join(sources.BUILTIN)}, "
            "digits_images, a .parquet, .csv (or .csv.gz) or .npz file, a folder of .parquet "
            "files, or a folder of images with one sub-folder per class.")
    if not path.is_file():
        raise UsageError(f"Data file not found: {path}")
    if path.stat().st_size == 0:
        raise UsageError(f"Data file is empty: {path}")
    kind = "Parquet" if csv_format.table_format(path) == "parquet" else "CSV"
    if kind == "CSV":  # a dataset refuses a header with a name twice: name it first
        messages.check_unique_columns(messages.csv_header(path), str(path))
    try:
        if kind == "Parquet":
            return pds.dataset(str(path), format="parquet"), kind
        text = {} if categorical in ("auto", "none") else {  # (bytes: UTF-8 checked later)
            n: pa.binary() for n in categorical}
        parse, convert = csv_format.read_options(path, strings_can_be_null=True,
                                                 column_types=text)
        return csv_format.csv_dataset([str(path)], parse, convert), kind
    except (pa.ArrowInvalid, OSError) as exc:
        names = messages.csv_header(path) if kind == "CSV" else []
        raise UsageError(messages.read_error(exc, f"{path} as {kind}", names,
                                             messages.TEXT_HINT)) from None


class TableScan:
    """A table source (`cfg.source`: a built-in name, a file or a folder of Parquet shards)
    read in chunks for training.

    Attributes:
        name: the source's name; y: `[n_rows]` labels of the rows that have one (rows with a
            missing label are dropped, with a notice); columns: the feature columns;
        identifiers: a named pandas index (`identifiers.pandas_index`, not read) and the
            identifier-like text columns left out (decided on the first chunk).

    Raises:
        UsageError: an unreadable or empty source, a missing target or `--drop` column, bad
            labels, or a problem of the first chunk (one message).
    """

    test_rows = None  # tables have no split of their own

    def __init__(self, cfg: DataConfig, chunk_rows: int | None = None):
        self.cfg, self.chunk_rows = cfg, chunk_rows or CHUNK_ROWS
        self.builtin = cfg.source in sources.BUILTIN
        if self.builtin:
            ds = sources.load(cfg)
            self._ds, self.name, self.y = ds, ds.name, ds.y
            self.columns, self.identifiers = ds.columns, ds.identifiers
            self._categorical, self.feature_names = tuple(ds.categorical), ds.feature_names
            self._valid = None
            return
        self.path = Path(cfg.source)
        self.name = str(self.path)
        self._dataset, self._kind = _open(self.path, cfg.categorical)
        names = self._dataset.schema.names
        messages.check_unique_columns(names, self.name)
        # a named pandas index (the dataset's schema metadata, read once): identifiers
        index = training_index(self._dataset.schema, cfg)
        self._read = messages.read_columns(names, cfg.drop, self.path, index)
        tables = self._batches(self._read, self.chunk_rows)
        first = raw = next(tables, None)
        if first is None or first.num_rows == 0:
            raise UsageError(f"Data {self.name} has no rows; expected at least one.")
        if cfg.target in first.column_names:  # (the whole column's notice follows)
            first = first.filter(self._labelled(first))
        try:  # the first chunk decides the columns, checked as a whole file's would be
            head = sources.table_to_dataset(first, self.name, cfg.target, True,
                                            cfg.categorical, cfg.impute)
        except UsageError as exc:
            raise self._whole_file_error(exc, raw, 0, tables, self._identifiers(first)) from None
        tables.close()  # the scan's read-ahead row groups freed before the labels are read
        del tables, first, raw
        self.identifiers = (*index, *head.identifiers)  # the index is not read: not in chunks
        self._categorical = tuple(head.categorical)
        self.columns, self.feature_names = head.columns, head.feature_names
        self.y, self._valid = self._labels()
        if self._valid is not None:  # labelled row i is the file's row _positions[i]
            self._positions = np.flatnonzero(self._valid).astype(np.int64)

    def _batches(self, columns, rows: int) -> Iterator[pa.Table]:
        import pyarrow.dataset as pds

        try:
            # one batch read ahead, not pyarrow's default 16, and no pre-buffering of a whole
            # Parquet file's column chunks: a full pass peaked at 0.94 GB RSS over a 1.6M x 64
            # file with the defaults, 0.60 GB so
            options = {} if self._kind != "Parquet" else {
                "fragment_scan_options": pds.ParquetFragmentScanOptions(pre_buffer=False)}
            for batch in self._dataset.to_batches(columns=columns, batch_size=rows,
                                                  batch_readahead=1, fragment_readahead=1,
                                                  **options):
                if batch.num_rows:
                    yield pa.Table.from_batches([batch])
        except (pa.ArrowInvalid, OSError) as exc:
            names = self._dataset.schema.names if self._kind == "CSV" else []
            if self.path.is_dir():  # the shard whose column differs: pyarrow names neither
                messages.check_same_types(self._dataset.files, self._dataset.schema, columns)
            raise UsageError(messages.read_error(exc, f"{self.path} as {self._kind}", names,
                                                 messages.TEXT_HINT)) from None

    def _labels(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(`[n]` labels of the labelled rows, `[n_source]` bool: rows with a label, or None
        when every row has one).

        The target column is read and converted a batch at a time (its Arrow buffers freed
        batch by batch: held whole, their decoded pages took about 25 bytes per row); the
        batches' labels are joined once (a batch of non-integer numbers makes every label a
        float, as the whole column would)."""
        target = self.cfg.target
        parts, masks, missing = [], [], 0
        for table in self._batches([target], 1 << 20):
            col = sources.target_column(table.column(target))
            if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                return self._labels_whole()  # bytes that are not UTF-8: named by row
            keep = None
            if col.null_count:
                missing += col.null_count
                keep = np.asarray(pc.is_valid(col))
                col = col.filter(pa.array(keep))
            masks.append(np.ones(table.num_rows, bool) if keep is None else keep)
            problems: list[str] = []
            y = sources._labels(col, target, self.name, problems)
            if problems:
                raise UsageError(f"1 problem in data {self.name}: {problems[0]}.")
            parts.append(y if y.base is None else y.copy())  # not a view of Arrow's pages
            del table, col
        memory.release_arrow_pool()
        y = parts[0] if len(parts) == 1 else np.concatenate(parts)
        del parts
        valid = np.concatenate(masks) if missing else None
        if missing:
            notice(f"dropped {missing} row{'s' * (missing != 1)} of {self.name} whose "
                           f"label {target!r} is missing", once=True)  # checked, then prepared
        sources.spaced_labels_notice(y, target, self.name)
        return y, valid

    def _labels_whole(self) -> tuple[np.ndarray, np.ndarray | None]:
        """`_labels` of a target column read whole (text as bytes: its problem names the
        row)."""
        target = self.cfg.target
        col = sources.target_column(pa.concat_tables(self._batches([target], 1 << 20))
                                    .column(target))
        valid = None
        if col.null_count:
            valid = np.asarray(pc.is_valid(col))
            n = col.null_count
            notice(f"dropped {n} row{'s' * (n != 1)} of {self.name} whose label "
                           f"{target!r} is missing", once=True)  # checked, then prepared
            col = col.filter(pc.is_valid(col))
        problems: list[str] = []
        y = sources._labels(col, target, self.name, problems)
        if problems:
            raise UsageError(f"1 problem in data {self.name}: {problems[0]}.")
        sources.spaced_labels_notice(y, target, self.name)
        return y, valid

    def chunks(self) -> Iterator[tuple[int, sources.Dataset]]:
        """`(first row, chunk)` of every chunk of labelled rows, in order: the chunk's features
        as a `sources.Dataset` (no labels); `first row` counts labelled rows only (the
        positions of `y`).

        Raises:
            UsageError: the problems of a chunk (one message, rows as in the file).
        """
        if self.builtin:
            for lo in range(0, len(self.y), self.chunk_rows):
                yield lo, self._ds.rows(slice(lo, lo + self.chunk_rows))
            return
        cfg, start, source_row = self.cfg, 0, 0
        categorical = self._categorical or "none"
        tables = self._batches(self._read, self.chunk_rows)
        for raw in tables:
            n, table = raw.num_rows, raw
            if self._valid is not None:
                table = table.filter(pa.array(self._valid[source_row:source_row + n]))
            table = table.drop_columns([c for c in (cfg.target, *self.identifiers)
                                        if c in table.column_names])
            if table.num_rows:
                try:
                    part = sources.table_to_dataset(
                        table, self.name, cfg.target, False, categorical, cfg.impute,
                        first_row=source_row, detect_identifiers=False)
                except UsageError as exc:
                    raise self._whole_file_error(exc, raw, source_row, tables,
                                                 self.identifiers) from None
                yield start, part
                start += table.num_rows
            source_row += n

    def _labelled(self, table: pa.Table) -> pa.ChunkedArray:
        """The rows of a chunk (the target column read) that have a label: those trained on."""
        return pc.is_valid(sources.target_column(table.column(self.cfg.target)))

    def _identifiers(self, first: pa.Table) -> tuple[str, ...]:
        """The identifier columns of the labelled first chunk `first`, as the head check
        would have left them out (`identifiers.split_identifiers`, no notice)."""
        from ensemble.data.identifiers import split_identifiers

        features = first.drop_columns([c for c in (self.cfg.target,) if c in first.column_names])
        return split_identifiers(features, self.name, self.cfg.categorical,
                                 lambda *a, **k: None)[1]

    def _whole_file_error(self, exc: UsageError, table: pa.Table, first_row: int,
                          rest: Iterator[pa.Table], identifiers: Sequence[str]) -> UsageError:
        """`exc`, the refusal of chunk `table` (rows from `first_row`, which counts that
        chunk's bad rows alone), with the bad rows of each column counted over the rest of the
        file too (`whole_input.error`; labelled rows only, as training reads them; the
        `identifiers`, carried through and never refused, left out)."""
        from types import SimpleNamespace

        from ensemble.data import whole_input

        drop = {self.cfg.target, *identifiers}  # of the columns read (`--drop`, an index: not)
        fields = [f for f in self._dataset.schema if f.name in self._read and f.name not in drop]
        text = [f.name for f in fields if columns.is_category_like(f.type)]
        names = SimpleNamespace(feature_names=[f.name for f in fields if f.name not in text],
                                categories=dict.fromkeys(text), impute=self.cfg.impute)
        return whole_input.error(exc, names, table, first_row, rest, keep=lambda t: (
            self._labelled(t).to_numpy(zero_copy_only=False)
            if self.cfg.target in t.column_names else None))

    def file_rows(self, rows: np.ndarray) -> np.ndarray:
        """The positions in the source of the rows `rows` (positions of `y`): what a run's
        `row` column holds, so a join back to the user's file matches even when rows
        without a label were dropped."""
        rows = np.asarray(rows, np.int64)
        return rows if self._valid is None else self._positions[rows]

    @property
    def numeric_only(self) -> bool:
        """No categorical column: a chunk's `x` (float32, before scaling) is every input of
        the encoding, so the rows can be written as read and scaled in place afterwards
        (`prepared.prepare_splits`)."""
        return not self._categorical

    def fit(self, train_rows: np.ndarray, classes: np.ndarray,
            each: Callable[[int, sources.Dataset], None] | None = None):
        """The `Preprocessing` fitted on the rows `train_rows` (positions of `y`) in one pass
        over the chunks (`table_stats.TableStats`); `each(first row, chunk)` is called with
        every chunk of the pass too (None: nothing). The chunks are read and counted in a
        background thread (`background.prefetch`), one ahead of `each`. `train_rows` may also
        be the `[n_rows]` bool mask of those rows."""
        from ensemble.data.preprocessing import Preprocessing, _notice_id_columns
        from ensemble.data.table_stats import TableStats

        cfg = self.cfg
        stats = TableStats(self.feature_names, self._categorical, cfg.impute,
                           cfg.max_categories, cfg.split_seed, cfg.embed_above,
                           cfg.min_frequency)
        train_rows = np.asarray(train_rows)
        if train_rows.dtype == bool:
            in_train = train_rows
        else:
            in_train = np.zeros(len(self.y), bool)
            in_train[train_rows] = True

        def counted():  # in the background thread: each chunk read, then counted, in order
            for start, chunk in self.chunks():
                take = np.flatnonzero(in_train[start:start + len(chunk.x)])
                if start == 0:  # a whole-number column unique on every row: an id?
                    _notice_id_columns(chunk.feature_names, chunk.x[take])
                stats.update(chunk, take)
                yield start, chunk

        for start, chunk in background.prefetch(counted()):  # `each` here meanwhile
            if each is not None:
                each(start, chunk)
        return Preprocessing(**stats.fitted(classes, self.identifiers))

    def sha256(self) -> str:
        """sha256 of the source: a built-in's rows (`Dataset.sha256`), else the bytes of its
        file(s), read in chunks."""
        if self.builtin:
            return self._ds.sha256()
        h = hashlib.sha256()
        files = ([self.path] if self.path.is_file()
                 else [p for p in csv_format.folder_files(self.path)
                       if csv_format.table_format(p) == "parquet"])
        for f in files:
            h.update(str(f.relative_to(self.path)).encode() if f != self.path else b"")
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        return h.hexdigest()
