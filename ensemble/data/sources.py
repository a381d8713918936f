"""Data sources, validation, the stratified split and the label encoding.

Sources: the built-in data sets that ship with scikit-learn (`digits`, `breast_cancer`, `wine`,
`iris`), the built-in `synthetic` source (`make_classification`), and `.parquet` / `.csv` files
with a named target column (read by pyarrow). Numeric features are float32 `[n_rows, n_features]`
(NaN where missing, filled later by the imputer when `data.impute` allows it); categorical
features (strings, booleans, dictionary columns under `data.categorical = "auto"`) stay raw
strings until `ensemble.data.preprocessing` one-hot encodes them. Labels keep their original values.

Every problem of a file is collected and reported in ONE `UsageError` (one line), and nothing
here imports TensorFlow or scikit-learn for a file source, so a bad CSV fails in well under a
second, before TensorFlow loads.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.data import columns, csv_format
from ensemble.data.columns import FLOAT32_MAX
from ensemble.data.settings import DataConfig
from ensemble.data.splitting import code_dtype, stratified_assignment, stratified_split
from ensemble.core.errors import UsageError
from ensemble.data.messages import (
    check_unique_columns, csv_header, did_you_mean, read_columns, split_refusal)
from ensemble.core.notices import notice

BUILTIN = ("digits", "breast_cancer", "wine", "iris", "synthetic", "diabetes")


@dataclass(frozen=True)
class Dataset:
    """A labelled (or unlabelled, `y is None`) table.

    Attributes:
        name: source name or file path.
        x: `[n_rows, n_features]` float32 numeric features (NaN where a value is missing).
        y: `[n_rows]` labels (int64 or str), or None when the target column is absent; with
            `labelled`, the labels of its True rows alone (None when no row has one).
        feature_names: the `n_features` numeric column names (columns of `x`).
        categorical: raw categorical columns, name -> `[n_rows]` object array of str (None
            where missing); empty for all-numeric data.
    """

    kind = "table"  # its input kind (`ensemble.data.kinds`)

    name: str
    x: np.ndarray
    y: np.ndarray | None
    feature_names: tuple[str, ...]
    categorical: dict[str, np.ndarray] = field(default_factory=dict)
    identifiers: tuple[str, ...] = ()  # text columns left out as ids (ensemble.data.identifiers)
    # predict: `[n_rows]` bool, the rows with a label when some row of the target column has
    # none (missing, or a float NaN/inf); None when every row has one (or no column)
    labelled: np.ndarray | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """Every input column name: numeric, then categorical."""
        return self.feature_names + tuple(self.categorical)

    def rows(self, idx) -> "Dataset":
        """The rows `idx` (an index array or a slice) of this table, without labels."""
        return Dataset(self.name, self.x[idx], None, self.feature_names,
                       {k: v[idx] for k, v in self.categorical.items()}, self.identifiers)

    def sha256(self) -> str:
        """sha256 over the feature bytes, the categorical values, the labels and the names."""
        h = hashlib.sha256(np.ascontiguousarray(self.x).tobytes())
        h.update("\0".join(self.columns).encode())
        for values in self.categorical.values():
            h.update("\0".join(map(str, values.tolist())).encode())
        if self.y is not None:
            h.update("\0".join(map(str, self.y.tolist())).encode())
        return h.hexdigest()


def _builtin(cfg: DataConfig) -> Dataset:
    return _builtin_cached(cfg.source, cfg.synthetic if cfg.source == "synthetic" else None)


@functools.lru_cache(maxsize=2)  # the CLI checks the data before TensorFlow loads, then uses it
def _builtin_cached(source: str, s) -> Dataset:
    import sklearn.datasets as skd

    if source == "synthetic":
        x, y = skd.make_classification(
            n_samples=s.rows, n_features=s.features, n_informative=max(2, s.features // 2),
            n_redundant=0, n_classes=s.classes, random_state=s.seed,
        )
        names = tuple(f"x{i}" for i in range(s.features))
        return Dataset("synthetic", x.astype(np.float32), y.astype(np.int64), names)
    bunch = getattr(skd, f"load_{source}")()
    names = tuple(str(n) for n in bunch.feature_names)
    y = bunch.target.astype(np.float64 if source == "diabetes" else np.int64)  # regression
    return Dataset(source, bunch.data.astype(np.float32), y, names)


def _read_table(path: Path) -> pa.Table:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise UsageError(f"Data file not found: {path}")
    if path.stat().st_size == 0:
        raise UsageError(f"Data file is empty: {path}")
    try:
        if csv_format.table_format(path) == "parquet":
            return pq.read_table(path)
        csv_header(path)  # bytes that are not UTF-8 in its names: one line
        return csv_format.read_csv(path)
    except (pa.ArrowInvalid, OSError) as exc:
        kind = "Parquet" if csv_format.table_format(path) == "parquet" else "CSV"
        raise UsageError(f"Cannot read {path} as {kind}: {str(exc).splitlines()[0]}") from None


def target_column(col):
    """A target column (array or chunked) with its empty labels `""` as missing (null), as a
    CSV's empty cell is read: a Parquet file's `""` is no class of its own (a class `p_`)."""
    if pa.types.is_dictionary(col.type) and pa.types.is_string(col.type.value_type):
        col = pc.dictionary_decode(col)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return pc.if_else(pc.equal(col, ""), pa.scalar(None, col.type), col)
    return col


def _labels(col: pa.ChunkedArray, target: str, name: str, problems: list[str]):
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        problems.append(columns.not_utf8(target, col, 0))  # pyarrow's type for such text
        return None
    if pa.types.is_decimal(col.type):  # (Parquet's money and SQL NUMERIC): a number
        col = pc.cast(col, pa.float64())
    y = np.asarray(col.to_numpy(zero_copy_only=False))
    y = y.astype(str) if y.dtype.kind in "OUS" else y  # booleans stay booleans
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)):  # regression (`ensemble.runs.prepare.resolve_task`)
            problems.append(f"target column {target!r} holds NaN or inf; expected class "
                            "labels or finite numbers")
            return None
        if y.size and np.abs(y).max() > FLOAT32_MAX:
            problems.append(f"target column {target!r} holds {np.abs(y).max():.6g}, beyond "
                            f"float32 (the model's dtype: |y| <= {FLOAT32_MAX:.4g}); expected "
                            "class labels or numbers that fit")
            return None
        if not np.all(y == np.round(y)) or (y.size and np.abs(y).max() >= 2.0 ** 63):
            return y.astype(np.float64)  # non-integer numbers: a regression target
        y = y.astype(np.int64)
    return y


def spaced_labels_notice(y: np.ndarray, target: str, name: str) -> None:
    """A notice naming text labels that differ only in spaces around them (`' yes '`, `'yes'`):
    each is a class of its own, which a CSV written by hand or a spreadsheet often did not mean."""
    if y.dtype.kind != "U":
        return
    groups: dict[str, list[str]] = {}
    for label in np.unique(y).tolist():
        groups.setdefault(label.strip(), []).append(label)
    clashes = [g for g in groups.values() if len(g) > 1]
    if clashes:
        shown = "; ".join(", ".join(map(repr, g)) for g in clashes[:3])
        notice(f"labels of target column {target!r} of {name} differ only in spaces around "
               f"them ({shown}{'; ...' if len(clashes) > 3 else ''}): each is a class of its "
               "own; strip the spaces in the data if they are the same class", once=True)


def table_to_dataset(table: pa.Table, name: str, target: str, require_target: bool,
                     categorical: str | Sequence[str] = "auto", impute: str = "error",
                     expected: Sequence[str] | None = None, strict: bool = False,
                     first_row: int = 0, identifiers: Sequence[str] = (),
                     detect_identifiers: bool = True) -> Dataset:
    """Validate a pyarrow table and split it into numeric features, categorical features and
    labels. Rows whose label is missing are dropped (with a notice) when the target is required,
    kept otherwise (predict: `Dataset.labelled` marks the rows with one).

    Args:
        categorical: `"auto"` (string, boolean and dictionary columns), `"none"`, or names.
        impute: `"error"` refuses missing feature values; `"median"` / `"most_frequent"`
            leave them for the imputer (NaN, or None in categorical columns).
        expected: the columns a trained run needs (predict time), or None (train time).
            Columns beyond them are ignored with one notice naming them.
        strict: with `expected`, refuse extra columns instead.
        identifiers: with `expected`, the run's identifier columns (neither refused nor named
            as ignored). At train time identifier-like text columns are found and left out
            (`ensemble.data.identifiers`), listed in the returned `Dataset.identifiers`.
        first_row: the source row of the table's first row (a streamed batch), for messages.
        detect_identifiers: at train time, look for identifier-like text columns (False for
            the later chunks of a streamed file: its first chunk decided).

    Raises:
        UsageError: one message listing every problem found (no rows, missing target or
        expected columns, non-numeric non-categorical columns, missing values under
        `impute = "error"`, inf, values beyond float32, text that is not UTF-8, unreadable
        labels), or a duplicate column name (alone).
    """
    if table.num_rows == 0:
        raise UsageError(f"Data {name} has no rows; expected at least one.")
    check_unique_columns(table.column_names, name)
    problems: list[str] = []
    table, y, labelled = _split_target(table, name, target, require_target, problems)
    if expected is not None:
        table = columns.select_expected(table, name, expected, identifiers, strict, problems)
    elif detect_identifiers and not problems:  # training: identifier-like text columns are
        # not features (not with the target missing: its notice would list the target too)
        from ensemble.data.identifiers import split_identifiers

        table, identifiers = split_identifiers(table, name, categorical,
                                               functools.partial(notice, once=True))
        if table.num_columns == 0:
            problems.append(f"no feature columns besides {target!r}")
    cat_names = columns.categorical_names(table, categorical, expected, problems)
    names, x, cats, missing_values = columns.features(table, cat_names, first_row, expected,
                                                      problems)
    if missing_values and impute == "error":
        problems.append(columns.missing_problem(missing_values, expected))
    if problems:
        raise UsageError(f"{len(problems)} problem{'s' * (len(problems) > 1)} in data {name}: "
                         + "; ".join(problems) + ".")
    return Dataset(name, x, y, names, cats,
                   tuple(identifiers) if expected is None else (), labelled)


def _split_target(table: pa.Table, name: str, target: str, require_target: bool,
                  problems: list[str]) -> tuple[pa.Table, np.ndarray | None, np.ndarray | None]:
    """(the table without its target column, the labels or None, `Dataset.labelled`). Rows
    without a label are dropped (with a notice) when the target is required; otherwise
    (predict) they are kept, and the labels are those of the other rows (`labelled`). A
    missing target column is a problem appended to `problems` when it is required."""
    y = labelled = None
    if target in table.column_names:
        col = target_column(table.column(target))
        table = table.set_column(table.column_names.index(target), target, col)
        if col.null_count and require_target:
            keep = pc.is_valid(col)
            table = table.filter(keep)
            n = col.null_count
            notice(f"dropped {n} row{'s' * (n != 1)} of {name} whose label {target!r} is missing")
            col = table.column(target)
        if not require_target:  # NaN or inf: no label either (refused at training)
            has = pc.is_valid(col)
            if pa.types.is_floating(col.type):
                has = pc.and_(has, pc.is_finite(col))
            has = np.asarray(has.fill_null(False), bool)
            if not has.all():
                labelled, col = has, col.filter(pa.array(has))
        if len(col) or labelled is None:
            y = _labels(col, target, name, problems)
        table = table.drop_columns([target])
    elif require_target:
        problems.append(f"Target column {target!r} not found"
                        f"{did_you_mean(target, table.column_names)} (columns: "
                        f"{', '.join(table.column_names)})")
    return table, y, labelled


def load(cfg: DataConfig, require_target: bool = True, expected: Sequence[str] | None = None,
         strict: bool = False, identifiers: Sequence[str] = ()) -> Dataset:
    """Load the source named by `cfg.source` (built-in name or file path).

    Files are read once per process (cached on path, size and modification time), so the
    CLI can check the data before importing TensorFlow and the run reuses what it read.

    Args:
        expected, strict, identifiers: see `table_to_dataset` (predict time).

    Raises:
        UsageError: unknown source, unreadable file, or any `table_to_dataset` error; a
        labelled data set must have at least two classes.
    """
    if cfg.source in BUILTIN:
        ds = _builtin(cfg)
    else:
        path = Path(cfg.source)
        if csv_format.table_format(path) is None:
            raise UsageError(
                f"Unknown data source {cfg.source!r}; expected one of {', '.join(BUILTIN)}, "
                "digits_images, a .parquet, .csv (or .csv.gz) or .npz file, or a folder of "
                "images with one sub-folder per class."
            )
        stat = path.stat() if path.is_file() else None
        key = (stat.st_size, stat.st_mtime_ns) if stat else None
        ds = _load_file(cfg, key, require_target,
                        None if expected is None else tuple(expected), strict,
                        tuple(identifiers))
    return ds


@functools.lru_cache(maxsize=2)
def _load_file(cfg: DataConfig, _stat_key, require_target: bool,
               expected: tuple[str, ...] | None, strict: bool,
               identifiers: tuple[str, ...] = ()) -> Dataset:
    from ensemble.data.identifiers import pandas_index, training_index

    path = Path(cfg.source)
    table = _read_table(path)
    # a named pandas index: an identifier (at predict, unless the run has it as a feature)
    index = (training_index(table.schema, cfg) if expected is None else
             pandas_index(table.schema, (cfg.target, *expected)))
    if expected is None:  # at predict time a dropped column is an extra one
        table = table.select(read_columns(table.column_names, cfg.drop, path, index))
    ds = table_to_dataset(table, str(path), cfg.target, require_target,
                          cfg.categorical, cfg.impute, expected, strict,
                          identifiers=(*identifiers, *index))
    if expected is None and index:  # training: recorded, so predict carries it through
        ds = replace(ds, identifiers=(*index, *ds.identifiers))
    return ds


def split(ds: Dataset, cfg: DataConfig, seed: int, stratify: bool = True
          ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Train/validation/test row indices from `seed` (scikit-learn's draws,
    `ensemble.data.splitting`), stratified by class unless `stratify` is False (the run's
    `Task.stratified`: numeric targets, no classes); each sorted. A test split the source
    gives (`test_rows` of Keras's `.npz` layout) is kept either way.

    Returns:
        (`{"train": idx, "validation": idx, "test": idx}`, the sorted class labels).

    Raises:
        UsageError: a class too small to appear in every split, or a class of the source's
            own test split that its training part lacks.
    """
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(ds.y))
    val_share = cfg.validation_size / (1.0 - cfg.test_size)
    fixed = getattr(ds, "test_rows", None)  # a test split the source gives (Keras's .npz)
    if not stratify:  # no classes (`ensemble.tasks.Task.stratified`)
        if fixed is not None:
            test, rest = fixed, np.setdiff1d(idx, fixed)
        else:
            rest, test = train_test_split(idx, test_size=cfg.test_size, random_state=seed)
        train, val = train_test_split(rest, test_size=val_share, random_state=seed)
        return ({"train": np.sort(train), "validation": np.sort(val), "test": np.sort(test)},
                np.zeros(0, np.float64))
    classes, counts = np.unique(ds.y, return_counts=True)
    unseen = np.setdiff1d(ds.y[fixed], np.delete(ds.y, fixed)) if fixed is not None else ()
    if len(unseen):
        raise UsageError(f"The test part of {ds.name} holds label {unseen[0].item()!r}, which "
                         f"its training part does not (its classes: "
                         f"{np.unique(np.delete(ds.y, fixed)).tolist()}); expected every test "
                         f"label among the training labels")
    try:
        if fixed is not None:
            test, rest = fixed, np.setdiff1d(idx, fixed)
            train, val = stratified_split(rest, ds.y[rest], val_share, seed,
                                          sort=("train", "test"))
            return ({"train": train, "validation": val, "test": np.sort(test)}, classes)
        rest, test = stratified_split(idx, ds.y, cfg.test_size, seed, sort=("test",))
        train, val = stratified_split(rest, ds.y[rest], val_share, seed,
                                      sort=("train", "test"))
    except ValueError:
        raise UsageError(split_refusal(ds.name, ds.y, classes, counts)) from None
    return {"train": train, "validation": val, "test": test}, classes


def assignment(ds, cfg: DataConfig, seed: int, stratify: bool = True
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`split`'s rows as one byte per row, and the labels as class codes: what preparing a
    large table holds instead of index arrays and the labels themselves.

    The same rows as `split` (`splitting.stratified_assignment` for a stratified split of a
    source without a test split of its own; `split`'s indices turned into codes otherwise).

    Returns:
        (`[n]` int8 split codes, `splitting.TRAIN`, `VALIDATION`, `TEST`; the sorted class
        labels; `[n]` class codes of `ds.y`, of `splitting.code_dtype(len(classes))`, or the
        float64 targets when not `stratify`).

    Raises:
        UsageError: as `split`.
    """
    y = ds.y
    if stratify and getattr(ds, "test_rows", None) is None:
        classes, counts = np.unique(y, return_counts=True)
        codes = class_codes(y, classes)
        try:
            which = stratified_assignment(codes, len(classes), cfg.test_size,
                                          cfg.validation_size, seed)
        except ValueError:
            raise UsageError(split_refusal(ds.name, y, classes, counts)) from None
        return which, classes, codes
    rows, classes = split(ds, cfg, seed, stratify)
    which = np.zeros(len(y), np.int8)
    for code, name in enumerate(("train", "validation", "test")):
        which[rows[name]] = code
    del rows
    if not stratify:  # float64 targets (text refused)
        from ensemble.core.labels import encode

        return which, classes, encode(y, classes)
    return which, classes, class_codes(y, classes)


def class_codes(y: np.ndarray, classes: np.ndarray, chunk_rows: int = 1 << 20) -> np.ndarray:
    """`[n]` labels `y` as their positions in the sorted `classes`, of the smallest unsigned
    type (`splitting.code_dtype`), encoded `chunk_rows` at a time (`core.labels.encode`).

    Raises:
        UsageError: a label not among `classes`.
    """
    from ensemble.core.labels import encode

    codes = np.empty(len(y), code_dtype(len(classes)))
    for lo in range(0, len(y), chunk_rows):
        codes[lo:lo + chunk_rows] = encode(y[lo:lo + chunk_rows], classes)
    return codes
