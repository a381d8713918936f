"""Host-side batches: each traced call's rows gathered from the (memory-mapped) split, one call ahead.

The training split lives on disk as a memory-mapped `.npy` (`ensemble.core.splitfiles`); a
traced call of `K` steps takes its batches as one `[K, n_members, batch, *row_shape]` array
gathered on the host by the members' row indices. `prefetched` gathers the next call's rows in
a background thread while the current call runs (a double buffer, as `tf.data`'s `prefetch(1)`
would): numpy's gather and TensorFlow's kernels both release the GIL, so the copy overlaps the
compute. The rows are the same whatever the gather's timing, so the members do not change.

Own code rather than a `tf.data` pipeline: the index order is computed per call by the epoch
loop (its step count adapts to the call time), and a generator-backed `tf.data.Dataset` would
add a Python round trip per element without removing the gather.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

CALL_BYTES = 64 << 20  # bytes of batch rows one traced call takes at most (x and y)
GATHER_BYTES = 2 << 20  # bytes of rows gathered at a time into a call's batch

T = TypeVar("T")
U = TypeVar("U")


class Gather:
    """Gathers batch rows of one split: `gather(idx)` with `idx` `[steps, n_members, batch]`
    int rows returns `(x [steps, n_members, batch, *row_shape], y [steps, n_members, batch])`.

    Args:
        x: `[n_rows, *row_shape]` rows (an array or a read-only `numpy.memmap`); float rows
            are fed as float32, `uint8` images as `uint8` (the step casts them).
        y: `[n_rows]` targets; fed as `y_dtype`.
        y_dtype: numpy dtype of the targets the traced call takes (the task's).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, y_dtype):
        self.x, self.y = x, np.asarray(y)
        self.x_dtype = np.uint8 if x.dtype == np.uint8 else np.float32
        self.y_dtype = np.dtype(y_dtype)

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def row_bytes(self) -> int:
        """Bytes one row takes in a call's batch (x and y)."""
        return int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(self.x_dtype).itemsize \
            + self.y_dtype.itemsize

    def max_steps(self, n_members: int, batch: int) -> int:
        """The most steps one call may take within `CALL_BYTES` (at least 1)."""
        return max(1, CALL_BYTES // max(1, n_members * batch * self.row_bytes()))

    def __call__(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat = np.asarray(idx).reshape(-1)
        # one gather, in file order: a memory map larger than the page cache is then read
        # in one forward sweep (readahead works) instead of one random page per row
        order = np.argsort(flat, kind="stable")
        xb = np.empty((len(flat), *self.row_shape), self.x_dtype)
        step = max(1, GATHER_BYTES // max(1, xb[:1].nbytes))  # rows of a block
        for lo in range(0, len(order), step):  # a block at a time: no call-sized copy
            block = order[lo:lo + step]
            xb[block] = self.x[flat[block]]
        yb = self.y[flat].astype(self.y_dtype, copy=False)
        return (xb.reshape(*idx.shape, *self.row_shape), yb.reshape(idx.shape))


def prefetched(items: Iterable[T], fn: Callable[[T], U]) -> Iterator[tuple[T, U]]:
    """`(item, fn(item))` for each of `items`, computing the next `fn(item)` in a background
    thread while the caller works on the current one. `items` is advanced one ahead (so a
    lazily computed item sees the caller's state one step late). An exception of `fn` is
    raised where its result is taken."""
    it = iter(items)
    with ThreadPoolExecutor(1, thread_name_prefix="ensemble-feed") as pool:
        try:
            item = next(it)
        except StopIteration:
            return
        future = pool.submit(fn, item)
        while True:
            nxt = next(it, _END)
            pending = pool.submit(fn, nxt) if nxt is not _END else None
            yield item, future.result()
            if pending is None:
                return
            item, future = nxt, pending


_END = object()
