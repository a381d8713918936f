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
import time
import os
from pathlib import Path

from ensemble.core import artifacts
from ensemble.replication import devices
from ensemble.runs import prepare as run
from ensemble.core import runlock
from ensemble.tasks import tables
from ensemble.core.errors import UsageError
from ensemble.data import kinds
from ensemble.data.stream import DEFAULT_BATCH_ROWS, flat_heap, prefetch

GRAPH_BATCH_ROWS = 16384  # rows per traced call: bounds the members' activations in memory


def open_input(run_dir: Path, source: str, target: str | None, strict: bool = False,
               batch_rows: int = DEFAULT_BATCH_ROWS, quiet: bool = False,
               trust_builder: bool = False):
    """The run's manifest and preprocessing, and the input as an `InputStream` (columns
    matched by name; extra columns ignored with a notice, or refused when `strict`).

    Returns:
        (manifest, preprocessing, stream).

    The run's files are verified first (`preflight.verify_run`: builder files, members,
    predictions; `trust_builder` accepts a changed builder file and records its sha256).

    Raises:
        UsageError: the run is not completed or damaged, or the source cannot be read.
    """
    from ensemble.runs import preflight

    manifest = artifacts.read_manifest(run_dir)
    runlock.require_free(run_dir)
    run.require_completed(run_dir, manifest)
    preflight.verify_run(run_dir, manifest, trust_builder)
    pre = kinds.read_preprocessing(artifacts.verify(run_dir, manifest,
                                              Path(run_dir) / artifacts.PREPROCESSING))
    target = target or manifest["dataset"].get("target", "target")
    return manifest, pre, kinds.input_stream(pre, source, target, strict, batch_rows, quiet)


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
    if out.suffix not in (".parquet", ".csv"):
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


def record(run_dir: Path, manifest: dict, source: str, out: Path, mode: str, rows: int,
           seconds: float, batch_rows: int, member_devices: dict[int, list[str]]) -> dict:
    """The prediction's manifest: run, input, output, rows, seconds, member -> devices."""
    return {"run": str(run_dir), "run_id": manifest.get("run_id"), "source": str(source),
            "out": str(out), "mode": mode, "rows": rows, "batch_size": batch_rows,
            "seconds": seconds, "rows_per_second": rows / max(seconds, 1e-9),
            "members": [{"index": i, "devices": d} for i, d in sorted(member_devices.items())]}


def predict_in_graph(run_dir: Path, source: str, out: Path, target: str | None = None,
                     device_spec: str = "auto", batch_size: int = DEFAULT_BATCH_ROWS,
                     cluster: dict | None = None, strict_columns: bool = False,
                     replicas: int | str = "auto", verbosity: int = 0,
                     layout: str = "wide", trust_builder: bool = False,
                     aggregator: str | None = None) -> dict:
    """Rebuild the in-graph inference graph on this machine's (or `cluster`'s) devices and
    predict `source` batch by batch into `out` (split `predict`).

    Args:
        batch_size: rows read, predicted and written at a time.
        replicas: replicas per member, `auto` (`devices // members`) or an integer
            (`ensemble.replication.placement.replica_devices`); each batch's rows are split across them.
        verbosity: 0 quiet, 1 progress (`ensemble.replication.progress.RowProgress`).
        layout: `wide` (one row per input: its non-feature columns, the prediction of
            `aggregator`; `tables.wide_rows`) or `long` (a row per model and input).
        aggregator: the aggregator of the `wide` layout (default: the run's best on
            validation NLL, `ensemble.tasks.choice.default_aggregator`).

    Returns:
        The prediction's manifest (also written to `<out>.manifest.json`).

    Raises:
        UsageError: bad run, input, output name, `replicas` or `aggregator`; nothing is left
            under `out`.
    """
    from ensemble.tasks.choice import default_aggregator
    from ensemble.tasks.classification.fitted import member_params
    from ensemble.models.members import load_run_member
    from ensemble.replication.placement import replica_devices
    from ensemble.runs.posthoc import run_aggregators
    from ensemble.replication.progress import RowProgress
    from ensemble.data.stream import PredictionWriter

    from ensemble.runs.preflight import ensemble_members

    check_out(out)
    manifest, pre, stream = open_input(run_dir, source, target, strict_columns, batch_size,
                                       trust_builder=trust_builder)
    aggs, fit = run_aggregators(run_dir, manifest)
    answer = default_aggregator(aggs, fit, aggregator)
    stream.check()
    stream.passthrough = layout == "wide"
    flat_heap()  # peak memory flat however many batches (see ensemble.data.stream.flat_heap)
    start = time.monotonic()  # the prediction's wall time: loading the members included
    used = ensemble_members(manifest)  # diverged members left out
    n = len(used)
    # the run's threads of one op, as its clients use (before resolving initialises TF)
    devices.set_op_threads(manifest["config"]["training"].get("intra_op_threads", 1))
    groups = replica_devices(n, devices.resolve(device_spec, n, cluster), replicas)
    from ensemble.replication.in_graph import InGraphEnsemble

    copies = []
    for i, group in zip(used, groups):
        copies.append([(load_run_member(run_dir, manifest, i, d), d) for d in group])
    params = member_params(fit, used)
    ens = InGraphEnsemble([c[0][0] for c in copies], [g[0] for g in groups], aggs,
                          indices=used, params=params)
    ens.set_replicas(dict(enumerate(copies)))
    placed = dict(zip(used, groups))
    progress = RowProgress(stream.n_rows, verbosity=verbosity, start=start)
    meta = {"prediction": json.dumps({"mode": "in-graph", "members": {str(i): g for i, g in
                                                                       placed.items()}})}
    with PredictionWriter(out, meta) as writer:
        for b in prefetch(stream):
            member_p, ens_p = ens.predict(b.x, min(batch_size, GRAPH_BATCH_ROWS))
            long = tables.predictions_table(dict(zip(used, member_p)), "predict", b.rows,
                                            b.y, pre.classes, aggs, ens_p, params,
                                            first_row=b.first_row)
            writer.write(tables.wide_rows(long, answer, b.extra, b.ids) if layout == "wide"
                         else tables.with_ids(long, b.ids))
            progress.update(len(b.x))
    seconds = progress.end()
    return write_manifest(out, record(run_dir, manifest, source, out, "in-graph",
                                      progress.rows, seconds, batch_size, placed))
