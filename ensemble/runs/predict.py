"""`ensemble predict`: apply a trained run to a data set, streaming, and write its predictions.

The input is read in batches of `--batch-size` rows (`ensemble.data.stream.InputStream`); each
batch is scaled, predicted and appended to the output with one `ParquetWriter`, which is renamed
into place at the end, so memory stays flat however large the input. In-graph prediction can
run each member as several replicas (`--replicas`): the rows of every batch are split across
the member's devices. Beside the output, `<out>.manifest.json` records the run, the input, the
rows, the timing and member -> devices.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ensemble.core import artifacts
from ensemble.replication import devices
from ensemble.runs import run_status
from ensemble.core.manifest import Manifest
from ensemble.runs.context import RunContext, dropped_columns
from ensemble.core import runlock
from ensemble.tasks import tables
from ensemble.tasks.predicted import SplitPredictions
from ensemble.core.errors import UsageError
from ensemble.data import kinds
from ensemble.data.prediction_io import flat_heap, prefetch
from ensemble.replication.modes import PredictRequest

GRAPH_BATCH_ROWS = 16384  # rows per traced call: bounds the members' activations in memory


def open_run(run_dir: Path, trust_builder: bool = False) -> RunContext:
    """The context of the completed run `run_dir`, its files verified first
    (`preflight.verify_run`: builder files, members, preprocessing, predictions;
    `trust_builder` accepts a changed builder file and records its sha256).

    Raises:
        UsageError: the run is not completed or damaged, or another process holds it.
    """
    from ensemble.runs import preflight

    manifest = Manifest.load(run_dir)
    runlock.require_free(run_dir)
    run_status.require_completed(run_dir, manifest)
    pre = kinds.run_preprocessing(run_dir, manifest)  # verified, read once
    preflight.verify_run(run_dir, manifest, trust_builder, pre=pre)
    return RunContext.open(run_dir, manifest, pre)  # builders checked: the config imports them


def open_input(request: PredictRequest):
    """The run's context (`open_run`), and `request.source` as an `InputStream` of
    `request.batch_size` rows a batch (columns matched by name; extra columns ignored with a
    notice, or refused with `request.strict_columns`).

    Returns:
        (the `RunContext`, the stream).

    Raises:
        UsageError: the run is not completed or damaged, or the source cannot be read.
    """
    r = request
    run = open_run(r.run_dir, r.trust_builder)
    return run, input_stream(run.manifest, run.preprocessing, r.source, r.target,
                             r.strict_columns, r.batch_size)


def input_stream(manifest: Manifest, pre, source: str, target: str | None, strict: bool,
                 batch_rows: int | None):
    """The stream of new rows `source` for the run of `manifest` and `pre`
    (`kinds.input_stream`), with the columns training dropped carried as ids; `target`
    (`--target`), when given, must be in the input (`check_target`); else the run's own
    target column is read when present.

    Raises:
        UsageError: as `kinds.input_stream`; a `target` the input lacks.
    """
    stream = kinds.input_stream(pre, source, target or manifest.dataset.target_or("target"),
                                strict, batch_rows)
    stream.dropped = dropped_columns(manifest)  # carried as ids: not named
    if target:  # named explicitly: not optional
        stream.check_target()
    return stream


def check_out(out: Path) -> Path:
    """Check the output path of a prediction before any work.

    Raises:
        UsageError: not a `.parquet` name, a folder, or a place this process cannot write
        (names the path and the reason).
    """
    from ensemble.core.outputs import writes_through

    out = Path(out)
    if writes_through(out):  # a FIFO, a device, /dev/stdout: written in place (CSV unless .parquet)
        if not os.access(out, os.W_OK):
            raise UsageError(f"Cannot write --out {str(out)!r}: permission denied")
        return out
    if out.suffix.lower() not in (".parquet", ".csv"):  # as `outputs.table_format` reads it
        raise UsageError(f"Expected --out to end in .parquet or .csv. Received: {out}")
    if out.is_dir():
        raise UsageError(f"Expected --out to be a file. Received: {out} (a folder)")
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"Cannot write --out {out}: permission denied")
    parent = Path(os.path.abspath(out)).parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"Cannot write --out {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"Cannot write --out {out}: permission denied in {parent}")
    return out


def manifest_path(out: Path) -> Path:
    """`<out>.manifest.json`, as docs/reference/run-directory.md names it: `preds.parquet` ->
    `preds.parquet.manifest.json` (a `preds.csv` beside it gets its own)."""
    out = Path(out)
    return out.with_name(out.name + ".manifest.json")


def write_manifest(out: Path, record: dict) -> dict:
    """Write the prediction's manifest beside `out` (atomically; not beside a FIFO or device
    written through, `ensemble.core.outputs`); returns `record`."""
    from ensemble.core.outputs import writes_through

    if not writes_through(out):
        artifacts.write_text(manifest_path(out), json.dumps(record, indent=1))
    return record


@dataclass
class Prediction:
    """What both modes' prediction drivers share (`open_prediction`): the run's context, the
    input stream, the aggregator names and fit (`posthoc.run_aggregators`), the wide layout's
    aggregator (`answer`), the members used (diverged ones left out) and their fitted
    aggregators' parameters, and the output's key-value metadata from the run's task
    (`target_transform`)."""

    request: PredictRequest
    run: RunContext
    stream: Any
    names: list
    answer: str
    used: list[int]
    params: dict
    metadata: dict = field(default_factory=dict)

    def write(self, writer, member_p: dict, ens_p, batch) -> None:
        """Write one batch's member (`{member: [n_rows, n_outputs]}`) and ensemble rows
        (`ens_p`: the graph's aggregates, or None: numpy aggregators) to `writer` in the
        request's layout; `batch` has `rows`, `y`, `first_row`, `extra`, `ids`."""
        long = tables.predictions_table(
            "predict", SplitPredictions(member_p, ens_p, batch.rows, batch.y, batch.first_row),
            self.pre.classes, self.names, self.params, task=self.task)
        if self.metadata:  # the run's, beside the table's own (`classes`, `thresholds`)
            long = long.replace_schema_metadata({**(long.schema.metadata or {}),
                                                 **self.metadata})
        writer.write(tables.wide_rows(long, self.answer, batch.extra, batch.ids)
                     if self.request.layout == "wide" else tables.with_ids(long, batch.ids))

    def finish(self, mode: str, rows: int, seconds: float, placed: dict[int, list[str]]
               ) -> dict:
        """The prediction's manifest (run, input, output, `rows`, `seconds`, member ->
        `placed` devices), written beside the output (`write_manifest`)."""
        r = self.request
        return write_manifest(r.out, {
            "run": str(r.run_dir), "run_id": self.manifest.run_id,
            "source": str(r.source), "out": str(r.out), "mode": mode, "rows": rows,
            "batch_size": self.batch_rows, "seconds": seconds,
            "rows_per_second": rows / max(seconds, 1e-9),
            "members": [{"index": i, "devices": d} for i, d in sorted(placed.items())]})

    @property
    def manifest(self) -> Manifest:
        return self.run.manifest

    @property
    def pre(self):
        """The run's preprocessing (`RunContext.preprocessing`)."""
        return self.run.preprocessing

    @property
    def task(self):
        """The run's task (`RunContext.task`): its columns and aggregators."""
        return self.run.task

    @property
    def batch_rows(self) -> int:
        return self.stream.batch_rows  # `--batch-size`, or its default for the run's rows


def open_prediction(request: PredictRequest) -> Prediction:
    """The preamble of a prediction in any mode: check the output name, open the run and its
    input, its aggregators and the wide layout's answer, the members used.

    Raises:
        UsageError: bad run, input, output name or aggregator; nothing written yet.
    """
    from ensemble.runs.preflight import ensemble_members
    from ensemble.runs.posthoc import run_aggregators
    from ensemble.tasks.choice import default_aggregator
    from ensemble.tasks.classification.fitted import member_params
    from ensemble.tasks.regression.tables import transform_metadata

    r = request
    check_out(r.out)
    run, stream = open_input(r)
    names, fit = run_aggregators(r.run_dir, run.manifest)
    answer = default_aggregator(names, fit, r.aggregator)
    used = list(ensemble_members(run.manifest))  # diverged members left out
    return Prediction(r, run, stream, names, answer, used, member_params(fit, used),
                      transform_metadata(run.task))


def predict_in_graph(request: PredictRequest) -> dict:
    """Rebuild the in-graph inference graph on this machine's (or the cluster's) devices and
    predict `request.source` batch by batch into `request.out` (split `predict`).

    `request.replicas`: replicas per member, `auto` (`devices // members`) or an integer
    (`ensemble.replication.placement.replica_devices`); each batch's rows are split across
    them. `request.verbosity`: 0 quiet, 1 progress (`progress.RowProgress`).

    Returns:
        The prediction's manifest (also written to `<out>.manifest.json`).

    Raises:
        UsageError: bad run, input, output name, `replicas` or `aggregator`; nothing is left
            under `out`.
    """
    from ensemble.data.prediction_io import PredictionWriter
    from ensemble.replication.progress import RowProgress

    job = open_prediction(request)
    job.stream.check()
    job.stream.passthrough = request.layout == "wide"
    flat_heap()  # peak memory flat however many batches (see ensemble.data.prediction_io.flat_heap)
    start = time.monotonic()  # the prediction's wall time: loading the members included
    ens, placed = _in_graph_ensemble(job)
    progress = RowProgress(job.stream.n_rows, verbosity=request.verbosity, start=start)
    meta = {"prediction": json.dumps({"mode": "in-graph", "members": {str(i): g for i, g in
                                                                       placed.items()}})}
    with PredictionWriter(request.out, meta) as writer:
        for b in prefetch(job.stream):
            member_p, ens_p = ens.predict(b.x, min(job.batch_rows, GRAPH_BATCH_ROWS))
            job.write(writer, dict(zip(job.used, member_p)), ens_p, b)
            progress.update(len(b.x))
    seconds = progress.end()
    return job.finish("in-graph", progress.rows, seconds, placed)


def _in_graph_ensemble(job: Prediction):
    """The members of `job` loaded onto their devices (replicas included) as one inference
    graph; returns (the `InGraphEnsemble`, member -> its devices)."""
    from ensemble.models.members import load_run_member
    from ensemble.replication.in_graph import InGraphEnsemble
    from ensemble.replication.placement import replica_devices

    r, n = job.request, len(job.used)
    cluster = r.cluster
    if cluster is None and r.cluster_file is not None:
        from ensemble.replication.cluster import load_spec

        cluster = load_spec(r.cluster_file)
    # the run's threads of one op, as its clients use (before resolving initialises TF)
    devices.set_op_threads(job.run.config.training.intra_op_threads)
    groups = replica_devices(n, devices.resolve(r.devices or "auto", n, cluster),
                             r.replicas or "auto")
    copies = [[(load_run_member(r.run_dir, job.manifest, i, d), d) for d in group]
              for i, group in zip(job.used, groups)]
    ens = InGraphEnsemble([c[0][0] for c in copies], [g[0] for g in groups], job.names,
                          indices=job.used, params=job.params, task=job.task)
    ens.set_replicas(dict(enumerate(copies)))
    return ens, dict(zip(job.used, groups))
