"""A run's evaluation tables written from the arrays it predicted, with flat memory.

`predictions.parquet` holds one row per model, split and row (members and every aggregator): for
a split of 800,000 rows and 8 models, 6.4 million rows, about 0.7 GB as one Arrow table. The
writer here never builds it whole, nor any model's outputs: the members' outputs are arrays
or memory maps (`OutputFiles`, files in the run directory the predictions went to as they were
predicted), the aggregators' outputs are computed a chunk of rows at a time into memory maps of
their own, the rows go to one `ParquetWriter` a chunk at a time, model by model in
`predictions_table`'s order (the file is the one `predictions_table` would give), and every
metric is a running sum or an exact count over chunks (the task's `metrics_of`), equal to what
its `metrics_table` reads back from those rows. What stays in
memory is a few chunks of rows.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from ensemble.core import artifacts, staging
from ensemble.core.notices import notice
from ensemble.tasks.predicted import SplitPredictions
from ensemble.tasks.table_parts import PRIOR, prior_metadata

CHUNK_ROWS = 65536  # rows of one model built, written and scored at a time
IMBALANCED = 0.10  # a smallest class share below this: `imbalance_notice` speaks

__all__ = ["CHUNK_ROWS", "OutputFiles", "SplitPredictions", "output_files", "write"]


class OutputFiles:
    """Memory-mapped float arrays in a scratch folder of the run directory (removed with the
    `output_files` context): a run's predictions go there as they are predicted."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0

    def new(self, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """A zeroed writable memory map of `shape` (a plain empty array when it holds no
        element: a file of 0 bytes cannot be mapped)."""
        if int(np.prod(shape)) == 0:
            return np.zeros(shape, dtype)
        self.count += 1
        return np.lib.format.open_memmap(self.folder / f"outputs-{self.count}.npy", "w+",
                                         dtype, shape)


@contextlib.contextmanager
def output_files(run_dir: str | Path) -> Iterator[OutputFiles]:
    """`OutputFiles` in a hidden scratch folder of `run_dir`, removed on exit; the folder has
    an owned staging name (`core.staging`), so one left by a killed process is swept by the
    next `output_files` of the same folder."""
    folder = staging.new_path(Path(run_dir) / "outputs", folder=True)
    try:
        yield OutputFiles(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def predict_to(files: OutputFiles, predict, x, chunk_rows: int = CHUNK_ROWS
               ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The outputs of `predict(x[lo:hi]) -> (members [n_members, n, k], {aggregator:
    [n, k']})` over `x` `[n_rows, ...]` (an array or memory map), `chunk_rows` rows at a
    time, into memory maps of `files`: `[n_members, n_rows, k]` and `{aggregator: [n_rows,
    k']}` (arrays when `x` has no row)."""
    n = len(x)
    if n == 0:
        m, e = predict(x[:0])
        return np.asarray(m), {a: np.asarray(v) for a, v in e.items()}
    members, ensembles = None, {}
    for lo in range(0, n, chunk_rows):
        m, e = predict(x[lo:lo + chunk_rows])
        m = np.asarray(m)
        if members is None:
            members = files.new((m.shape[0], n, *m.shape[2:]), m.dtype)
        members[:, lo:lo + m.shape[1]] = m
        for a, v in e.items():
            v = np.asarray(v)
            if a not in ensembles:
                ensembles[a] = files.new((n, *v.shape[1:]), v.dtype)
            ensembles[a][lo:lo + len(v)] = v
    return members, ensembles


def write(run_dir: str | Path, splits: dict[str, SplitPredictions], task, classes: np.ndarray,
          aggregators: Sequence[str], params: dict | None, meta: dict | None = None,
          prior: list | dict | None = None, best_member: int | None = None,
          on_chunk=None) -> pa.Table:
    """Write `predictions.parquet` (streamed) and `metrics.parquet` of a run, each atomically;
    returns the metrics table (the `task`'s `metrics_of`). Prints the task's notices
    (`Task.prediction_notices`: an imbalanced training split, negative predictions of a
    non-negative target), and one when no ensemble beats the prior in NLL on test.

    Args:
        splits: split -> its predictions (outputs as arrays or memory maps); `ensembles`
            None: the numpy aggregators' outputs of the members, computed here a chunk at a
            time.
        task: the run's task (`ensemble.tasks.for_run`): its columns, metadata and metrics.
        classes: `[n_classes]` class labels (empty for a task without classes).
        aggregators: the aggregators whose rows the tables hold, in order.
        params: the fitted aggregators' parameters (`aggregators.json`).
        meta: more key-value metadata of `predictions.parquet` (bytes to bytes).
        prior: the task's baseline (`Task.prior`: the training split's class shares, a
            regression target's `{"mean", "std"}`), the `prior` row of every split; none when
            None.
        best_member: the best member (`aggregators.json`'s); chosen on the validation rows
            when None.
        on_chunk: called with every chunk of `predictions.parquet` as it is written (an
            Arrow table with the file's metadata), for a caller that keeps some rows.

    Raises:
        OSError: a file cannot be written (nothing under the final names changes).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with output_files(run_dir) as files:
        splits = {s: p if p.ensembles is not None else p._replace(
            ensembles=_aggregated(files, p.members, task, aggregators, params))
            for s, p in splits.items()}
        n_members = len(next(iter(splits.values())).members) if splits else 0
        file_meta = {**task.predictions_metadata(classes, params, aggregators, n_members),
                     **prior_metadata(prior), **(meta or {})}
        task.prediction_notices(splits, classes, aggregators, prior, file_meta)
        chunks = (t for s, p in splits.items() for t in task.prediction_chunks(
            s, p, classes, aggregators, params, CHUNK_ROWS))
        metrics = task.metrics_of(splits, aggregators, params, best_member, classes, prior,
                                  file_meta)
        if on_chunk is not None:
            chunks = _watched(chunks, file_meta, on_chunk)
        artifacts.write_parquet_chunks(run_dir / artifacts.PREDICTIONS, chunks, file_meta)
    artifacts.write_parquet(run_dir / artifacts.METRICS, metrics)
    baseline_notice(metrics)
    return metrics


def _watched(chunks, meta: dict, on_chunk):
    """`chunks`, each passed to `on_chunk` with the file's metadata `meta` first."""
    for t in chunks:
        t = t.replace_schema_metadata(meta)
        on_chunk(t)
        yield t


def imbalance_notice(classes: np.ndarray, shares: Sequence[float]) -> None:
    """The notice naming the class shares of an imbalanced training split: its smallest
    class under `IMBALANCED` of the rows and under half an equal share (ten balanced classes
    hold 10% each)."""
    if min(shares) >= min(IMBALANCED, 0.5 / len(shares)):
        return
    named = ", ".join(f"{c} {100 * s:.1f}%" for c, s in zip(np.asarray(classes).tolist(), shares))
    notice(f"the classes are imbalanced (training rows: {named}): accuracy says little "
           "here; see roc_auc, average_precision, balanced_accuracy and the recall_<class> "
           "columns of metrics.parquet.")


def negative_notice(splits: dict[str, SplitPredictions], aggregators: Sequence[str]) -> None:
    """The notice when a regression run's labelled rows (`splits`' `y`) hold no negative
    target and an ensemble (`aggregators`' `ensembles[a][:, 0]`) predicts a negative mean on
    some row: `--target-transform log1p` keeps predictions above -1."""
    ys = [np.asarray(p.y, np.float64) for p in splits.values() if p.y is not None]
    ys = np.concatenate(ys) if ys else np.empty(0)
    ys = ys[~np.isnan(ys)]
    if not len(ys) or ys.min() < 0:
        return
    negative = {s: int(sum(np.count_nonzero(np.asarray(p.ensembles[a])[:, 0] < 0)
                           for a in aggregators[:1]))
                for s, p in splits.items() if p.ensembles}
    if any(negative.values()):
        counts = ", ".join(f"{n} {s} rows" for s, n in negative.items() if n)
        notice(f"the target has no negative value in the {len(ys)} labelled rows, but "
               f"ensemble-{aggregators[0]} predicts a negative mean for {counts}; "
               "--target-transform log1p (or log) keeps predictions on the target's range.")


def baseline_notice(metrics: pa.Table, split: str = "test") -> None:
    """The notice when no ensemble has a lower NLL than the `prior` row on `split`."""
    rows = [r for r in metrics.to_pylist() if r["split"] == split]
    prior = next((r for r in rows if r["model"] == PRIOR), None)
    ens = [r for r in rows if r["aggregator"] is not None and r.get("nll") is not None]
    if prior is None or prior.get("nll") is None or not ens:
        return
    best = min(ens, key=lambda r: r["nll"])
    if best["nll"] >= prior["nll"]:
        notice(f"no ensemble beats the prior (the training split's targets alone) on "
               f"{split}: NLL {best['nll']:.4f} ({best['model']}) against {prior['nll']:.4f}; "
               "the members learned little from the features.")


def _aggregated(files: OutputFiles, members: dict, task, aggregators, params) -> dict:
    """The `task`'s numpy aggregators' outputs `{name: [n_rows, n_outputs]}` of `members`
    (arrays or memory maps `[n_rows, k]`), computed `CHUNK_ROWS` rows at a time into memory
    maps."""
    ordered = [o for _, o in sorted(members.items())]
    n = len(ordered[0]) if ordered else 0
    out: dict = {}
    for lo in range(0, max(n, 1), CHUNK_ROWS):
        stacked = np.stack([o[lo:lo + CHUNK_ROWS] for o in ordered])
        for a in aggregators:
            part = task.aggregate(stacked, a, (params or {}).get(a))
            if a not in out:
                out[a] = files.new((n, *part.shape[1:]), part.dtype)
            out[a][lo:lo + len(part)] = part
    return out
