"""The input kinds behind one `Source` protocol, and the one place that picks a kind.

A run's input is a table (a built-in data set, `.csv`/`.parquet` files) or arrays (an `.npz`
file, a folder of images, `digits_images`). Everything that differs between them is a method
of its `Source`: reading and checking the rows, fitting the preprocessing on the training rows,
reading it back from the run, and streaming new rows at predict. The rest of the project calls
the four functions below and never asks which kind it has (Keras's `data_adapters` keep one
adapter per input kind the same way). A new input kind is a new `Source` in `KINDS`.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.core.manifest import Manifest
from ensemble.data import arrays, export_inputs, sources, stream
from ensemble.data.array_scan import ArrayScan
from ensemble.data.table_scan import TableScan
from ensemble.data.preprocessing import Preprocessing
from ensemble.data.settings import DataConfig


class Source(ABC):
    """An input kind (subclasses: `Arrays`, `Tables`)."""

    name: str  # as stored in `preprocessing.json`'s `kind`

    @abstractmethod
    def reads(self, source: str) -> bool:
        """This kind reads `source` (a built-in name, a file or a folder)."""

    @abstractmethod
    def load(self, cfg: DataConfig, require_target: bool, **table: Any):
        """The rows of `cfg.source`: a `sources.Dataset` or `ArrayData`."""

    @abstractmethod
    def fit(self, ds, train_rows: np.ndarray, classes: np.ndarray, impute: str,
            cfg: DataConfig | None):
        """The preprocessing fitted on `ds`'s rows `train_rows` only."""

    @abstractmethod
    def from_dict(self, d: dict):
        """The preprocessing stored in a run's `preprocessing.json`."""

    @abstractmethod
    def scan(self, cfg: DataConfig):
        """`cfg.source` read for training a chunk at a time: labels `y`, `chunks()`,
        `fit(train_rows, classes)`, `sha256()`, `file_rows(rows)` (`TableScan`,
        `ArrayScan`)."""

    @abstractmethod
    def stream(self, pre, source: str, target: str, strict: bool, batch_rows: int,
               quiet: bool):
        """New rows for a trained run, in batches (`stream.Batch`)."""

    @abstractmethod
    def export_inputs(self, pre):
        """An exported signature's inputs and the graph from them to the members' input:
        `(TensorSpec or {name: TensorSpec}, function, doc)` (`ensemble.data.export_inputs`)."""

    def row_shape(self, pre) -> tuple[int, ...] | None:
        """One input row's shape when rows are arrays; None: rows are named columns."""
        return None

    def scale_rows(self, pre, x: np.ndarray) -> np.ndarray:
        """Rows `x` as the members' first layer (`pre.scaling_layer()`) scales them."""
        return x

    def write_rows(self, pre, x: np.ndarray, folder: Path) -> Path | None:
        """In-memory rows `x` `[n_rows, *row_shape]` as a file `stream` reads, in `folder`;
        None: the kind takes no such file (a table: write a DataFrame)."""
        return None


class Arrays(Source):
    """`.npz` files, image folders, `digits_images` (`ensemble.data.arrays`)."""

    name = "arrays"

    def reads(self, source: str) -> bool:
        return arrays.is_array_source(source)

    def load(self, cfg, require_target, **table):
        return arrays.load(cfg, require_target)

    def fit(self, ds, train_rows, classes, impute, cfg):
        return arrays.ArrayPreprocessing.fit(
            ds, train_rows, classes, tuple(cfg.image_size) if cfg and cfg.image_size else None,
            cfg.color_mode if cfg else "rgb")

    def from_dict(self, d):
        return arrays.ArrayPreprocessing.from_dict(d)

    def export_inputs(self, pre):
        return export_inputs.array_inputs(pre)

    def row_shape(self, pre):
        return tuple(int(d) for d in pre.input_shape)

    def scale_rows(self, pre, x):
        """numpy twin of `ArrayPreprocessing.scaling_layer`: `Rescaling(1/255)` for `uint8`
        runs, `Normalization(mean, std**2)` (`(x - mean) / max(std, 1e-7)`) for float runs."""
        x = np.asarray(x, np.float32)
        if pre.dtype == "uint8":
            return x * np.float32(1.0 / 255.0)
        return x if pre.mean is None else (x - pre.mean) / np.maximum(pre.std, np.float32(1e-7))

    def write_rows(self, pre, x, folder):
        path = Path(folder) / "rows.npz"  # key `x`: `npz.load_npz`'s layout
        np.savez(path, x=np.asarray(x))
        return path

    def scan(self, cfg):
        return ArrayScan(cfg)

    def stream(self, pre, source, target, strict, batch_rows, quiet):
        return arrays.ArrayStream(pre, source, batch_rows, quiet, target)


class Tables(Source):
    """Built-in data sets and `.csv`/`.parquet` files (`ensemble.data.sources`)."""

    name = "table"

    def reads(self, source: str) -> bool:
        return True  # the last kind: refuses what it cannot read with the list of sources

    def load(self, cfg, require_target, **table):
        return sources.load(cfg, require_target, **table)

    def fit(self, ds, train_rows, classes, impute, cfg):
        return Preprocessing.fit(ds, train_rows, classes, impute, cfg)

    def from_dict(self, d):
        return Preprocessing.from_dict(d)

    def export_inputs(self, pre):
        return export_inputs.table_inputs(pre)

    def scan(self, cfg):
        return TableScan(cfg)

    def stream(self, pre, source, target, strict, batch_rows, quiet):
        return stream.InputStream(pre, source, target, strict, batch_rows, quiet)


KINDS: tuple[Source, ...] = (Arrays(), Tables())  # the first that reads a source takes it


def _named(name: str) -> Source:
    return next(k for k in KINDS if k.name == name)


def load(cfg: DataConfig, require_target: bool = True, **table: Any):
    """The rows of `cfg.source` read by its kind (`table`: `expected`, `strict`,
    `identifiers` of `sources.load`, for tables at predict time).

    Raises:
        UsageError: anything the kind refuses (one message).
    """
    return next(k for k in KINDS if k.reads(cfg.source)).load(cfg, require_target, **table)


def scan(cfg: DataConfig):
    """`cfg.source` read for training by its kind, a chunk of rows at a time (`Source.scan`).

    Raises:
        UsageError: anything the kind refuses (one message).
    """
    return next(k for k in KINDS if k.reads(cfg.source)).scan(cfg)


def fit_preprocessing(ds, train_rows: np.ndarray, classes: np.ndarray, impute: str = "error",
                      cfg: DataConfig | None = None):
    """The preprocessing of `ds`'s kind fitted on its rows `train_rows` only."""
    return _named(ds.kind).fit(ds, train_rows, classes, impute, cfg)


def fit_in_memory(x: np.ndarray, y: np.ndarray, classes: np.ndarray, names: Sequence[str]):
    """The preprocessing of in-memory rows `x` `[n_rows, ...]` fitted on all of them (the
    scikit-learn estimators): a table's standardisation for `[n_rows, n_features]` with
    column names `names`; rows of more dimensions (images for a CNN) fed as they are
    (`ArrayPreprocessing.identity`)."""
    if x.ndim > 2:
        return arrays.ArrayPreprocessing.identity(x.shape[1:], classes)
    ds = dataclasses.replace(in_memory_rows(x, names), y=y)
    return fit_preprocessing(ds, np.arange(len(x)), classes)


def in_memory_rows(x: np.ndarray, names: Sequence[str]):
    """`x` `[n_rows, n_features]` as an unlabelled table `Dataset` with column names `names`."""
    return sources.Dataset("arrays", np.asarray(x, np.float32), None,
                           tuple(str(n) for n in names))


def from_json(text: str):
    """The preprocessing object of a `preprocessing.json` text (`kind` names its input kind;
    none: a table), as `read_preprocessing` reads it from the file.

    Raises:
        ValueError, KeyError, TypeError: malformed text.
    """
    d = json.loads(text)
    return _named(d.get("kind", "table")).from_dict(d)


def read_preprocessing(path: str | Path):
    """A run's `preprocessing.json` (`kind` names its input kind; none: a table).

    Raises:
        UsageError: a missing or malformed file.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UsageError(f"Preprocessing file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"Preprocessing file {path} is malformed: byte {exc.start} is not "
                         "UTF-8; expected the JSON text a run writes") from None
    return _parsed(path, text)


def _parsed(path: str | Path, text: str):
    """`from_json(text)` of preprocessing file `path`; raises UsageError when malformed."""
    try:
        return from_json(text)
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration) as exc:
        raise UsageError(f"Preprocessing file {path} is malformed: {exc!r}") from None


def run_preprocessing(run_dir: str | Path, manifest: Manifest):
    """A run's `preprocessing.json`, verified against its manifest's sha256 first.

    Raises:
        UsageError: a missing, changed or malformed file.
    """
    from ensemble.core import artifacts

    path = Path(run_dir) / artifacts.PREPROCESSING
    return _parsed(path, artifacts.read_verified(run_dir, manifest, path).decode())


def row_shape(pre) -> tuple[int, ...] | None:
    """The shape of one input row of a run whose preprocessing is `pre`: `[*input_shape]` for
    arrays (`.npz`, images), None for a table (`Source.row_shape`)."""
    return _named(pre.kind).row_shape(pre)


def scale_rows(pre, x: np.ndarray) -> np.ndarray:
    """Rows `x` `[n_rows, *row_shape]` scaled as the first layer of the run's members scales
    them (arrays: `x / 255` or the training standardisation; tables: unchanged), for
    members rebuilt without that layer (the scikit-learn estimators)."""
    return _named(pre.kind).scale_rows(pre, x)


def write_rows(pre, x: np.ndarray, folder: str | Path) -> Path | None:
    """Rows `x` `[n_rows, *row_shape]` of an array run written in `folder` as a file its
    `input_stream` reads; None for a table run."""
    return _named(pre.kind).write_rows(pre, x, Path(folder))


def export_inputs_of(pre):
    """An exported signature's inputs for a run whose preprocessing is `pre`, by its kind
    (`Source.export_inputs`)."""
    return _named(pre.kind).export_inputs(pre)


def input_stream(pre, source: str, target: str, strict: bool = False,
                 batch_rows: int | None = None, quiet: bool = False):
    """New rows for a run whose preprocessing is `pre`, streamed by the run's input kind, in
    batches of `batch_rows` rows (None: `batch_rows_of(pre)`)."""
    return _named(pre.kind).stream(pre, source, target, strict,
                                   batch_rows_of(pre) if batch_rows is None else batch_rows,
                                   quiet)


def batch_rows_of(pre) -> int:
    """The default rows of a prediction batch of a run whose preprocessing is `pre`
    (`stream.default_batch_rows` of its input values per row: an array row's size, or a
    table's input columns)."""
    shape = row_shape(pre)
    values = int(np.prod(shape)) if shape is not None else len(pre.columns)
    return stream.default_batch_rows(values)
