"""`ensemble evaluate`: the table of the ensemble against its members.

Metrics are recomputed from the predictions file (never trusted from elsewhere), written to
the metrics Parquet, and printed: every member, the mean member, the best member (highest
accuracy), each ensemble aggregator, and the ensemble gain over the mean and the best member.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ensemble import artifacts, run, tables
from ensemble.errors import UsageError
from ensemble.metrics import METRICS

LOWER_IS_BETTER = {"nll", "brier", "ece"}


def _row(name: str, values: dict) -> str:
    return f"{name:<28}" + "".join(f"{values[m]:>10.4f}" for m in METRICS)


def _gain(ens: dict, ref: dict) -> dict:
    """Improvement of `ens` over `ref`, positive = ensemble better."""
    return {m: (ref[m] - ens[m]) if m in LOWER_IS_BETTER else (ens[m] - ref[m]) for m in METRICS}


def format_table(metrics: pa.Table, split: str) -> str:
    """Render the evaluation table of one split.

    Raises:
        UsageError: the metrics hold no row for `split`.
    """
    part = metrics.filter(pc.equal(metrics.column("split"), split)).to_pylist()
    if not part:
        raise UsageError(f"No labelled rows for split {split!r}; cannot evaluate.")
    members = [r for r in part if r["member"] is not None]
    ensembles = [r for r in part if r["aggregator"] is not None]
    lines = [f"split: {split} ({part[0]['n']} rows), {len(members)} members",
             f"{'model':<28}" + "".join(f"{m:>10}" for m in METRICS)]
    lines += [_row(r["model"], r) for r in members]
    if members:
        mean = {m: sum(r[m] for r in members) / len(members) for m in METRICS}
        best = max(members, key=lambda r: (r["accuracy"], -r["nll"]))
        lines += [_row("mean member", mean), _row(f"best member ({best['model']})", best)]
    lines += [_row(r["model"], r) for r in ensembles]
    if members and ensembles:
        lines.append("ensemble gain (positive = ensemble better)")
        for r in ensembles:
            lines.append(_row(f"{r['model']} vs mean member", _gain(r, mean)))
            lines.append(_row(f"{r['model']} vs best member", _gain(r, best)))
        if ensembles[0].get("disagreement") is not None:
            lines.append(f"member disagreement: {ensembles[0]['disagreement']:.4f}")
    return "\n".join(lines)


def evaluate(run_dir: Path | None, predictions: Path | None = None) -> tuple[pa.Table, str]:
    """Recompute the metrics of a run's (or a predictions file's) predictions and write them.

    Writes `metrics.parquet` in the run (for the run's own predictions) or
    `<predictions stem>.metrics.parquet` beside a given predictions file.

    Returns:
        (metrics table, the printed text: one table per labelled split, test first).

    Raises:
        UsageError: no run/predictions, or a predictions file without labels.
    """
    if predictions is None:
        if run_dir is None:
            raise UsageError("Expected --run PATH or --predictions FILE.parquet.")
        manifest = artifacts.read_manifest(run_dir)
        run.require_completed(run_dir, manifest)
        predictions = artifacts.verify(run_dir, manifest, Path(run_dir) / artifacts.PREDICTIONS)
        out = Path(run_dir) / artifacts.METRICS
    else:
        out = predictions.with_name(predictions.stem + ".metrics.parquet")
    table = tables.metrics_table(artifacts.read_parquet(predictions))
    if table.num_rows == 0:
        raise UsageError(f"{predictions} has no rows with a known y_true; cannot evaluate.")
    artifacts.write_parquet(out, table)
    splits = sorted(set(table.column("split").to_pylist()),
                    key=lambda s: ["test", "predict", "validation", "train"].index(s))
    return table, "\n\n".join(format_table(table, s) for s in splits)
