"""The data containers the input modules pass around: array data sets and streamed batches.

In their own module so that the readers (`arrays`, `images`) and the stream (`stream`) share them
without importing each other.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class ArrayData:
    """Arrays and their labels.

    Attributes:
        x: `[n, *input_shape]` uint8 (images) or float32; an image folder's is an
            `images.ImageFiles` (decoded when indexed).
        y: `[n]` labels (int64 or str), or None.
        ids: `[n]` str: each row's file path, or `"<file>[i]"` for an array index.
        test_rows: row indices of a test split the source gives (Keras layout), or None.
    """

    kind = "arrays"  # its input kind (`ensemble.data.kinds`)
    name: str
    x: np.ndarray
    y: np.ndarray | None
    ids: np.ndarray
    test_rows: np.ndarray | None = None
    color_mode: str = "rgb"  # how an image folder was read (`auto` resolved)

    feature_names: tuple = ()
    categorical: dict | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return ()

    def sha256(self) -> str:
        """sha256 of the rows (an image folder's: its files' names and bytes) and labels."""
        h = hashlib.sha256()
        if hasattr(self.x, "sha256"):  # `images.ImageFiles`: hashed without decoding
            self.x.sha256(h)
        else:
            h.update(np.ascontiguousarray(self.x).tobytes())
        if self.y is not None:
            h.update("\0".join(map(str, self.y.tolist())).encode())
        return h.hexdigest()


@dataclass
class Batch:
    """One batch of a streamed input: rows `first_row..first_row+len(x)-1` of the source.

    Attributes:
        x: `[n_rows, n_outputs]` float32, imputed, encoded and scaled.
        y: `[n_rows]` int32 class indices (-1: a row without a label, or with one the run
            never saw) or a regression run's float64 targets (NaN: none), or None when no row
            of the batch has a label; `y_true` is null where a row has none.
    """

    first_row: int
    x: np.ndarray
    y: np.ndarray | None
    ids: np.ndarray | None = None  # array inputs: each row's file path or array index
    extra: pa.Table | None = None  # with `passthrough`: the input's non-feature columns

    @property
    def rows(self) -> np.ndarray:
        return np.arange(self.first_row, self.first_row + len(self.x), dtype=np.int64)
