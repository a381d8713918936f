"""A long-layout predictions file read one record batch at a time into compact numpy arrays per
split and model, what `ensemble evaluate` scores (its metrics, confidence block and plots).

The Arrow table of a predictions file holds per row the strings `model`, `split` and often
`y_true`, and columns evaluate never reads (`y_pred`, `source_row`, the entropies); held whole,
a 4.8M-row file of 3 classes took 2.5 GB (docs/benchmarks.md, "Streaming evaluate"). `read`
keeps of each row only its position `row`, its target and its model's outputs (the run's
task's `output_columns`: `[n_classes]` float32 probabilities, the float64 mean and std of a
regression run, ...), in the file's order,
so memory is a few dozen bytes per row whatever the strings; the metrics are then computed by
the tasks' own functions, exactly as from the whole table
(`ensemble.tasks.metrics_tables.metrics_table`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ensemble.core.errors import UsageError
from ensemble.core.labels import encode

BATCH_ROWS = 65536
KEYS = ("model", "member", "aggregator", "split", "row", "y_true")


@dataclass
class ModelArrays:
    """One model's rows of one split with a known `y_true`, in the file's order.

    Attributes:
        model, member, aggregator, split: as the predictions file's columns (member and
            aggregator of the model's first row).
        row: `[n_rows]` int64 column `row`.
        y: `[n_rows]` int32 class indices, or float64 targets (regression).
        values: `[n_rows, k]` the task's `output_columns` (`[n_rows, n_classes]` float32
            probabilities, `[n_rows, 2]` float64 mean (`y_pred`) and `std` of regression).
        extra: `[n_rows]` float64 of the task's `uncertainty_column` (`mutual_information`,
            `epistemic_std`), NaN where null; None when the file or task has no such column.
        extra_nulls: how many of `extra` were null.
        unlabelled: the model's rows of the split with an unknown `y_true` (left out above).
        source_row: `[n_rows]` int64 column `source_row` when read (`read(source_rows=True)`),
            else None.
    """

    model: str
    member: int | None
    aggregator: str | None
    split: str
    row: np.ndarray
    y: np.ndarray
    values: np.ndarray
    extra: np.ndarray | None = None
    extra_nulls: int = 0
    unlabelled: int = 0
    source_row: np.ndarray | None = None

    def by_row(self) -> ModelArrays:
        """The same rows ordered by `row` (a stable sort)."""
        order = np.argsort(self.row, kind="stable")
        return replace(self, row=self.row[order], y=self.y[order], values=self.values[order],
                       extra=None if self.extra is None else self.extra[order],
                       source_row=None if self.source_row is None else self.source_row[order])


@dataclass
class PredictionArrays:
    """Every model of every split of a predictions file (`read`, `of_table`).

    Attributes:
        metadata: the file's Parquet key-value metadata (`classes`; regression's `mixture`).
        task: the run's task (`ensemble.tasks.Task`), which names the columns read.
        splits: every split, in the order of its first row (labelled or not).
        models: `(split, model)` -> `ModelArrays`, in the order of each model's first row.
    """

    metadata: dict
    task: object
    splits: list[str] = field(default_factory=list)
    models: dict[tuple[str, str], ModelArrays] = field(default_factory=dict)

    @property
    def classes(self) -> np.ndarray:
        """`[n_classes]` sorted class labels (empty for a task without classes)."""
        return np.asarray(json.loads(self.metadata.get(b"classes", b"[]")))

    def of_split(self, split: str) -> list[ModelArrays]:
        """The models of `split` with at least one labelled row, in the file's order."""
        return [a for (s, _), a in self.models.items() if s == split and len(a.y)]

    def unlabelled(self) -> dict[str, tuple[int, int]]:
        """split -> (its rows with an unknown `y_true`, its labelled rows), per model (every
        model of a split has the same rows), for the splits with at least one unlabelled row."""
        out = {}
        for (split, _), a in self.models.items():
            if a.unlabelled and split not in out:
                out[split] = (a.unlabelled, len(a.y))
        return out

    def get(self, split: str, model: str) -> ModelArrays:
        """One model's arrays on one split. Raises KeyError when absent."""
        return self.models[(split, model)]

    def labelled(self) -> PredictionArrays:
        """The same arrays as a file of only its labelled rows: splits and models without
        one are left out, `unlabelled` is 0."""
        models = {k: replace(a, unlabelled=0) for k, a in self.models.items() if len(a.y)}
        splits = [s for s in self.splits if any(k[0] == s for k in models)]
        return PredictionArrays(self.metadata, self.task, splits, models)


def columns(schema: pa.Schema, task) -> list[str]:
    """The columns of a predictions file `read` needs for the run's `task` (its
    `output_columns` and `uncertainty_column`; the others are never decoded)."""
    classes = json.loads((schema.metadata or {}).get(b"classes", b"[]"))
    wanted = {*task.output_columns(classes), task.uncertainty_column}
    return [c for c in schema.names if c in KEYS or c in wanted]


def read(path: str | Path, task, batch_rows: int = BATCH_ROWS, source_rows: bool = False
         ) -> PredictionArrays:
    """A long-layout predictions file of a run of `task` read `batch_rows` rows at a time
    (Parquet page checksums verified), only the columns `columns` names (and `source_row`
    when `source_rows`: `ModelArrays.source_row`).

    Raises:
        UsageError: a file that is not valid Parquet, or damaged (names the file); a label
            that is not one of the file's classes.
    """
    try:
        f = pq.ParquetFile(path, page_checksum_verification=True,
                           pre_buffer=False)  # pre-buffering grew ~35 MB a million rows
        names = columns(f.schema_arrow, task) + (["source_row"] if source_rows else [])
        return of_batches(f.schema_arrow.metadata or {}, task,
                          f.iter_batches(batch_size=batch_rows, columns=names))
    except (pa.ArrowInvalid, OSError) as exc:
        raise UsageError(f"Damaged or invalid Parquet file {path}: {exc}") from None


def of_table(table: pa.Table, task) -> PredictionArrays:
    """`read` of a predictions table already in memory (a run's own, before it is written)."""
    return of_batches(table.schema.metadata or {}, task, table.to_batches())


def of(predictions: pa.Table | PredictionArrays, task) -> PredictionArrays:
    """`predictions` as arrays: a table through `of_table` (read for `task`), arrays as they
    are."""
    return of_table(predictions, task) if isinstance(predictions, pa.Table) else predictions


def of_batches(metadata: dict, task, batches: Iterable[pa.RecordBatch]) -> PredictionArrays:
    """`PredictionArrays` of the record batches of a long-layout predictions file of a run of
    `task` with the key-value `metadata` (its `classes`), batch by batch (`source_row` kept
    when the batches have the column)."""
    out = PredictionArrays(metadata, task)
    parts: dict[tuple[str, str], list[tuple]] = {}
    classes = out.classes
    for batch in batches:
        for key, part in _groups(batch):
            if key[0] not in out.splits:
                out.splits.append(key[0])
            if key not in out.models:
                out.models[key] = ModelArrays(
                    key[1], part.column("member")[0].as_py(),
                    part.column("aggregator")[0].as_py(), key[0], *_empty(task, classes))
            model = out.models[key]
            known = part.filter(pc.is_valid(part.column("y_true")))
            model.unlabelled += part.num_rows - known.num_rows
            if known.num_rows:  # (a file without labels may type y_true as null)
                parts.setdefault(key, []).append(
                    _arrays(known, task, classes, model.aggregator is not None))
    for key in list(parts):  # one model's chunks and their concatenation held at a time
        row, y, values, extra, nulls, source = zip(*parts.pop(key))
        out.models[key] = replace(
            out.models[key], row=np.concatenate(row), y=np.concatenate(y),
            values=np.concatenate(values), extra_nulls=sum(nulls),
            extra=None if extra[0] is None else np.concatenate(extra),
            source_row=None if source[0] is None else np.concatenate(source))
    return out


def _groups(batch: pa.RecordBatch):
    """`((split, model), rows of batch)` of each split and model of `batch`, in the order of
    their first row."""
    for split in pc.unique(batch.column("split")).to_pylist():
        part = batch.filter(pc.equal(batch.column("split"), split))
        for model in pc.unique(part.column("model")).to_pylist():
            yield (split, model), part.filter(pc.equal(part.column("model"), model))


def _empty(task, classes: np.ndarray) -> tuple:
    """`ModelArrays`' row, y and values of no rows."""
    k = len(task.output_columns(classes))
    return (np.zeros(0, np.int64), np.zeros(0, task.target_dtype),
            np.zeros((0, k), task.output_dtype))


def _arrays(rows: pa.RecordBatch, task, classes: np.ndarray, ensemble: bool) -> tuple:
    """`(row, y, values, extra, extra_nulls, source_row)` of labelled `rows` of one model
    (`ModelArrays`: values the `task`'s `output_columns`; `extra` its `uncertainty_column`,
    None unless an `ensemble`'s: a member's is null and never read)."""
    col = (lambda name: rows.column(name).to_numpy(zero_copy_only=False))
    y = encode(col("y_true"), classes)
    names = rows.schema.names
    values = _values(rows, task, classes)
    name = task.uncertainty_column
    source = col("source_row").astype(np.int64) if "source_row" in names else None
    if name is None or name not in names or not ensemble:
        return col("row").astype(np.int64), y, values, None, 0, source
    return (col("row").astype(np.int64), y, values, col(name).astype(np.float64),
            rows.column(name).null_count, source)


def _values(rows: pa.RecordBatch, task, classes) -> np.ndarray:
    """`[n_rows, k]` of the `task`'s `output_columns` of `rows`, in its `output_dtype`."""
    cols = [rows.column(c).to_numpy(zero_copy_only=False) for c in task.output_columns(classes)]
    return np.column_stack(cols).astype(task.output_dtype, copy=False).reshape(
        rows.num_rows, len(cols))
