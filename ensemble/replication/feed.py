"""Host-side batches: each traced call's rows gathered from the (memory-mapped) split, one call ahead.

The training split lives on disk as a memory-mapped `.npy` (`ensemble.core.splitfiles`); a
traced call of `K` steps takes its batches as one `[n_members, K, batch, *row_shape]` array
gathered on the host by the members' row indices (member-major: member `k`'s rows of the call
are one contiguous block, which the traced call takes as a view, not a copy). `prefetched`
gathers the next call's rows in a background thread while the current call runs (a double
buffer, as `tf.data`'s `prefetch(1)` would): numpy's gather and TensorFlow's kernels both
release the GIL, so the copy overlaps the compute. The rows are the same whatever the gather's
timing, so the members do not change.

The gathered rows are the only copy of a call's batch: `Gather` writes them into one of two
buffers it keeps (aligned to 64 bytes, made once at the largest call's size with their pages
filled in, so that no call touches fresh memory), and `to_tensor` hands such a buffer to
TensorFlow without a copy (DLPack). `tf.constant` would copy it once more on the calling
thread, while the devices wait.

Own code rather than a `tf.data` pipeline: the index order is computed per call by the epoch
loop (its step count adapts to the call time), and a generator-backed `tf.data.Dataset` would
add a Python round trip per element without removing the gather.
"""

from __future__ import annotations

import mmap
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

from ensemble.core import memory

CALL_BYTES = 64 << 20  # bytes of batch rows one traced call takes at most (x and y)
GATHER_BYTES = 2 << 20  # bytes of rows gathered at a time into a call's batch
ALIGN = 64  # bytes: TensorFlow's kernels need tensor data aligned to this (Eigen's widest)
SLOTS = 2  # buffers a `Gather` cycles through: the call running and the next one

T = TypeVar("T")
U = TypeVar("U")


class Gather:
    """Gathers batch rows of one split: `gather(idx)` with `idx` `[n_members, steps, batch]`
    int rows (any shape) returns `(x [*idx.shape, *row_shape], y [*idx.shape])`.

    The returned arrays are views of buffers the `Gather` reuses: they stay valid until
    `SLOTS` (2) further gathers, which is what `prefetched` (one call ahead) needs; copy them
    to keep them longer.

    Args:
        x: `[n_rows, *row_shape]` rows (an array or a read-only `numpy.memmap`); float rows
            are fed as float32, `uint8` images as `uint8` (the step casts them).
        y: `[n_rows]` targets; fed as `y_dtype`.
        y_dtype: numpy dtype of the targets the traced call takes (the task's).

    Attributes:
        call_rows: the most rows one call gathers (0 until `plan_calls`): the buffers are
            made this large at their first use, so that the growing calls of the first epoch
            do not allocate (and fault in) new memory each time.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, y_dtype):
        self.x, self.y = x, np.asarray(y)
        self.call_rows = 0
        self.x_dtype = np.uint8 if x.dtype == np.uint8 else np.float32
        self.y_dtype = np.dtype(y_dtype)
        room, _ = memory.available()
        # rows that stay in memory (an array, or a map of at most half the memory: the page
        # cache keeps it after the first epoch) are taken in one pass; a larger map in file
        # order, so that each call reads it in one forward sweep
        self.in_file_order = isinstance(x, np.memmap) and (room is None or x.nbytes > room // 2)
        self._slots: list[list[np.ndarray | None]] = [[None, None] for _ in range(SLOTS)]
        self._turn = 0

    def _buffer(self, part: int, shape: tuple, dtype) -> np.ndarray:
        """An `ALIGN`-aligned, C-contiguous `[*shape]` array in this turn's slot (`part` 0: x,
        1: y), reusing the slot's memory when it is large enough.

        The memory is an anonymous map of its own, its pages filled in when it is made
        (`MAP_POPULATE`): touched one by one beside training, a 66 MB call's fresh pages took
        150 ms of system time (15 us a page fault on a virtual machine), and NumPy's own
        large arrays ask for huge pages, whose first touch may wait for the kernel to compact
        memory (250 ms for the same call)."""
        row = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
        nbytes = shape[0] * row
        slot = self._slots[self._turn]
        raw = slot[part]
        if raw is None or len(raw) < nbytes + ALIGN:
            size = max(nbytes, self.call_rows * row) + ALIGN
            slot[part] = raw = _filled_in(size)
        start = -raw.ctypes.data % ALIGN
        return raw[start:start + nbytes].view(dtype).reshape(shape)

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def row_bytes(self) -> int:
        """Bytes one row takes in a call's batch (x and y)."""
        return int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(self.x_dtype).itemsize \
            + self.y_dtype.itemsize

    def plan_calls(self, n_members: int, batch: int, n_steps: int | None = None) -> int:
        """The most steps one call may take within `CALL_BYTES` (at least 1; at most an
        epoch's `n_steps` when given), and the size the buffers are made at (`call_rows`)."""
        steps = max(1, CALL_BYTES // max(1, n_members * batch * self.row_bytes()))
        steps = min(steps, n_steps) if n_steps else steps
        self.call_rows = n_members * batch * steps
        return steps

    def __call__(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(idx)
        # `[n_members, rows]`: a view when each member's rows are one block (as the loop's are)
        rows = idx.reshape(len(idx), int(np.prod(idx.shape[1:], dtype=np.int64)))
        self._turn = (self._turn + 1) % SLOTS
        xb = self._buffer(0, (idx.size, *self.row_shape), self.x_dtype)
        out = xb.reshape(*rows.shape, *self.row_shape)
        if not self.in_file_order and self.x.dtype == self.x_dtype:
            for k in range(len(rows)):  # member by member: small index temporaries; "clip"
                np.take(self.x, rows[k], axis=0, out=out[k], mode="clip")  # (no out buffer)
        elif not self.in_file_order:
            for k in range(len(rows)):
                out[k] = self.x[rows[k]]  # float64 rows, fed as float32
        else:  # a block of rows at a time (no call-sized temporary), in file order
            flat = rows.reshape(-1)
            order = np.argsort(flat, kind="stable")
            step = max(1, GATHER_BYTES // max(1, xb[:1].nbytes))
            for lo in range(0, len(order), step):
                block = order[lo:lo + step]
                xb[block] = self.x[flat[block]]
        yb = self._buffer(1, (idx.size,), self.y_dtype).reshape(rows.shape)
        for k in range(len(rows)):
            yb[k] = self.y[rows[k]]
        return (xb.reshape(*idx.shape, *self.row_shape), yb.reshape(idx.shape))


def _filled_in(size: int) -> np.ndarray:
    """`size` bytes of fresh memory, its pages filled in now where the system can (Linux's
    `MAP_POPULATE`; elsewhere an ordinary array)."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):  # Windows
        return np.empty(size, np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, size, flags=flags), np.uint8)


def to_tensor(a: np.ndarray):
    """`a` as a TensorFlow tensor on the host: without a copy (DLPack) when `a` is
    C-contiguous, writeable (NumPy exports no read-only array) and `ALIGN`-aligned, as
    `Gather`'s batches are; else copied (`tf.constant`).
    A tensor made without a copy reads `a`'s memory: `a` must not change while it is used."""
    import tensorflow as tf

    if a.flags.c_contiguous and a.flags.writeable and a.ctypes.data % ALIGN == 0 and a.size:
        return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
    return tf.constant(a)


def prefetched(items: Iterable[T], fn: Callable[[T], U]) -> Iterator[tuple[T, U]]:
    """`(item, fn(item))` for each of `items`, taking the next item and computing its
    `fn(item)` in a background thread while the caller works on the current one. `items` is
    advanced one ahead, in that thread (so a lazily computed item sees the caller's state one
    step late, and the caller's thread never waits for it). An exception of `items` or `fn`
    is raised where its result is taken."""
    it = iter(items)

    def produce():
        item = next(it, _END)
        return item, (None if item is _END else fn(item))

    with ThreadPoolExecutor(1, thread_name_prefix="ensemble-feed") as pool:
        future = pool.submit(produce)
        while True:
            item, value = future.result()
            if item is _END:
                return
            future = pool.submit(produce)
            yield item, value


_END = object()
