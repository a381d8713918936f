"""The prepared splits on disk: one memory-mappable `.npy` per array, written chunk by chunk.

A run keeps each split (`train`, `validation`, `test`) as three files under `data/`:
`<split>.x.npy` (`[n, *row_shape]` float32 scaled rows, or uint8 images), `<split>.y.npy`
(`[n]` encoded targets) and `<split>.row.npy` (`[n]` int64 row positions in the source). They
are written as `.npy` files (a header, then the rows appended) under temporary names, so a
split larger than memory is written a chunk of rows at a time, then flushed and renamed into
place together; they are read with `numpy.load(mmap_mode="r")`, so training gathers its batches from the page
cache and no process holds a split in memory.
"""

from __future__ import annotations

import errno
import hashlib
import io
import math
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
        dtypes: `(x dtype, y dtype)`: of the rows and of the encoded targets.
        rewrite: the rows will be rewritten in place from the first (`rewrite`).

    Use `write` in row order, then `commit` (flush, fsync, rename all three into place); on
    an error `abort` removes the temporary files. Also a context manager doing just that.
    The files are `.npy` headers followed by rows appended with `os.write` (five times faster
    than storing into a fresh memory map, which takes a page fault per 4 KiB; the files are
    the same bytes as `numpy.save`'s). Every `FLUSH_BYTES` written, they are synced to disk
    in a background thread. Each file's sha256 is computed from the bytes as they are
    written (`sha256s`), so the run's artifact hashes need no second read; with `rewrite`,
    `x` is hashed as it is rewritten from its first row on instead.

    Raises:
        OSError: the files cannot be created (a full disk).
    """

    def __init__(self, run_dir: str | Path, split: str, n_rows: int, row_shape, dtypes,
                 rewrite: bool = False):
        from numpy.lib import format as npy

        self._syncing = None  # the background sync's result function (`background.start`)
        self.final = [path(run_dir, split, a) for a in ARRAYS]
        self.final[0].parent.mkdir(parents=True, exist_ok=True)
        self.tmp = [p.with_name(f".{p.name}.{os.getpid()}.tmp") for p in self.final]
        self.shapes = [tuple(row_shape), (), ()]
        self.dtypes = [np.dtype(t) for t in (*dtypes, np.int64)]
        self.row_bytes = [d.itemsize * math.prod(s) for d, s in zip(self.dtypes, self.shapes)]
        self.fds: list[int] = []
        self.headers: list[bytes] = []  # each file's `.npy` header (its data starts after)
        self._hashes: list = []  # [sha256 of the bytes so far, or None, bytes it covers]
        try:
            for tmp, shape, dtype in zip(self.tmp, self.shapes, self.dtypes):
                self.fds.append(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
                header = io.BytesIO()
                npy.write_array_header_1_0(header, {  # as `numpy.save` and `open_memmap`
                    "descr": npy.dtype_to_descr(dtype), "fortran_order": False,
                    "shape": (n_rows, *shape)})
                self.headers.append(header.getvalue())
                _write_all(self.fds[-1], _bytes(self.headers[-1]))
                self._hashes.append([hashlib.sha256(self.headers[-1]), len(self.headers[-1])])
            if rewrite:  # the rows written first are not the file's: hashed when rewritten
                self._hashes[0][0] = None
        except BaseException:
            self.abort()
            raise
        self.n_rows, self.pos, self.unflushed = n_rows, 0, 0

    def write(self, x: np.ndarray, y: np.ndarray, row: np.ndarray) -> None:
        """Append rows: `x` `[m, *row_shape]`, `y` `[m]`, `row` `[m]` (cast to the files'
        dtypes).

        Raises:
            ValueError: more rows than the split holds, or arrays of other shapes.
        """
        if self.pos + len(x) > self.n_rows:
            raise ValueError(f"{self.pos + len(x)} rows written to a split of {self.n_rows}")
        arrays = [self._checked(i, v, len(x)) for i, v in enumerate((x, y, row))]
        if not len(x):
            return
        for i, values in enumerate(arrays):
            at = len(self.headers[i]) + self.pos * self.row_bytes[i]
            _write_all(self.fds[i], _bytes(values))
            self._hash(i, values, at)
        self.pos += len(x)
        self._written(sum(self.row_bytes) * len(x))

    def _checked(self, i: int, values, n: int) -> np.ndarray:
        values = np.ascontiguousarray(values, self.dtypes[i])
        if values.shape != (n, *self.shapes[i]):
            raise ValueError(f"{ARRAYS[i]} of shape {values.shape} written to a split of "
                             f"rows {self.shapes[i]} ({n} rows)")
        return values

    def read(self, lo: int, hi: int, array: str = "x", out: np.ndarray | None = None
             ) -> np.ndarray:
        """Rows `lo .. hi` of `array` (`"x"`, `"y"` or `"row"`) written so far (a copy), read
        into the first rows of `out` when given (an array of the file's dtype and row shape
        with at least that many rows: a pass over a split reuses one buffer rather than
        fault in fresh pages every chunk)."""
        i = ARRAYS.index(array)
        hi = min(hi, self.pos)
        shape = (max(hi - lo, 0), *self.shapes[i])
        if out is None:
            out = np.empty(shape, self.dtypes[i])
        elif (out.dtype != self.dtypes[i] or out.shape[1:] != shape[1:] or len(out) < shape[0]
              or not out.flags.c_contiguous):
            raise ValueError(f"read {shape} {self.dtypes[i]} rows into an array "
                             f"{out.shape} {out.dtype}")
        else:
            out = out[:shape[0]]
        buf, at = _bytes(out), len(self.headers[i]) + lo * self.row_bytes[i]
        while len(buf):
            n = os.preadv(self.fds[i], [buf], at)
            if n <= 0:
                raise OSError(errno.EIO, f"short read of {self.tmp[i]} at byte {at}")
            buf, at = buf[n:], at + n
        return out

    def rewrite(self, lo: int, x: np.ndarray) -> None:
        """Replace the rows `lo .. lo + len(x)` of `x` (a pass over the written rows, such as
        scaling them in place).

        Raises:
            ValueError: rows beyond those written, or of another shape.
        """
        x = self._checked(0, x, len(x))
        if lo < 0 or lo + len(x) > self.pos:
            raise ValueError(f"rows {lo}..{lo + len(x)} rewritten; {self.pos} are written")
        at = len(self.headers[0]) + lo * self.row_bytes[0]
        _write_all(self.fds[0], _bytes(x), at)
        if lo == 0:  # a pass over the rows from the first: the file's bytes hashed anew
            self._hashes[0] = [hashlib.sha256(self.headers[0]), len(self.headers[0])]
        self._hash(0, x, at)
        self._written(x.nbytes)

    def _hash(self, i: int, values: np.ndarray, at: int) -> None:
        """Extend file i's running hash with `values`, written at byte `at` (a write out of
        order leaves the file to be hashed from disk)."""
        h, covered = self._hashes[i]
        if h is not None and at == covered:
            h.update(_bytes(values))  # (releases the GIL)
            self._hashes[i][1] = covered + values.nbytes
        elif values.nbytes:
            self._hashes[i][0] = None

    def sha256s(self) -> dict[Path, str]:
        """`{final path: hex sha256}` of the files whose every byte was hashed in order as
        written (all of them, written in order); a file written otherwise is left out, for
        `artifacts.artifact_hashes` to read."""
        return {self.final[i]: h.hexdigest() for i, (h, covered) in enumerate(self._hashes)
                if h is not None
                and covered == len(self.headers[i]) + self.n_rows * self.row_bytes[i]}

    def _written(self, nbytes: int) -> None:
        self.unflushed += nbytes
        if self.unflushed >= FLUSH_BYTES:  # keep dirty pages bounded (see FLUSH_BYTES)
            self._wait()
            self._syncing = background.start(lambda: self._sync(_datasync))
            self.unflushed = 0

    def _sync(self, how) -> None:
        for fd in self.fds:
            how(fd)

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
        self._sync(os.fsync)
        self._close()
        for tmp, final in zip(self.tmp, self.final):
            os.replace(tmp, final)
        fsync_dir(self.final[0].parent)

    def abort(self) -> None:
        """Remove the temporary files (nothing under the final names changes)."""
        try:
            self._wait()
        except OSError:
            pass  # the files go anyway
        finally:
            self._close()
            for tmp in self.tmp:
                tmp.unlink(missing_ok=True)

    def _close(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> "SplitWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            try:
                self.commit()
                return
            except BaseException:  # a full disk at the last sync: nothing is left behind
                self.abort()
                raise
        self.abort()


def write(run_dir: str | Path, split: str, x: np.ndarray, y: np.ndarray,
          row: np.ndarray) -> None:
    """Write a whole split held in memory (`SplitWriter` in one chunk)."""
    with SplitWriter(run_dir, split, len(x), x.shape[1:], (x.dtype, y.dtype)) as w:
        w.write(x, y, row)


def files(run_dir: str | Path, split: str) -> list[Path]:
    """The split's files that exist."""
    return [p for p in (path(run_dir, split, a) for a in ARRAYS) if p.is_file()]


def read(run_dir: str | Path, split: str) -> tuple[Any, np.ndarray, np.ndarray]:
    """`(x [n, *row_shape], y [n], row [n])` of a prepared split, read-only memory maps
    (a run holds none of a split's columns in its own memory: the page cache does).

    Raises:
        UsageError: the run directory holds no prepared split `split`, or a file of it is not
            an `.npy` array (named).
    """
    found = files(run_dir, split)
    if not found:
        raise UsageError(f"Run directory {run_dir} has no prepared {split} split "
                         f"({path(run_dir, split, 'x')}).")
    try:
        x, y, row = (np.load(path(run_dir, split, a), mmap_mode="r", allow_pickle=False)
                     for a in ("x", "y", "row"))
    except FileNotFoundError as exc:
        raise UsageError(f"Run directory {run_dir} has no prepared {split} split "
                         f"({exc.filename}).") from None
    except ValueError as exc:
        raise UsageError(f"Prepared {split} split of {run_dir} is damaged: {exc}") from None
    return x, y, row


def _bytes(values) -> memoryview:
    """The bytes of a C-contiguous array (any shape, empty ones too) or of `bytes`."""
    return memoryview(np.frombuffer(values, np.uint8) if isinstance(values, bytes)
                      else values.reshape(-1).view(np.uint8))


def _write_all(fd: int, data: memoryview, at: int | None = None) -> None:
    """Write every byte of `data` to `fd` (at its position, or at byte `at`)."""
    while len(data):
        n = os.write(fd, data) if at is None else os.pwrite(fd, data, at)
        if n <= 0:
            raise OSError(errno.EIO, f"nothing written to descriptor {fd}")
        data = data[n:]
        at = None if at is None else at + n
