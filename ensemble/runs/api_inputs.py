"""The inputs of `Run.predict` and `Run.evaluate_ood` as a source the CLI's readers take.

A path (a table file, an `.npz` file, an image folder, a built-in name) is passed as it is,
so it takes the code path of `ensemble predict --data`. In-memory data is written to a
temporary file of the run's input kind: a pandas DataFrame, or an ndarray
`[n_rows, n_columns]` in the order of `Run.feature_names`, as a Parquet table for a table
run; an ndarray `[n_rows, *row_shape]` (the run's `dataset.input_shape`, e.g. images
`[n, height, width, channels]` of raw pixels) as an `.npz` file for a run trained on arrays.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

from ensemble.core import artifacts
from ensemble.core.errors import UsageError


def _dims(shape) -> str:
    return ", ".join(str(d) for d in shape)


@contextlib.contextmanager
def as_source(run, data) -> Iterator[tuple[str, str]]:
    """`data` as a source for the CLI's readers, in a temporary folder removed afterwards.

    Yields:
        `(source, label)`: a path as `ensemble predict --data` takes it, and how messages
        name in-memory data (`the DataFrame`, `the array`; None for a path). Within the
        block, notices and `UsageError`s name `label` instead of the temporary file.

    Raises:
        UsageError: an array whose rows are not of the run's shape (or column count),
            naming the received shape and the expected one.
    """
    from ensemble.core.notices import named
    from ensemble.data import kinds

    if isinstance(data, (str, Path)):
        yield str(data), None
        return
    pre = kinds.run_preprocessing(run.path, run.record)
    shape = kinds.row_shape(pre)
    with tempfile.TemporaryDirectory(prefix="ensemble-api-") as tmp:
        if shape is None:
            src, label = Path(tmp) / "input.parquet", "the DataFrame"
            _write_table(run, data, src)
        else:
            src, label = kinds.write_rows(pre, _checked_rows(data, shape), tmp), "the array"
        with named(tmp, label), named(src, label):
            yield str(src), label


def _write_table(run, data, src: Path) -> None:
    """A DataFrame, or an ndarray `[n_rows, n_columns]` named by `run.feature_names`, as a
    Parquet file."""
    import pandas as pd
    import pyarrow as pa

    if isinstance(data, pd.DataFrame):
        frame = data
    else:
        x, names = np.asarray(data), run.feature_names
        if x.ndim != 2 or x.shape[1] != len(names):
            raise UsageError(f"Expected an array [n_rows, {len(names)}] (columns "
                             f"{', '.join(names[:5])}{', ...' if len(names) > 5 else ''}). "
                             f"Received: shape {x.shape}")
        frame = pd.DataFrame(x, columns=names)
    artifacts.write_parquet(src, pa.Table.from_pandas(frame, preserve_index=False))


def _checked_rows(data, shape: tuple[int, ...]) -> np.ndarray:
    """`data` as an array `[n_rows, *shape]`; raises UsageError naming both row shapes."""
    x = np.asarray(data)
    if x.ndim < 2 or tuple(x.shape[1:]) != shape:
        raise UsageError(f"Expected an array [n_rows, {_dims(shape)}]: the run was trained on "
                         f"rows of shape {list(shape)}. Received: shape {x.shape}, rows of "
                         f"shape {list(x.shape[1:])}")
    return x


def without_temporary_ids(frame, label: str | None):
    """Predictions of an in-memory array without their `input` column, which names rows of
    the temporary file (`rows.npz[i]`); `row` numbers them."""
    if label == "the array" and "input" in frame.columns:
        return frame.drop(columns="input")
    return frame
