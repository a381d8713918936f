"""The Parquet tables of a run: predictions, metrics and history (docs/reference/run-directory.md).

Both replication modes and the aggregator build their tables here, so the schema is the same
whichever mode wrote them; the metrics tables' rows are computed in
`ensemble.tasks.metrics_tables`.
"""

from __future__ import annotations

import json
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from ensemble.tasks.classification import metrics as M
from ensemble.tasks.classification import threshold as decision
from ensemble.tasks.classification.aggregators import aggregate, member_weights
from ensemble.core.notices import notice
from ensemble.tasks.metrics_tables import NOT_PROBABILITIES
from ensemble.tasks.predicted import SplitPredictions
from ensemble.tasks.table_parts import ModelRows, chunks, key_columns, source_row

UNCERTAINTY = ("entropy", "expected_entropy", "mutual_information")


def _label_type(classes: np.ndarray) -> pa.DataType:
    kind = np.asarray(classes).dtype.kind
    return pa.string() if kind in "USO" else pa.bool_() if kind == "b" else pa.int64()


def classes_metadata(classes: np.ndarray) -> dict[bytes, bytes]:
    """Parquet key-value metadata holding the class list."""
    return {b"classes": json.dumps(np.asarray(classes).tolist()).encode()}


def classes_from(table: pa.Table) -> np.ndarray:
    """The class list stored in a predictions table's metadata."""
    return np.asarray(json.loads(table.schema.metadata[b"classes"]))


def model_rows(key: ModelRows, y_true: np.ndarray | None, probs: np.ndarray,
               classes: np.ndarray, uncertainty: dict | None = None,
               threshold: float | None = None) -> pa.Table:
    """Prediction rows of one model on one split, every column built by Arrow from numpy
    (no Python object per row).

    Args:
        key: the model, split and rows (`table_parts.ModelRows`: columns `model`, `member`,
            `aggregator`, `split`, `row` and `source_row`).
        y_true: `[n_rows]` int class indices (-1: a label the run never saw), or None when
            the labels are unknown.
        probs: `[n_rows, n_classes]` probabilities.
        classes: `[n_classes]` sorted class labels (int or str).
        uncertainty: ensemble rows: `{"entropy", "expected_entropy", "mutual_information"}`
            arrays `[n_rows]` (`ensemble.tasks.classification.metrics.uncertainty`); null when None.
        threshold: a binary run's decision threshold: `y_pred` is the positive class where
            `probs[:, 1] >= threshold` (`ensemble.tasks.classification.threshold`); the
            argmax when None.
    """
    n = len(key.rows)
    classes = np.asarray(classes)
    label = _label_type(classes)
    labels = pa.array(classes, label)
    cols = key_columns(key)
    if y_true is None:
        cols["y_true"] = pa.nulls(n, label)
    else:  # a label the run never saw (`labels.encode_known`: -1): null
        y_true = np.asarray(y_true, np.int64)
        cols["y_true"] = labels.take(pa.array(y_true, mask=y_true < 0))
    cols["y_pred"] = labels.take(pa.array(decision.labels(probs, threshold)))
    cols["source_row"] = source_row(key)
    for c, name in enumerate(classes.tolist()):
        cols[f"p_{name}"] = pa.array(np.asarray(probs[:, c], np.float32))
    for name in UNCERTAINTY:
        cols[name] = (pa.nulls(n, pa.float64()) if uncertainty is None
                      else pa.array(np.asarray(uncertainty[name], np.float64)))
    return pa.table(cols)


def predictions_table(split: str, pred: SplitPredictions, classes: np.ndarray,
                      aggregators: Sequence[str] = (), params: dict | None = None, *,
                      task) -> pa.Table:
    """Member rows and ensemble rows of one split, as the run's `task` writes them
    (`Task.prediction_chunks`, `Task.predictions_metadata`).

    Args:
        split: column `split` of every row.
        pred: the split's predictions (`predicted.SplitPredictions`): member index ->
            `[n_rows, k]` outputs; aggregator -> `[n_rows, k']` (computed with the task's
            numpy aggregators from the members when None); `[n_rows]` source rows, targets
            (None when unknown) and column `row` of the first row.
        classes: `[n_classes]` class labels (empty for a task without classes).
        aggregators: the ensemble rows' aggregators, in order.
        params: fitted aggregators' parameters `{name: params}` (`aggregators.json`), for the
            members in index order.
        task: the run's task (`ensemble.tasks.for_run`).
    """
    parts = list(task.prediction_chunks(split, pred, classes, aggregators, params,
                                        max(1, len(pred.rows))))
    meta = task.predictions_metadata(classes, params, aggregators, len(pred.members))
    return pa.concat_tables(parts).replace_schema_metadata(meta)


def prediction_chunks(split: str, pred: SplitPredictions, classes: np.ndarray,
                      aggregators: Sequence[str], params: dict | None = None,
                      chunk_rows: int = 65536) -> Iterator[pa.Table]:
    """`predictions_table`'s rows of `pred` as tables of at most `chunk_rows` rows, model by
    model (members in index order, then `aggregators`), each model's rows in order: the same
    rows in the same order as `predictions_table`, never more than one chunk of them built at
    once (a split of any size is written with flat memory)."""
    params = params or {}
    members = [p for _, p in sorted(pred.members.items())]
    ensembles = pred.ensembles
    if ensembles is None:
        stacked = np.stack(members)
        ensembles = {a: aggregate(stacked, a, params.get(a)) for a in aggregators}
    weights = {a: member_weights(a, len(members), params.get(a)) for a in aggregators}
    for key, y, p, span in chunks(split, pred, ensembles, aggregators, chunk_rows):
        a = key.aggregator
        unc = None if a is None or a in NOT_PROBABILITIES else M.uncertainty(
            np.stack([m[span] for m in members]), p, weights[a])
        yield model_rows(key, y, p, classes, unc,
                         None if a is None else decision.of(params.get(a)))


def wide_rows(long: pa.Table, aggregator: str, extra: pa.Table | None = None,
              ids: np.ndarray | None = None) -> pa.Table:
    """`ensemble predict`'s default layout: one row per input, the `aggregator`'s rows of a
    long predictions table (`predictions_table`) without `model`, `member`, `aggregator`,
    `split` and `source_row` (equal to `row`, the input's data-row number), after the input's own non-feature columns `extra` (an id, a timestamp: carried
    through unchanged; a name that collides with ours or an earlier one gets the prefix
    `input_`, as often as needed, so no two columns share a name) or, for array
    inputs, `input` (each row's file path or array index). Its key-value metadata keeps the
    long table's (`classes`) and names the `aggregator`."""
    import pyarrow.compute as pc

    t = long.filter(pc.equal(long.column("model"), f"ensemble-{aggregator}"))
    t = t.drop_columns([c for c in ("model", "member", "aggregator", "split", "source_row")
                        if c in t.column_names])  # (`source_row`: `row` on every input row)
    front: list[tuple[str, pa.Array]] = []
    taken = set(t.column_names)
    if ids is not None:
        front.append(("input", pa.array(np.asarray(ids, dtype=object).tolist(), pa.string())))
        taken.add("input")
    if extra is not None:
        ours = set(taken)
        taken |= set(extra.column_names)  # the input's own names stay when they can
        for name in extra.column_names:
            new = name
            if name in ours:
                new = f"input_{name}"
                while new in taken:  # never two columns of one name (`row`, `input_row`)
                    new = f"input_{new}"
                taken.add(new)
                notice(f"the input's column {name!r} has the name of a predictions column: "
                       f"written as {new!r}", once=True)
            front.append((new, extra.column(name)))
    for i, (name, col) in enumerate(front):
        t = t.add_column(i, name, col)
    return t.replace_schema_metadata({**(long.schema.metadata or {}),
                                      b"aggregator": aggregator.encode()})


def with_ids(long: pa.Table, ids: np.ndarray | None) -> pa.Table:
    """A long predictions table of one batch with the column `input` (each row's file path
    or array index; the table holds one block of rows per model) when `ids` are given."""
    if ids is None:
        return long
    reps = long.num_rows // max(len(ids), 1)
    col = pa.array(np.tile(np.asarray(ids, dtype=object), reps).tolist(), pa.string())
    return long.add_column(0, "input", col)


def history_table(records: list[dict], score_names: Sequence[str]) -> pa.Table:
    """Training history, one row per member and epoch (sorted by member, epoch): `member`,
    `epoch`, `loss`, the task's validation scores `score_names` (`Task.score_names`:
    `val_loss`, then `val_accuracy` or `val_rmse`, ...) and `seconds`."""
    records = sorted(records, key=lambda r: (r["member"], r["epoch"]))
    schema = pa.schema([("member", pa.int32()), ("epoch", pa.int32()), ("loss", pa.float64()),
                        *((name, pa.float64()) for name in score_names),
                        ("seconds", pa.float64())])
    return pa.Table.from_pylist(records, schema=schema)
