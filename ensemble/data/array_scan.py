"""An array source (`.npz`, image folder) read for training a chunk of rows at a time."""

from __future__ import annotations

import dataclasses

import numpy as np

from ensemble.data.arrays import ArrayPreprocessing, load


class ArrayScan:
    """An array source read for training a chunk of rows at a time (`table_scan.TableScan`'s
    counterpart): an `.npz` is in memory anyway; an image folder's rows are decoded chunk by
    chunk (`images.ImageFiles`), never the whole folder at once.

    Raises:
        UsageError: as `load`.
    """

    identifiers, columns = (), ()
    CHUNK_ROWS = 1024  # images decoded at once while preparing

    def __init__(self, cfg, chunk_rows: int | None = None):
        self.cfg, self.chunk_rows = cfg, chunk_rows or self.CHUNK_ROWS
        self.data = load(cfg)
        self.name, self.y, self.test_rows = self.data.name, self.data.y, self.data.test_rows

    def chunks(self):
        """`(first row, ArrayData)` of each chunk, its rows decoded, in order."""
        for lo in range(0, len(self.data.ids), self.chunk_rows):
            hi = lo + self.chunk_rows
            yield lo, dataclasses.replace(self.data, x=np.asarray(self.data.x[lo:hi]),
                                          y=None, ids=self.data.ids[lo:hi], test_rows=None)

    @staticmethod
    def file_rows(rows: np.ndarray) -> np.ndarray:
        """Row positions in the source: every row of an array source is kept."""
        return np.asarray(rows, np.int64)

    def fit(self, train_rows: np.ndarray, classes: np.ndarray):
        """`ArrayPreprocessing.fit` on the training rows (uint8 images: nothing to fit)."""
        cfg = self.cfg
        return ArrayPreprocessing.fit(self.data, train_rows, classes,
                                      tuple(cfg.image_size) if cfg.image_size else None,
                                      cfg.color_mode)

    def sha256(self) -> str:
        return self.data.sha256()
