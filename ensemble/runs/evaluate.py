"""`ensemble evaluate`: the table of the ensemble against its members, validation then test.

Metrics are recomputed from the predictions file (never trusted from elsewhere), written to
the metrics Parquet, and rendered by the run's task (`ensemble.tasks.report.format_table`: every
member, the mean and best member, each aggregator, the gains, the fitted parameters, a verdict);
`--plots` draws the task's plots (`Task.write_plots`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ensemble.core import artifacts
from ensemble.tasks.classification import fitted
from ensemble.runs import posthoc
from ensemble.runs import run_status
from ensemble.core import runlock
from ensemble.core.manifest import Manifest
from ensemble.runs import search_report
from ensemble.tasks import model_arrays
from ensemble.core.errors import UsageError
from ensemble.core.notices import notice
from ensemble.tasks.classification.evaluation import _line
from ensemble.tasks.classification.metrics import METRICS
from ensemble.tasks import confidence, plots_ood
from ensemble.tasks.report import number

def evaluate(run_dir: Path | None, predictions: Path | None = None,
             plots: bool = False) -> tuple[pa.Table, str]:
    """Recompute the metrics of a run's (or a predictions file's) predictions and write them.

    Writes `metrics.parquet` in the run (for the run's own predictions) or
    `<predictions stem>.metrics.parquet` beside a given predictions file; files it writes in
    the run get their new sha256 in the manifest. Holds the run lock (`runlock`) meanwhile:
    shared, for reading only, on a run this process cannot write (a read-only folder or file
    system). Metrics that cannot be written are only returned, with a notice naming the file.
    The best member is the run's (chosen on validation, `aggregators.json`) when it is known.

    Args:
        plots: also write PNGs (`ensemble.plots`) beside the metrics.

    Returns:
        (metrics table, the printed text).

    Raises:
        UsageError: no run/predictions, a predictions file without labels, a damaged or
            unhashed artifact, `plots` in a folder that cannot be written, or a run another
            process holds.
    """
    if run_dir is None:
        return _evaluate(None, predictions, plots)
    if not os.access(run_dir, os.W_OK):  # nothing is written in it: read it, no writer meanwhile
        with runlock.reading(run_dir):
            return _evaluate(Path(run_dir), predictions, plots)
    with runlock.writing(run_dir, "ensemble evaluate"):
        return _evaluate(Path(run_dir), predictions, plots)


class ShownRows:
    """The confidence block of the evaluation table (`confidence.block`) of one split of
    `predictions.parquet`, built from its chunks as the file is written
    (`eval_writer.write`'s `on_chunk`; `confidence.BlockBuilder`: a few bytes per row of one
    model held): the writer's table never reads the file back."""

    def __init__(self, split: str, task) -> None:
        self.split, self.task, self.meta = split, task, {}
        self.block = confidence.BlockBuilder(split, task)

    def __call__(self, chunk: pa.Table) -> None:
        import pyarrow.compute as pc

        self.meta = chunk.schema.metadata or {}
        rows = chunk.filter(pc.equal(chunk.column("split"), self.split))
        if rows.num_rows:
            rows = rows.select(model_arrays.columns(chunk.schema, self.task))
            self.block.add(model_arrays.of_batches(self.meta, self.task, rows.to_batches()))

    def lines(self) -> list[str]:
        """`confidence.block` of the rows seen ([] when none)."""
        return self.block.lines()


# the evaluation tables this process computed as it wrote the metrics:
# {resolved metrics path: ((size, mtime_ns, inode) of the file, the table's text)}
_TABLES: dict[str, tuple[tuple[int, int, int], str]] = {}


def keep_table(run_dir: Path, text: str) -> None:
    """Keep `text`, the evaluation table of the `metrics.parquet` this process just wrote in
    `run_dir`, for `stored_table` while the file stays as written."""
    path = Path(run_dir) / artifacts.METRICS
    _TABLES[str(path.resolve())] = (artifacts.stamp(path), text)


def stored_table(run_dir: Path, manifest: Manifest) -> str:
    """The evaluation table of a run's stored `metrics.parquet`, `aggregators.json` and
    predictions (each checked against its recorded hash): the one this process computed as it
    wrote them (`keep_table`) when the metrics file is unchanged since, else read from the
    files; `evaluate` when the run has no metrics file.

    Raises:
        UsageError: as `artifacts.verify`.
    """
    path = Path(run_dir) / artifacts.METRICS
    if not path.is_file():
        return evaluate(run_dir)[1]
    artifacts.verify(run_dir, manifest, path)
    kept = _TABLES.get(str(path.resolve()))
    if kept is not None and kept[0] == artifacts.stamp(path):
        return kept[1]
    from ensemble import tasks

    preds = own_predictions(run_dir, manifest)
    task = tasks.for_run(manifest)
    return task.format_table(artifacts.read_parquet(path), fitted.read(run_dir),
                             confidence.block_of_file(preds, task))


def own_predictions(run_dir: Path, manifest: Manifest) -> Path:
    """The run's `predictions.parquet`, checked against its recorded sha256.

    Raises:
        UsageError: a run that never wrote one (an estimator's save: every row trained, no
            validation or test split) names the way to evaluate it; else as
            `artifacts.verify`.
    """
    path = run_dir / artifacts.PREDICTIONS
    if not path.is_file() and artifacts.PREDICTIONS not in artifacts.recorded_hashes(manifest):
        raise UsageError(
            f"Run {run_dir} has no predictions of its own (a run saved by an estimator's "
            "save() has no test split); evaluate it on labelled rows: `ensemble predict "
            f"--run {run_dir} --data SOURCE --target COL --layout long --out P.parquet`, "
            "then `ensemble evaluate --predictions P.parquet`.")
    return artifacts.verify(run_dir, manifest, path)


def _evaluate(run_dir: Path | None, predictions: Path | None, plots: bool
              ) -> tuple[pa.Table, str]:
    manifest = Manifest.load(run_dir) if run_dir is not None else None
    fit = None
    if manifest is not None and (run_dir / fitted.FILENAME).is_file():
        fit = json.loads(artifacts.read_verified(run_dir, manifest, run_dir / fitted.FILENAME))
    if predictions is None:
        if run_dir is None:
            raise UsageError("Expected --run PATH or --predictions FILE.parquet.")
        run_status.require_completed(run_dir, manifest)
        predictions = own_predictions(run_dir, manifest)
        out = run_dir / artifacts.METRICS
    else:
        if not predictions.is_file():
            raise UsageError(f"Expected --predictions to be a Parquet file. Received: "
                             f"{predictions} ({'a folder' if predictions.is_dir() else 'missing'})")
        out = predictions.with_name(predictions.stem + ".metrics.parquet")
    writable = os.access(out.parent, os.W_OK) and (not out.exists() or os.access(out, os.W_OK))
    if plots and not writable:
        raise UsageError(f"Expected a folder --plots can write in. Received: {out.parent} "
                         "(read-only); evaluate without --plots (the table only), or copy the "
                         "run or predictions to a writable folder first.")
    if predictions.suffix != ".parquet":
        raise UsageError(f"Expected --predictions to be a .parquet file of `ensemble predict` "
                         f"(either layout). Received: {predictions}")
    with tempfile.TemporaryDirectory(prefix="ensemble-evaluate-") as tmp:
        read = _as_long(predictions, Path(tmp))
        task = _task(manifest, read)
        preds = model_arrays.read(read, task)  # a record batch at a time into compact arrays
    table = task.metrics_table(preds, (fit or {}).get("best_member"))
    if table.num_rows == 0:
        raise UsageError(f"{predictions} has no rows with a known y_true; cannot evaluate.")
    for split, (n, kept) in preds.unlabelled().items():
        notice(f"left out {n:,} row{'s' * (n != 1)} of split {split!r} of {predictions} "
               "without a y_true (a missing label, or one the run never saw, at predict); "
               f"scored the {kept:,} labelled row{'s' * (kept != 1)}")
    written = []
    if writable:
        artifacts.write_parquet(out, table)
        written.append(out)
    else:
        notice(f"{out.parent} is read-only: the metrics are printed, not written to {out}")
    text = task.format_table(table, fit, confidence.block(preds))
    if run_dir is not None and predictions == Path(run_dir) / artifacts.PREDICTIONS:
        if writable:  # the run's own table, as `stored_table` would read it back
            keep_table(run_dir, text)
        text = "\n".join([text, *comparison_lines(run_dir, manifest)])
    if plots:
        if manifest is not None and (run_dir / posthoc.SIZE_CURVE).is_file():
            artifacts.verify(run_dir, manifest, run_dir / posthoc.SIZE_CURVE)
        pictures = task.write_plots(out.parent, preds, table, run_dir)
        labelled = preds.labelled()
        if task.confidence is not None:
            pictures.append(plots_ood.confidence_plot(out.parent, *_answer_curves(
                *confidence.curves(labelled, confidence.shown_split(labelled) or "test"),
                table.to_pylist(), run_dir)))
        text += "\n" + "\n".join(f"plot: {p}" for p in pictures)
        written += pictures
    inside = [p for p in written if run_dir is not None
              and Path(os.path.abspath(p)).is_relative_to(os.path.abspath(run_dir))]
    if inside:  # a hashed artifact is never rewritten without its new hash
        Manifest.update(run_dir, lambda m: m.record_hashes(run_dir, inside))
    return table, text


def _task(manifest: Manifest | None, predictions: Path):
    """The task that scores `predictions`: the run's (`tasks.for_run`), or without a run the
    one the file's metadata names (`tasks.of_file`)."""
    from ensemble import tasks

    if manifest is not None:
        return tasks.for_run(manifest)
    return tasks.of_file(pq.read_schema(predictions).metadata)


def _as_long(predictions: Path, tmp: Path) -> Path:
    """`predictions` itself when it is a long-layout predictions file, or a long-layout copy
    in folder `tmp` of `ensemble predict`'s wide layout with `y_true` (one model,
    `ensemble-<aggregator>` as its metadata names it, split `predict`, `source_row` its
    `row`). Only the schema of a long file is read.

    Raises:
        UsageError: a damaged file, or neither layout (names the columns expected).
    """
    try:
        schema = pq.read_schema(predictions)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UsageError(f"Damaged or invalid Parquet file {predictions}: {exc}") from None
    meta = schema.metadata or {}
    if "model" in schema.names or "y_true" not in schema.names or b"classes" not in meta:
        _check_long(schema, predictions)
        return predictions
    wide = pq.read_table(predictions)
    n = wide.num_rows
    aggregator = meta.get(b"aggregator", b"mean").decode()
    rows = wide.column("row")  # the input's data row: `source_row` too
    front = {"model": pa.array([f"ensemble-{aggregator}"] * n, pa.string()),
             "member": pa.nulls(n, pa.int32()), "aggregator": pa.array([aggregator] * n),
             "split": pa.array(["predict"] * n)}
    keep = [c for c in wide.column_names if c not in front]
    long = pa.table({**front, **{c: wide.column(c) for c in keep},
                     "source_row": pa.array(rows, pa.int64())})
    out = tmp / "long.parquet"
    pq.write_table(long.replace_schema_metadata(meta), out)
    return out


def _check_long(schema: pa.Schema, predictions: Path) -> None:
    """Raises UsageError unless `schema` is a long-layout predictions file's
    (`predictions`)."""
    meta = schema.metadata or {}
    if not {"model", "split", "y_true"} <= set(schema.names) or b"classes" not in meta:
        from ensemble import tasks

        task = tasks.of_file(meta)  # the file's task (`task` metadata), else classification
        outputs = ", ".join(task.output_columns(json.loads(meta.get(b"classes", b"[]")))) \
            or "p_<class>"
        raise UsageError(f"{predictions} is not a predictions file of `ensemble predict` "
                         f"(expected the columns y_true, {outputs}, and model, split in the "
                         "long layout; `ensemble predict --target COL` fills y_true).")


def _answer_curves(curves: dict, regression: bool, rows: list[dict], run_dir
                   ) -> tuple[dict, bool]:
    """The confidence curves of the members and of the one ensemble `predict` answers with
    (`report.answering`), labelled so; other aggregators' curves are left out (std scaling
    only rescales the std: its curve is the mean's, one line hid the other)."""
    from ensemble.tasks.report import ANSWER, answering

    answer = answering([r for r in rows if r["split"] == "test"] or rows, run_dir)
    if answer is None:
        return curves, regression
    return ({(m + ANSWER if m == answer["model"] else m): c for m, c in curves.items()
             if m == answer["model"] or not m.startswith("ensemble")}, regression)


def comparison_lines(run_dir: str | Path, manifest: Manifest) -> list[str]:
    """`comparison` as lines of the `ensemble evaluate` table ([] when not a search)."""
    rows = search_report.comparison(run_dir, manifest)
    if not rows:
        return []
    info = manifest.search
    strat = (f", stratified: {info['stratify']} seeds per selected configuration"
             if info.get("stratify") else "")
    out = [f"hyperparameter search: {info['candidates']} candidates, greedy selection of at "
           f"most {info['select']} on validation NLL{strat}",
           _line("model", list(METRICS))]  # the columns' names, as the table above
    for split in dict.fromkeys(r["split"] for r in rows):
        out.append(f"{split}")
        out += [_line("  " + r["model"], [number(r[m]) for m in METRICS])
                for r in rows if r["split"] == split]
    return out
