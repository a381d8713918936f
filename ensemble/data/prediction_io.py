"""Streaming prediction's output side: predictions written batch by batch
(`PredictionWriter`), the next input batch read while the model runs (`prefetch`), and a C
heap that does not creep up batch after batch (`flat_heap`); `ensemble.data.stream` reads the
input.

No TensorFlow here: between-graph clients and the launcher use it too.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa

from ensemble.core import hooks
from ensemble.core.outputs import ForwardSink, table_format, writes_through
from ensemble.data.containers import Batch

MMAP_THRESHOLD = 1 << 20  # bytes: larger blocks are mapped, and unmapped when freed


def flat_heap() -> bool:
    """Keep the C heap from creeping up batch after batch (glibc only; elsewhere nothing).

    glibc raises its mmap threshold each time a large mapped block is freed (up to 32 MiB),
    after which the batches' large numpy arrays come from the heap, where the reader, model
    and writer threads fragment it: peak memory then grew with the input (1M rows: 1.28x the
    peak of 100k). A fixed threshold (`mallopt(M_MMAP_THRESHOLD)`, as the environment variable
    `MALLOC_MMAP_THRESHOLD_` sets it) gives every freed batch back to the system at once.

    Returns:
        Whether the setting applied.
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(-3, MMAP_THRESHOLD))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False


def prefetch(batches: Iterable[Batch]) -> Iterator[Batch]:
    """Yield from `batches` while the next one is read in a background thread (one batch
    ahead, so memory stays bounded): reading and scaling overlap the prediction."""
    with ThreadPoolExecutor(1, thread_name_prefix="ensemble-read") as pool:
        it = iter(batches)
        ahead = pool.submit(next, it, None)
        while (batch := ahead.result()) is not None:
            ahead = pool.submit(next, it, None)
            yield batch


class PredictionWriter:
    """Append prediction tables to `out` with one `ParquetWriter` (page checksums), or one
    `pyarrow.csv.CSVWriter` when `out` ends in `.csv` (or is a FIFO or device without a suffix,
`ensemble.core.outputs.table_format`); the file
    appears under its name only when the `with` block succeeds. Each table is written in a
    background thread while the caller computes the next (one write in flight at most).

    Args:
        metadata: Parquet key-value metadata added to every table's own (str -> str).
    """

    def __init__(self, out: str | Path, metadata: dict[str, str] | None = None):
        self.out, self.metadata = Path(out), dict(metadata or {})
        self.rows, self._writer, self._ctx, self._tmp = 0, None, None, None
        self._sink = None
        self._pool, self._pending = None, None

    def __enter__(self) -> "PredictionWriter":
        from ensemble.core.artifacts import atomic_path

        self._ctx = atomic_path(self.out, suffix=self.out.suffix or ".parquet")
        self._tmp = self._ctx.__enter__()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ensemble-write")
        return self

    def write(self, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        meta = {**(table.schema.metadata or {}),
                **{k.encode(): v.encode() for k, v in self.metadata.items()}}
        table = table.replace_schema_metadata(meta)
        if self._writer is None:
            sink = str(self._tmp)
            if writes_through(self._tmp):  # a FIFO or pipe: pyarrow must not seek it
                sink = self._sink = ForwardSink(self._tmp)
            if table_format(self.out) == "csv":
                import pyarrow.csv as pcsv

                self._writer = pcsv.CSVWriter(sink, table.schema)
            else:
                self._writer = pq.ParquetWriter(sink, table.schema, write_page_checksum=True)
        if self._pending is not None:
            self._pending.result()  # the previous write's error, if any, surfaces here
            # memory flat over any input: give the freed buffers of earlier batches back
            # (Arrow's pool keeps them otherwise, and its peak creeps up batch by batch)
            pa.default_memory_pool().release_unused()
        self._pending = self._pool.submit(self._writer.write_table, table)
        self.rows += table.num_rows

    def __exit__(self, kind, value, tb):
        failed = None
        try:
            if self._pending is not None:
                self._pending.result()
        except Exception as exc:  # a failed last write fails the whole file
            failed = exc
        finally:
            self._pool.shutdown()
            if self._writer is not None:
                self._writer.close()
            if self._sink is not None:
                self._sink.close()
        if failed is not None and kind is None:
            kind, value, tb = type(failed), failed, failed.__traceback__
        if kind is None:
            hooks.fire("write", kind="predict", path=self.out)  # complete, not yet in place
        self._ctx.__exit__(kind, value, tb)
        if failed is not None:
            raise failed
        return False
