"""The Parquet tables of DESIGN.md: predictions, metrics and history.

Both replication modes and the aggregator build their tables here, so the schema is the same
whichever mode wrote them.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble import metrics as M
from ensemble.aggregate import aggregate, disagreement
from ensemble.data import encode


def _label_type(classes: np.ndarray) -> pa.DataType:
    return pa.string() if np.asarray(classes).dtype.kind in "USO" else pa.int64()


def classes_metadata(classes: np.ndarray) -> dict[bytes, bytes]:
    """Parquet key-value metadata holding the class list."""
    return {b"classes": json.dumps(np.asarray(classes).tolist()).encode()}


def classes_from(table: pa.Table) -> np.ndarray:
    """The class list stored in a predictions table's metadata."""
    return np.asarray(json.loads(table.schema.metadata[b"classes"]))


def model_rows(model: str, member: int | None, aggregator: str | None, split: str,
               rows: np.ndarray, y_true: np.ndarray | None, probs: np.ndarray,
               classes: np.ndarray) -> pa.Table:
    """Prediction rows of one model on one split.

    Args:
        rows: `[n_rows]` int64 row positions in the source data set (column `source_row`);
            column `row` is the position in the split, `0..n_rows-1`.
        y_true: `[n_rows]` int class indices, or None when the labels are unknown.
        probs: `[n_rows, n_classes]` probabilities.
        classes: `[n_classes]` sorted class labels (int or str).
    """
    n = len(rows)
    classes = np.asarray(classes)
    label = _label_type(classes)
    cols = {
        "model": pa.array([model] * n, pa.string()),
        "member": pa.array([member] * n, pa.int32()),
        "aggregator": pa.array([aggregator] * n, pa.string()),
        "split": pa.array([split] * n, pa.string()),
        "row": pa.array(np.arange(n, dtype=np.int64)),
        "y_true": pa.nulls(n, label) if y_true is None
        else pa.array(classes[y_true].tolist(), label),
        "y_pred": pa.array(classes[np.argmax(probs, axis=1)].tolist(), label),
        "source_row": pa.array(np.asarray(rows, np.int64)),
    }
    for c, name in enumerate(classes.tolist()):
        cols[f"p_{name}"] = pa.array(np.asarray(probs[:, c], np.float32))
    return pa.table(cols)


def predictions_table(member_probs: dict[int, np.ndarray], split: str, rows: np.ndarray,
                      y_true: np.ndarray | None, classes: np.ndarray,
                      aggregators: Sequence[str],
                      ensemble_probs: dict[str, np.ndarray] | None = None) -> pa.Table:
    """Member rows and ensemble rows of one split.

    Args:
        member_probs: member index -> `[n_rows, n_classes]` probabilities.
        ensemble_probs: aggregator -> `[n_rows, n_classes]`; computed with the numpy
            aggregators from `member_probs` when None.
    """
    parts = [model_rows(f"member-{i}", i, None, split, rows, y_true, p, classes)
             for i, p in sorted(member_probs.items())]
    if ensemble_probs is None:
        stacked = np.stack([p for _, p in sorted(member_probs.items())])
        ensemble_probs = {a: aggregate(stacked, a) for a in aggregators}
    parts += [model_rows(f"ensemble-{a}", None, a, split, rows, y_true, ensemble_probs[a], classes)
              for a in aggregators]
    return pa.concat_tables(parts).replace_schema_metadata(classes_metadata(classes))


def probabilities(table: pa.Table, classes: np.ndarray) -> np.ndarray:
    """The `p_<class>` columns as `[n_rows, n_classes]` float32."""
    return np.column_stack([table.column(f"p_{c}").to_numpy() for c in np.asarray(classes).tolist()])


def metrics_table(predictions: pa.Table) -> pa.Table:
    """One row per model and split with `n`, accuracy, NLL, Brier and ECE; rows with unknown
    `y_true` are left out. Ensemble rows also carry the members' `disagreement` on the split."""
    classes = classes_from(predictions)
    out = []
    labelled = predictions.filter(pc.is_valid(predictions.column("y_true")))
    for split in sorted(set(labelled.column("split").to_pylist())):
        part = labelled.filter(pc.equal(labelled.column("split"), split))
        models = list(dict.fromkeys(part.column("model").to_pylist()))
        member_p, first = {}, len(out)
        for model in models:
            t = part.filter(pc.equal(part.column("model"), model))
            p = probabilities(t, classes)
            y = encode(t.column("y_true").to_numpy(zero_copy_only=False), classes)
            member, agg = t.column("member")[0].as_py(), t.column("aggregator")[0].as_py()
            if member is not None:
                member_p[member] = p
            out.append({"model": model, "member": member, "aggregator": agg, "split": split,
                        "n": len(y), **M.all_metrics(y, p)})
        dis = disagreement(np.stack(list(member_p.values()))) if member_p else None
        for row in out[first:]:
            row["disagreement"] = dis if row["aggregator"] is not None else None
    schema = pa.schema([("model", pa.string()), ("member", pa.int32()),
                        ("aggregator", pa.string()), ("split", pa.string()), ("n", pa.int64()),
                        ("accuracy", pa.float64()), ("nll", pa.float64()),
                        ("brier", pa.float64()), ("ece", pa.float64()),
                        ("disagreement", pa.float64())])
    return pa.Table.from_pylist(out, schema=schema)


HISTORY_SCHEMA = pa.schema([("member", pa.int32()), ("epoch", pa.int32()),
                            ("loss", pa.float64()), ("val_loss", pa.float64()),
                            ("val_accuracy", pa.float64()), ("seconds", pa.float64())])


def history_table(records: list[dict]) -> pa.Table:
    """Training history, one row per member and epoch (sorted by member, epoch)."""
    records = sorted(records, key=lambda r: (r["member"], r["epoch"]))
    return pa.Table.from_pylist(records, schema=HISTORY_SCHEMA)


def write_outputs(run_dir, predictions: pa.Table, history: pa.Table) -> pa.Table:
    """Write `predictions.parquet`, `metrics.parquet` and `history.parquet` of a run
    (atomically); returns the metrics table."""
    from pathlib import Path

    from ensemble import artifacts

    run_dir = Path(run_dir)
    table = metrics_table(predictions)
    artifacts.write_parquet(run_dir / artifacts.PREDICTIONS, predictions)
    artifacts.write_parquet(run_dir / artifacts.METRICS, table)
    artifacts.write_parquet(run_dir / artifacts.HISTORY, history)
    return table
