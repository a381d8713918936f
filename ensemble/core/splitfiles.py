"""The prepared splits on disk: one memory-mappable `.npy` per array, written chunk by chunk.

A run keeps each split (`train`, `validation`, `test`) as three files under `data/`:
`<split>.x.npy` (`[n, *row_shape]` float32 scaled rows, or uint8 images), `<split>.y.npy`
(`[n]` encoded targets) and `<split>.row.npy` (`[n]` int64 row positions in the source). They
are written through `numpy.lib.format.open_memmap` under temporary names, so a split larger
than memory is written a chunk of rows at a time, then flushed and renamed into place together;
they are read with `numpy.load(mmap_mode="r")`, so training gathers its batches from the page
cache and no process holds a split in memory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ensemble.core import background
from ensemble.core.errors import UsageError
from ensemble.core.staging import fsync_dir

ARRAYS = ("x", "y", "row")
# bytes written between flushes: a memory cgroup counts dirty pages, which cannot be reclaimed
# before they are written back, so a split larger than the cgroup is flushed as it goes; the
# flush runs in a background thread (`os.fdatasync` releases the GIL) while the next rows are
# prepared, and waits for the one before it, so at most 2 x FLUSH_BYTES are dirty per split
FLUSH_BYTES = 64 << 20
_datasync = getattr(os, "fdatasync", os.fsync)  # (macOS has no fdatasync)


def path(run_dir: str | Path, split: str, array: str) -> Path:
    """`run_dir/data/<split>.<array>.npy`."""
    return Path(run_dir) / "data" / f"{split}.{array}.npy"


class SplitWriter:
    """Writes one split's `x`, `y` and `row` files a chunk of rows at a time.

    Args:
        run_dir: the run directory (the files go to its `data/`).
        split: the split's name.
        n_rows: rows the split will hold.
        row_shape: one row's shape (`(n_features,)` for a table).
        x_dtype, y_dtype: dtypes of the rows and the encoded targets.

    Use `write` in row order, then `commit` (flush, fsync, rename all three into place); on
    an error `abort` removes the temporary files. Also a context manager doing just that.
    Every `FLUSH_BYTES` written, the files are synced to disk in a background thread (the
    writes to a shared memory map are the file's page cache, which `fdatasync` writes back).

    Raises:
        OSError: the files cannot be created (a full disk).
    """

    def __init__(self, run_dir: str | Path, split: str, n_rows: int, row_shape, x_dtype,
                 y_dtype):
        from numpy.lib.format import open_memmap

        self._syncing = None  # the background sync's result function (`background.start`)
        self.final = [path(run_dir, split, a) for a in ARRAYS]
        self.final[0].parent.mkdir(parents=True, exist_ok=True)
        self.tmp = [p.with_name(f".{p.name}.{os.getpid()}.tmp") for p in self.final]
        shapes = [(n_rows, *row_shape), (n_rows,), (n_rows,)]
        dtypes = [x_dtype, y_dtype, np.int64]
        self.arrays = []
        try:
            for tmp, shape, dtype in zip(self.tmp, shapes, dtypes):
                self.arrays.append(open_memmap(tmp, mode="w+", dtype=dtype, shape=shape))
        except BaseException:
            self.abort()
            raise
        self.n_rows, self.pos, self.unflushed = n_rows, 0, 0

    def write(self, x: np.ndarray, y: np.ndarray, row: np.ndarray) -> None:
        """Append rows: `x` `[m, *row_shape]`, `y` `[m]`, `row` `[m]`."""
        end = self.pos + len(x)
        for array, values in zip(self.arrays, (x, y, row)):
            array[self.pos:end] = values
        self.pos = end
        self._written(sum(a.itemsize * a[:1].size for a in self.arrays) * len(x))

    @property
    def x(self) -> np.ndarray:
        """The `[n_rows, *row_shape]` rows written so far (a writable memory map)."""
        return self.arrays[0]

    @property
    def rows(self) -> np.ndarray:
        """The `[n_rows]` source positions written so far (`row`)."""
        return self.arrays[2]

    def rewrite(self, lo: int, x: np.ndarray) -> None:
        """Replace the rows `lo .. lo + len(x)` of `x` (a pass over the written rows, such as
        scaling them in place)."""
        self.arrays[0][lo:lo + len(x)] = x
        self._written(x.nbytes)

    def _written(self, nbytes: int) -> None:
        self.unflushed += nbytes
        if self.unflushed >= FLUSH_BYTES:  # keep dirty pages bounded (see FLUSH_BYTES)
            self._wait()
            self._syncing = background.start(lambda: self._sync(_datasync))
            self.unflushed = 0

    def _sync(self, how) -> None:
        for tmp in self.tmp:
            fd = os.open(tmp, os.O_RDWR)
            try:
                how(fd)
            finally:
                os.close(fd)

    def _wait(self) -> None:
        """Wait for the background sync (raising its error, such as a full disk)."""
        syncing, self._syncing = self._syncing, None
        if syncing is not None:
            syncing()

    def commit(self) -> None:
        """Flush the files to disk and rename them into place (the folder flushed too)."""
        if self.pos != self.n_rows:
            raise RuntimeError(f"split written with {self.pos} of {self.n_rows} rows")
        self._wait()
        for array in self.arrays:
            array.flush()
        self._sync(os.fsync)
        self.arrays = []
        for tmp, final in zip(self.tmp, self.final):
            os.replace(tmp, final)
        fsync_dir(self.final[0].parent)

    def abort(self) -> None:
        """Remove the temporary files (nothing under the final names changes)."""
        try:
            self._wait()
        except OSError:
            pass  # the files go anyway
        self.arrays = []
        for tmp in self.tmp:
            tmp.unlink(missing_ok=True)

    def __enter__(self) -> "SplitWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


def write(run_dir: str | Path, split: str, x: np.ndarray, y: np.ndarray,
          row: np.ndarray) -> None:
    """Write a whole split held in memory (`SplitWriter` in one chunk)."""
    with SplitWriter(run_dir, split, len(x), x.shape[1:], x.dtype, y.dtype) as w:
        w.write(x, y, row)


def files(run_dir: str | Path, split: str) -> list[Path]:
    """The split's files that exist."""
    return [p for p in (path(run_dir, split, a) for a in ARRAYS) if p.is_file()]


def read(run_dir: str | Path, split: str) -> tuple[Any, np.ndarray, np.ndarray]:
    """`(x [n, *row_shape] read-only memory map, y [n], row [n])` of a prepared split.

    Raises:
        UsageError: the run directory holds no prepared split `split`, or a file of it is not
            an `.npy` array (named).
    """
    found = files(run_dir, split)
    if not found:
        raise UsageError(f"Run directory {run_dir} has no prepared {split} split "
                         f"({path(run_dir, split, 'x')}).")
    try:
        x = np.load(path(run_dir, split, "x"), mmap_mode="r", allow_pickle=False)
        y, row = (np.load(path(run_dir, split, a), allow_pickle=False) for a in ("y", "row"))
    except FileNotFoundError as exc:
        raise UsageError(f"Run directory {run_dir} has no prepared {split} split "
                         f"({exc.filename}).") from None
    except ValueError as exc:
        raise UsageError(f"Prepared {split} split of {run_dir} is damaged: {exc}") from None
    return x, y, row
