"""Data sources, validation, the stratified split and the scaler.

Sources: the built-in data sets that ship with scikit-learn (`digits`, `breast_cancer`, `wine`,
`iris`), the built-in `synthetic` source (`make_classification`), and `.parquet` / `.csv` files
with a named target column (read by pyarrow). Features are float32 `[n_rows, n_features]`;
labels keep their original values (ints or strings).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.config import DataConfig
from ensemble.errors import UsageError

BUILTIN = ("digits", "breast_cancer", "wine", "iris", "synthetic")


@dataclass(frozen=True)
class Dataset:
    """A labelled (or unlabelled, `y is None`) table.

    Attributes:
        name: source name or file path.
        x: `[n_rows, n_features]` float32 features.
        y: `[n_rows]` labels (int64 or str), or None when the target column is absent.
        feature_names: the `n_features` column names.
    """

    name: str
    x: np.ndarray
    y: np.ndarray | None
    feature_names: tuple[str, ...]

    def sha256(self) -> str:
        """sha256 over the feature bytes, the labels and the feature names."""
        h = hashlib.sha256(np.ascontiguousarray(self.x).tobytes())
        h.update("\0".join(self.feature_names).encode())
        if self.y is not None:
            h.update("\0".join(map(str, self.y.tolist())).encode())
        return h.hexdigest()


def _builtin(cfg: DataConfig) -> Dataset:
    import sklearn.datasets as skd

    if cfg.source == "synthetic":
        s = cfg.synthetic
        x, y = skd.make_classification(
            n_samples=s.rows, n_features=s.features, n_informative=max(2, s.features // 2),
            n_redundant=0, n_classes=s.classes, random_state=s.seed,
        )
        names = tuple(f"x{i}" for i in range(s.features))
        return Dataset("synthetic", x.astype(np.float32), y.astype(np.int64), names)
    bunch = getattr(skd, f"load_{cfg.source}")()
    names = tuple(str(n) for n in bunch.feature_names)
    return Dataset(cfg.source, bunch.data.astype(np.float32), bunch.target.astype(np.int64), names)


def _read_table(path: Path) -> pa.Table:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    if not path.is_file():
        raise UsageError(f"Data file not found: {path}")
    if path.stat().st_size == 0:
        raise UsageError(f"Data file is empty: {path}")
    try:
        if path.suffix == ".parquet":
            return pq.read_table(path)
        return pcsv.read_csv(path)
    except (pa.ArrowInvalid, OSError) as exc:
        kind = "Parquet" if path.suffix == ".parquet" else "CSV"
        raise UsageError(f"Cannot read {path} as {kind}: {str(exc).splitlines()[0]}") from None


def table_to_dataset(table: pa.Table, name: str, target: str, require_target: bool) -> Dataset:
    """Validate a pyarrow table and split it into features and labels.

    Raises:
        UsageError: no rows, missing target (when required), non-numeric features, NaN or inf.
    """
    if table.num_rows == 0:
        raise UsageError(f"Data {name} has no rows; expected at least one.")
    y = None
    if target in table.column_names:
        col = table.column(target)
        if col.null_count:
            raise UsageError(f"Target column {target!r} of {name} has {col.null_count} nulls.")
        y = np.asarray(col.to_numpy(zero_copy_only=False))
        y = y.astype(str) if y.dtype.kind in "OUS" else y
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
                raise UsageError(f"Target column {target!r} of {name} must hold class labels.")
            y = y.astype(np.int64)
        table = table.drop_columns([target])
    elif require_target:
        raise UsageError(
            f"Target column {target!r} not found in {name}; columns: {', '.join(table.column_names)}"
        )
    if table.num_columns == 0:
        raise UsageError(f"Data {name} has no feature columns besides {target!r}.")
    for field in table.schema:
        if not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
                or pa.types.is_boolean(field.type)):
            raise UsageError(
                f"Feature column {field.name!r} of {name} is {field.type}; expected numbers."
            )
    x = np.column_stack([
        pc.cast(table.column(n), pa.float64()).to_numpy(zero_copy_only=False)
        for n in table.column_names
    ]).astype(np.float32)
    bad = ~np.isfinite(x)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise UsageError(
            f"Feature column {table.column_names[c]!r} of {name} holds NaN or inf (row {r}); "
            "expected finite numbers."
        )
    return Dataset(name, x, y, tuple(table.column_names))


def load(cfg: DataConfig, require_target: bool = True) -> Dataset:
    """Load the source named by `cfg.source` (built-in name or file path).

    Raises:
        UsageError: unknown source, unreadable file, or any `table_to_dataset` error; a
        labelled data set must have at least two classes.
    """
    if cfg.source in BUILTIN:
        ds = _builtin(cfg)
    else:
        path = Path(cfg.source)
        if path.suffix not in (".parquet", ".csv"):
            raise UsageError(
                f"Unknown data source {cfg.source!r}; expected one of {', '.join(BUILTIN)} "
                "or a .parquet or .csv file."
            )
        ds = table_to_dataset(_read_table(path), str(path), cfg.target, require_target)
    if require_target and len(np.unique(ds.y)) < 2:
        raise UsageError(f"Data {ds.name} has fewer than two classes; expected at least two.")
    return ds


def split(ds: Dataset, cfg: DataConfig, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Stratified train/validation/test row indices from `seed` (scikit-learn).

    Returns:
        (`{"train": idx, "validation": idx, "test": idx}`, the sorted class labels).

    Raises:
        UsageError: a class too small to appear in every split.
    """
    from sklearn.model_selection import train_test_split

    classes, counts = np.unique(ds.y, return_counts=True)
    idx = np.arange(len(ds.y))
    try:
        rest, test = train_test_split(idx, test_size=cfg.test_size, random_state=seed,
                                      stratify=ds.y)
        val_share = cfg.validation_size / (1.0 - cfg.test_size)
        train, val = train_test_split(rest, test_size=val_share, random_state=seed,
                                      stratify=ds.y[rest])
    except ValueError as exc:
        raise UsageError(
            f"Cannot split {ds.name} into stratified train/validation/test sets "
            f"(smallest class has {counts.min()} rows): {exc}"
        ) from None
    return {"train": np.sort(train), "validation": np.sort(val), "test": np.sort(test)}, classes


def encode(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Map labels `[n_rows]` to class indices `[n_rows]` int32 (`classes` sorted).

    Raises:
        UsageError: a label that is not among `classes`.
    """
    y, classes = np.asarray(y), np.asarray(classes)
    if (y.dtype.kind in "USO") != (classes.dtype.kind in "USO"):
        raise UsageError(
            f"Labels of type {y.dtype} do not match the run's classes {classes.tolist()}"
        )
    pos = np.clip(np.searchsorted(classes, y), 0, len(classes) - 1)
    unknown = classes[pos] != y
    if np.any(unknown):
        raise UsageError(
            f"Label {y[unknown][0].item()!r} is not a class of this run; expected one of "
            f"{classes.tolist()}"
        )
    return pos.astype(np.int32)
