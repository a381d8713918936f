"""What the tasks' Parquet tables share: a prediction row's key columns, the chunking of a
split's rows, the metrics table's schema and the ensemble-size curve's loop
(docs/reference/run-directory.md); each task adds its own value columns and metrics
(`ensemble.tasks.tables`, `ensemble.tasks.regression.tables`)."""

from __future__ import annotations

from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

PRIOR = "prior"  # the baseline row's model: the training split's prior on every row


def prior_metadata(prior: list | dict | None) -> dict[bytes, bytes]:
    """`predictions.parquet` key-value metadata holding the run's prior (the baseline row of
    the metrics tables): the training split's class shares `[n_classes]`, or a regression
    target's training `{"mean", "std"}`; none when `prior` is None."""
    import json

    return {} if prior is None else {b"prior": json.dumps(prior).encode()}


def prior_of(metadata: dict | None) -> list | dict | None:
    """The prior `prior_metadata` stored, None when the file has none."""
    import json

    raw = (metadata or {}).get(b"prior")
    return None if raw is None else json.loads(raw)


class ModelRows(NamedTuple):
    """Which rows of a predictions table one `model_rows` call builds.

    Attributes:
        model: `member-<i>` or `ensemble-<aggregator>` (column `model`).
        member: the member's index, None on ensemble rows; aggregator: the aggregator's name,
            None on member rows.
        split: `train`, `validation`, `test` or `predict`.
        rows: `[n_rows]` int64 row positions in the source data set (column `source_row`).
        first_row: column `row` of the first row: the rows are `first_row..first_row+n_rows-1`,
            positions in the split (a batch of a streamed prediction starts at its offset).
    """

    model: str
    member: int | None
    aggregator: str | None
    split: str
    rows: np.ndarray
    first_row: int = 0


def key_columns(key: ModelRows) -> dict[str, pa.Array]:
    """The leading columns of `key`'s rows, in the file's order: `model`, `member`,
    `aggregator`, `split`, `row` (`source_row` comes after the task's value columns:
    `source_row`)."""
    n = len(key.rows)
    return {
        "model": pa.repeat(pa.scalar(key.model, pa.string()), n),
        "member": pa.repeat(pa.scalar(key.member, pa.int32()), n),
        "aggregator": pa.repeat(pa.scalar(key.aggregator, pa.string()), n),
        "split": pa.repeat(pa.scalar(key.split, pa.string()), n),
        "row": pa.array(np.arange(key.first_row, key.first_row + n, dtype=np.int64)),
    }


def source_row(key: ModelRows) -> pa.Array:
    """Column `source_row` of `key`'s rows: `[n_rows]` int64."""
    return pa.array(np.asarray(key.rows, np.int64))


def chunks(split: str, pred, ensembles: dict, aggregators: Sequence[str], chunk_rows: int
           ) -> Iterator[tuple[ModelRows, np.ndarray | None, np.ndarray, slice]]:
    """The chunks of a split's predictions table, model by model (members in index order,
    then `aggregators`), each model's rows in order, at most `chunk_rows` rows a chunk (one
    empty chunk for a split of no rows).

    Args:
        pred: the split's `predicted.SplitPredictions` (its `members`, `rows`, `y`,
            `first_row`); ensembles: aggregator -> `[n_rows, ...]` outputs.

    Yields:
        `(key, y, outputs, span)`: the chunk's `ModelRows`, its `[n]` targets (None when
        unknown), its model's `[n, ...]` outputs, and its `slice` of the split's rows.
    """
    n = len(pred.rows)
    spans = [slice(lo, min(n, lo + chunk_rows)) for lo in range(0, n, chunk_rows)]
    models = [(f"member-{i}", i, None, o) for i, o in sorted(pred.members.items())]
    models += [(f"ensemble-{a}", None, a, ensembles[a]) for a in aggregators]
    for model, member, aggregator, outputs in models:
        for span in spans or [slice(0, 0)]:
            key = ModelRows(model, member, aggregator, split, pred.rows[span],
                            pred.first_row + span.start)
            yield (key, None if pred.y is None else pred.y[span], outputs[span], span)


def metrics_schema(metrics: Sequence[str], ensemble_columns: Sequence[str],
                   gain_metrics: Sequence[str]) -> tuple[tuple[str, ...], pa.Schema]:
    """`(gain columns, schema)` of a task's `metrics.parquet`: `model`, `member`, `aggregator`,
    `split`, `n`, the `metrics`, the float64 `ensemble_columns` (ensemble rows' extras),
    `best_member`, then `gain_vs_{mean,best}_<metric>` of each of `gain_metrics`."""
    gains = tuple(f"gain_vs_{ref}_{m}" for ref in ("mean", "best") for m in gain_metrics)
    return gains, pa.schema(
        [("model", pa.string()), ("member", pa.int32()), ("aggregator", pa.string()),
         ("split", pa.string()), ("n", pa.int64())]
        + [(m, pa.float64()) for m in (*metrics, *ensemble_columns)]
        + [("best_member", pa.int32())] + [(g, pa.float64()) for g in gains])


def size_table(member_outputs: dict[str, np.ndarray], greedy_order: Sequence[int] | None,
               scores: Callable[[str, np.ndarray, list[int]], Iterator[dict]],
               metrics: Sequence[str]) -> pa.Table:
    """The ensemble-size curve of a task: one row per split, order and `k`.

    Args:
        member_outputs: split -> `[n_members, n_rows, ...]` the members' outputs (index
            order; arrays or memory maps, which `scores` reads).
        greedy_order: member positions in the order greedy selection picked them (order
            `greedy`, with replacement); order `first` is the members in index order.
        scores: `scores(split, stacked, order)` yields the metrics `{name: value}` of the
            ensemble of the first k members of `order`, k = 1..len(order) (the task's).
        metrics: the metric names, the table's float64 columns after `member_added`.
    """
    out = []
    for split, stacked in member_outputs.items():  # an array or memory map, as it is
        orders = {"first": list(range(len(stacked)))}
        if greedy_order:
            orders["greedy"] = list(greedy_order)
        for name, order in orders.items():
            for k, row in enumerate(scores(split, stacked, order), start=1):
                out.append({"order": name, "k": k, "split": split,
                            "member_added": int(order[k - 1]), **row})
    schema = pa.schema([("order", pa.string()), ("k", pa.int32()), ("split", pa.string()),
                        ("member_added", pa.int32())]
                       + [(m, pa.float64()) for m in metrics])
    return pa.Table.from_pylist(out, schema=schema)
