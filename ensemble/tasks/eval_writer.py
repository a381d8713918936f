"""A run's evaluation tables written from the arrays it predicted, with flat memory.

`predictions.parquet` holds one row per model, split and row (members and every aggregator): for
a split of 800,000 rows and 8 models, 6.4 million rows, about 0.7 GB as one Arrow table. The
writer here never builds it whole: the rows go to one `ParquetWriter` a chunk at a time, model
by model in `predictions_table`'s order (the file is the one `predictions_table` would give),
and the metrics are computed from the arrays themselves (`metrics_tables.split_outputs`,
`metrics_tables.metrics_of`; the regression twins), which is what `metrics_table` reads back
from those rows. What stays in memory is the predicted arrays, `[n_members + n_aggregators, n_rows,
n_outputs]` float32 per split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa

from ensemble.core import artifacts
from ensemble.tasks.predicted import SplitPredictions

CHUNK_ROWS = 65536  # rows of one model built and written at a time

__all__ = ["CHUNK_ROWS", "SplitPredictions", "write"]


def write(run_dir: str | Path, splits: dict[str, SplitPredictions], classes: np.ndarray,
          aggregators: Sequence[str], params: dict | None, meta: dict | None = None
          ) -> pa.Table:
    """Write `predictions.parquet` (streamed) and `metrics.parquet` of a run, each atomically;
    returns the metrics table (`metrics_tables.metrics_table`'s rows).

    Args:
        splits: split -> its predictions; `ensembles` None: the numpy aggregators' outputs
            of the members, computed here.
        classes: `[n_classes]` class labels; empty for regression.
        aggregators: the aggregators whose rows the tables hold, in order.
        params: the fitted aggregators' parameters (`aggregators.json`).
        meta: more key-value metadata of `predictions.parquet` (bytes to bytes).

    Raises:
        OSError: a file cannot be written (nothing under the final names changes).
    """
    run_dir = Path(run_dir)
    chunks, task_meta, metrics = _task_tables(splits, classes, aggregators, params)
    with artifacts.atomic_path(run_dir / artifacts.PREDICTIONS) as tmp:
        _write_chunks(tmp, chunks, {**task_meta, **(meta or {})})
    artifacts.write_parquet(run_dir / artifacts.METRICS, metrics)
    return metrics


def _task_tables(splits, classes, aggregators, params):
    """(the prediction chunks, the file's metadata, the metrics table) of the run's task."""
    splits = {s: p if p.ensembles is not None else p._replace(
        ensembles=_aggregated(p.members, classes, aggregators, params))
        for s, p in splits.items()}
    if len(classes):
        from ensemble.tasks import metrics_tables as MT
        from ensemble.tasks import tables as T

        chunks = (t for s, p in splits.items() for t in T.prediction_chunks(
            s, p, classes, aggregators, params, CHUNK_ROWS))
        metrics = MT.metrics_of({s: MT.split_outputs(p.members, p.y, aggregators,
                                                     p.ensembles, params)
                                 for s, p in splits.items()})
        return chunks, T.classes_metadata(classes), metrics
    import json

    from ensemble.tasks.regression import tables as regression_tables

    n_members = len(next(iter(splits.values())).members) if splits else 0
    meta = regression_tables.metadata(params, aggregators, n_members)
    chunks = (t for s, p in splits.items() for t in regression_tables.prediction_chunks(
        s, p, aggregators, params, CHUNK_ROWS))
    outputs = {s: regression_tables.split_outputs(p.members, p.y, aggregators, p.ensembles)
               for s, p in splits.items()}
    metrics = regression_tables.metrics_of(outputs, json.loads(meta[b"mixture"]))
    return chunks, meta, metrics


def _aggregated(members: dict, classes, aggregators, params) -> dict:
    """The numpy aggregators' outputs `{name: [n_rows, n_outputs]}` of `members`."""
    if len(classes):
        from ensemble.tasks.classification.aggregators import aggregate
    else:
        from ensemble.tasks.regression.aggregators import aggregate
    stacked = np.stack([o for _, o in sorted(members.items())])
    return {a: aggregate(stacked, a, (params or {}).get(a)) for a in aggregators}


def _write_chunks(path: Path, chunks, meta: dict) -> None:
    """Append the tables `chunks` to one Parquet file at `path` (page checksums), with the
    key-value metadata `meta`."""
    import pyarrow.parquet as pq

    writer = None
    try:
        for t in chunks:
            t = t.replace_schema_metadata(meta)
            if writer is None:
                writer = pq.ParquetWriter(path, t.schema, write_page_checksum=True)
            writer.write_table(t)
    finally:
        if writer is not None:
            writer.close()
