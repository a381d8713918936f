"""The cost model of `ensemble compare`: the marginal seconds of one more epoch of a trained
run, from its `history.parquet` rows (`member`, `epoch`, `seconds`) and its manifest's
`timings`. Each mode picks its formula (`Mode.epoch_seconds` in
`ensemble.replication.modes`): members in one graph, or in queues that run at once.

The first epoch also pays for tracing, so it is left out; a member of one epoch in a run of
more (one that diverged or stopped in its first) falls back on its steady-state rate (rows
per second of its traced calls) times the training rows. A run of one epoch has no
per-epoch cost (`pipelines.compare_cost.epoch_seconds`).
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence


def epochs_after_first(history: Sequence[dict], member: int | None = None) -> list[float]:
    """Seconds of the epochs after each member's first (`member`: that member's only); the
    first also pays for tracing. Records of one epoch count once (their largest `seconds`:
    in-graph every member's record of an epoch holds the same seconds)."""
    rows = [r for r in history if member is None or r["member"] == member]
    first = min((r["epoch"] for r in rows), default=0)
    by_epoch: dict = {}
    for r in rows:
        if r["epoch"] > first:
            by_epoch[r["epoch"]] = max(by_epoch.get(r["epoch"], 0.0), float(r["seconds"]))
    return list(by_epoch.values())


def queued_epoch_seconds(history: Sequence[dict], timings: dict, n_train: int,
                         default_queue: Callable[[int], Any]) -> float | None:
    """Seconds of one more epoch when members train one after another within a queue
    (`timings.clients[<member>].client`, else `default_queue(member)`) and queues run at
    once: the slowest queue's sum of its members' epoch seconds (`Mode.epoch_seconds`). A
    member's epoch: its median epoch after its first (or, with one epoch, its steady rate in
    `timings.clients[<member>].steady` times `n_train` rows); None when a member has neither."""
    clients = timings.get("clients") or {}
    queues: dict = {}
    for member in sorted({r["member"] for r in history}):
        entry = clients.get(str(member), {})
        later = epochs_after_first(history, member)
        if later:
            cost = statistics.median(later)
        else:
            rows, secs = (entry.get("steady") or {}).get(str(member), (0, 0.0))
            cost = n_train * secs / rows if rows else None
        if cost is None:
            return None
        queue = entry.get("client", default_queue(member))
        queues[queue] = queues.get(queue, 0.0) + cost
    return max(queues.values()) if queues else None


def one_graph_epoch_seconds(history: Sequence[dict], timings: dict, n_train: int
                            ) -> float | None:
    """Seconds of one more epoch when one graph trains every member (in-graph): the median
    epoch after the first, or with one epoch the steady rate (`timings.steady_rows`,
    `steady_seconds`) times `n_train`; None without either."""
    later = epochs_after_first(history)
    if later:
        return statistics.median(later)
    rows, seconds = timings.get("steady_rows", 0), timings.get("steady_seconds", 0.0)
    return n_train * seconds / rows if rows else None
