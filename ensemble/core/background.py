"""Work in a daemon thread beside the caller's: a function (prepare hashes its source so), or
the next items of an iterator (`prefetch`: the next chunk of a pass over a source).

A daemon thread does not hold up the process's exit (on Ctrl-C, say), unlike a
`concurrent.futures` worker, whose pending work Python waits for at exit.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
JOIN_SECONDS = 10.0  # how long a closed `prefetch` waits for its producer's item in hand


def start(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Start `fn()` in a daemon thread (one that does not hold up the process's exit, on
    Ctrl-C say); returns a function that waits for its result (or raises its exception)."""
    out: dict[str, Any] = {}

    def work() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=work, name="ensemble-background", daemon=True)
    thread.start()

    def result() -> Any:
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["value"]

    return result


def prefetch(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """Iterate `items` with up to `depth` items produced ahead in a daemon thread, so that
    producing the next (a Parquet batch decoded and converted, with the GIL released in
    pyarrow and numpy) overlaps the caller's work on this one; at most `depth + 2` items
    are alive at once. An exception of `items` is raised here, where its item would have
    been; closing this iterator early (a `for` loop left by an exception) stops the
    producer before its next item and waits up to `JOIN_SECONDS` for the one in hand.
    """
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(("item", item)):
                    return
            put(("end", None))
        except BaseException as exc:  # handed to the consumer
            put(("error", exc))

    thread = threading.Thread(target=work, name="ensemble-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = ready.get()
            if kind == "item":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        stop.set()  # the producer finishes the item in hand (it may use what the caller
        thread.join(timeout=JOIN_SECONDS)  # closes next), then stops

