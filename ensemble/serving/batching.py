"""Dynamic batching over replicas: requests merged into batches, run by the first idle replica.

As TF Serving's batching: a request joins the newest open batch of its kind (same signature,
same per-row input shapes and dtypes) while the batch has room (`max_batch_size` rows); a
batch is ready when full or `batch_timeout` seconds after it opened, and the first idle replica
takes the oldest ready batch, runs it as one call and splits the outputs back by rows. While
every replica is busy, open batches keep filling, so a loaded server batches even with a zero
timeout, and an idle one adds no latency. `max_batch_size=1` turns batching off (every request
is its own call; a request of several rows is never split).

Replicas are plain callables `run(signature, inputs) -> outputs` (`{name: array}`, batch
first), one worker thread each; TensorFlow releases the GIL while it computes, so replicas on
several devices (or logical CPU devices) run at once. No TensorFlow import here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

import numpy as np


class Closed(RuntimeError):
    """The batcher was closed (its version retired): resubmit to the current version."""


class _Batch:
    __slots__ = ("key", "signature", "items", "rows", "deadline", "batchable", "taken")

    def __init__(self, key, signature, batchable: bool, deadline: float):
        self.key, self.signature, self.batchable = key, signature, batchable
        self.items: list[tuple[dict, int, Future]] = []
        self.rows, self.deadline, self.taken = 0, deadline, False


class Batcher:
    """Queue of request batches served by one worker thread per replica.

    Args:
        replicas: one callable per replica, `run(signature: str, inputs: {name: array}) ->
            {name: array}`; arrays batch first.
        max_batch_size: rows per merged batch (>= 1; 1: no batching).
        batch_timeout: seconds an open batch waits for more rows when a replica is idle.
        on_batch: called with the rows of every call run (metrics), optional.
    """

    def __init__(self, replicas: list[Callable], max_batch_size: int = 64,
                 batch_timeout: float = 0.0, on_batch: Callable[[int], None] | None = None):
        if max_batch_size < 1:
            raise ValueError(f"Expected `max_batch_size` >= 1. Received: {max_batch_size!r}")
        self.max_batch_size, self.batch_timeout = max_batch_size, max(0.0, batch_timeout)
        self._on_batch = on_batch
        self._cond = threading.Condition()
        self._queue: deque[_Batch] = deque()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, args=(run,), daemon=True,
                                          name=f"replica-{i}") for i, run in enumerate(replicas)]
        for t in self._threads:
            t.start()

    def submit(self, signature: str, inputs: dict, batchable: bool = True) -> Future:
        """Queue one request; its Future gives its outputs `{name: array}` (its own rows).

        Args:
            inputs: `{name: array}`, batch first with the same row count in every input.
            batchable: False to run the request alone (a signature that is not batch first).

        Raises:
            Closed: the batcher no longer takes requests.
        """
        rows = next(iter(inputs.values())).shape[0] if inputs and batchable else 0
        key = (signature, tuple((n, a.dtype.str, a.shape[1:]) for n, a in sorted(inputs.items())))
        merge = batchable and self.max_batch_size > 1 and rows <= self.max_batch_size
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise Closed("this model version is no longer served")
            batch = None
            if merge:
                for b in reversed(self._queue):
                    if b.key == key and b.batchable and b.rows + rows <= self.max_batch_size:
                        batch = b
                        break
            if batch is None:
                batch = _Batch(key, signature, merge, time.monotonic() + self.batch_timeout)
                self._queue.append(batch)
            batch.items.append((inputs, rows, fut))
            batch.rows += rows
            self._cond.notify()
        return fut

    def _ready(self, b: _Batch, now: float) -> bool:
        return (self._closed or not b.batchable or b.rows >= self.max_batch_size
                or now >= b.deadline)

    def _next(self) -> _Batch | None:
        with self._cond:
            while True:
                now = time.monotonic()
                for b in self._queue:
                    if self._ready(b, now):
                        self._queue.remove(b)
                        return b
                if self._closed and not self._queue:
                    return None
                wait = min((b.deadline for b in self._queue), default=now + 3600) - now
                self._cond.wait(max(wait, 0.0005))

    def _work(self, run: Callable) -> None:
        while (batch := self._next()) is not None:
            try:
                self._run(run, batch)
            except BaseException as exc:  # never lose a worker; every waiter gets an answer
                for _, _, fut in batch.items:
                    if not fut.done():
                        fut.set_exception(exc)

    def _run(self, run: Callable, batch: _Batch) -> None:
        items = batch.items
        if len(items) == 1:
            self._call(run, batch.signature, items[0][0], [items[0]])
            return
        names = list(items[0][0])
        merged = {n: np.concatenate([inp[n] for inp, _, _ in items]) for n in names}
        try:
            self._call(run, batch.signature, merged, items)
        except Exception:  # one bad request must not fail its batch mates: run them alone
            for item in items:
                if not item[2].done():
                    try:
                        self._call(run, batch.signature, item[0], [item])
                    except Exception as exc:
                        item[2].set_exception(exc)

    def _call(self, run: Callable, signature: str, inputs: dict, items: list) -> None:
        outputs = run(signature, inputs)
        if self._on_batch:
            self._on_batch(sum(r for _, r, _ in items) or 1)
        if len(items) == 1:
            items[0][2].set_result(outputs)
            return
        lo = 0
        for _, rows, fut in items:
            fut.set_result({n: v[lo:lo + rows] for n, v in outputs.items()})
            lo += rows

    def close(self, wait: bool = True) -> None:
        """Take no more requests; the queued ones still run. With `wait`, return when the
        workers have finished them."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()
