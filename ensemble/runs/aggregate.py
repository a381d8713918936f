"""`ensemble aggregate`: recompute a run's ensemble rows, metrics and fitted aggregators from
its stored member predictions, for runs of either mode, without TensorFlow or retraining.

A between-graph run's member predictions are its clients' files (this is also the aggregator
step of between-graph training, which marks the run completed); an in-graph run's are the
member rows of its `predictions.parquet`. The fitted aggregators fit on the validation rows
only; `aggregators.json` records them and the aggregator list that `predict` then applies.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ensemble.core import artifacts
from ensemble.replication import divergence
from ensemble.core import faults
from ensemble.tasks.classification import fitted
from ensemble.runs import posthoc
from ensemble.runs import members_table
from ensemble.runs.context import RunContext
from ensemble.core.manifest import Manifest
from ensemble.runs import run_status
from ensemble.core import runlock
from ensemble.tasks import eval_writer, tables
from ensemble.tasks.predicted import SplitPredictions
from ensemble import tasks
from ensemble.core.errors import UsageError


def parse_aggregators(text: str | None) -> list[str] | None:
    """`mean,greedy,...` as a list; None for None.

    Raises:
        UsageError: an unknown or repeated name (names it and the known ones).
    """
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in tasks.AGGREGATOR_NAMES]
    if bad or not names or len(set(names)) != len(names):
        raise UsageError("Expected --aggregators as distinct names from "
                         f"{','.join(tasks.AGGREGATOR_NAMES)}. Received: {text!r}")
    return names


def _between_graph_members(run_dir: Path, manifest: Manifest, min_members: int | None
                           ) -> list[Path]:
    """The clients' member files of a between-graph run, checked (present, unchanged, no
    client writing them). Raises UsageError naming missing members."""
    indices = [m.index for m in manifest.members
               if m.status != divergence.STATUS]  # left out of every aggregate
    if not indices:
        raise divergence.all_diverged(manifest.diverged())
    have = [i for i in indices if artifacts.member_predictions_path(run_dir, i).is_file()
            and manifest.member(i).status != "failed"]
    missing = sorted(set(indices) - set(have))
    if missing and (min_members is None or len(have) < min_members):
        need = f"at least {min_members}" if min_members else "all"
        raise UsageError(
            f"Members {missing} have no predictions ("
            f"{artifacts.member_predictions_path(run_dir, missing[0])} missing or failed); "
            f"the aggregator needs {need} of {len(indices)} members. Run their clients "
            "(`ensemble client --run RUN --member I`) or pass --min-members K.")
    for i in have:
        runlock.require_free(run_dir, i)  # no client is still writing it
        for path in artifacts.member_files(run_dir, i):  # the model too: present and unchanged
            artifacts.verify(run_dir, manifest, path)
    return [artifacts.member_predictions_path(run_dir, i) for i in have]


def aggregate_run(run_dir: Path, aggregators: Sequence[str] | None = None,
                  min_members: int | None = None, trust_builder: bool = False, *,
                  member_files: bool) -> Manifest:
    """Recompute a run's ensemble from its member predictions and write `predictions.parquet`,
    `metrics.parquet`, `aggregators.json`, `ensemble_size.parquet` and `members.parquet`
    (between-graph: also `history.parquet`, and the run is marked completed).

    Args:
        aggregators: names to apply (default: the run's `aggregators.json` list, else its
            config's).
        min_members: between-graph: aggregate a partial ensemble of at least this many members;
            the manifest and the predictions' metadata record which were used.
        trust_builder: accept a builder file whose sha256 changed (`runs.preflight`).
        member_files: the run's mode writes each member's files (`Mode.member_files`, as
            between-graph clients do), which this combines; else `predictions.parquet` holds
            every member's rows.

    Returns:
        The final manifest.

    Raises:
        UsageError: not a run, `min_members` beyond the run's members, a damaged or
        unhashed file, members missing, an in-graph run
        that is not completed, or a run (or member) another process holds (`runlock`).
    """
    run_dir = Path(run_dir)
    manifest = Manifest.load(run_dir)  # a run directory, before its lock file is made
    n = len(manifest.members)
    if min_members is not None and not 1 <= min_members <= n:
        raise UsageError(f"Expected --min-members in 1..{n} (run {run_dir} has {n} members). "
                         f"Received: {min_members}")
    with runlock.writing(run_dir, "ensemble aggregate"), faults.failing_run_on_fault(
            run_dir, "aggregate"):
        return _aggregate(run_dir, aggregators, min_members, trust_builder, member_files)


def _aggregate(run_dir: Path, aggregators: Sequence[str] | None, min_members: int | None,
               trust_builder: bool, between: bool) -> Manifest:
    from ensemble.runs import preflight

    start = time.perf_counter()
    manifest = Manifest.load(run_dir)
    preflight.check_builders(run_dir, manifest, trust_builder)  # a run's files before use
    ctx = RunContext.open(run_dir, manifest)
    cfg, task = ctx.config, ctx.task
    settings = dataclasses.asdict(cfg.aggregation)
    if aggregators is None:  # the run's: those of its last finished aggregation, if any
        path = run_dir / fitted.FILENAME
        # an unrecorded file is no aggregation's result but what a killed aggregator left
        # (SIGTERM to its launcher): never read, rewritten below
        old = fitted.read(artifacts.verify(run_dir, manifest, path).parent) \
            if path.is_file() and fitted.FILENAME in manifest.hashes() else None
        aggregators = old["aggregators"] if old else task.applied_aggregators(
            cfg.aggregation.aggregators)
    task.check_aggregators(aggregators)
    if between:
        paths = _between_graph_members(run_dir, manifest, min_members)
    elif manifest.failed_by != "aggregate":  # a fault in aggregate: it may redo it
        run_status.require_completed(run_dir, manifest)
    if not between:
        preflight.check_predictions(run_dir, manifest,
                                    preflight.check_members(run_dir, manifest))
        paths = [artifacts.verify(run_dir, manifest, run_dir / artifacts.PREDICTIONS)]
    classes = np.asarray(manifest.dataset.classes)
    with eval_writer.output_files(run_dir) as files:  # the members' rows, memory-mapped
        splits = posthoc.read_members(paths, task, classes, files)
        _write_tables(ctx, splits, classes, aggregators, settings, between)
    manifest.failed_by = None
    run_status.finish(run_dir, manifest, "completed", aggregate_seconds=time.perf_counter() - start)
    return manifest


def _write_tables(ctx: RunContext, splits: dict, classes: np.ndarray,
                  aggregators: Sequence[str], settings: dict, between: bool) -> None:
    """Fit the aggregators on the members' validation rows `splits` and write the run's
    `aggregators.json`, `ensemble_size.parquet`, `predictions.parquet`, `metrics.parquet`,
    `members.parquet` (between-graph: `history.parquet`, the members marked completed),
    streamed from the arrays (`eval_writer`: flat memory at any size)."""
    run_dir, manifest, task = ctx.path, ctx.manifest, ctx.task
    fit = posthoc.fit(task, splits, aggregators, settings)
    used = splits["validation"].members
    posthoc.write_fit(run_dir, task, fit, splits, settings)
    eval_writer.write(run_dir, {k: SplitPredictions(dict(zip(s.members, s.probs)), None,
                                                    s.rows, s.y)
                                for k, s in splits.items()},
                      task, classes, aggregators, fit["params"],
                      {b"members": json.dumps(used).encode()},
                      posthoc.run_prior(run_dir, task, classes), best_member=fit["best_member"])
    history = None  # not written here: `members_table` reads the run's
    if between:
        history = [r for i in used
                   for r in artifacts.read_parquet(artifacts.verify(
                       run_dir, manifest, artifacts.member_history_path(run_dir, i))).to_pylist()]
        history = tables.history_table(history, task.score_names)
        artifacts.write_parquet(run_dir / artifacts.HISTORY, history)
        history = history.to_pylist()
        for i in used:
            manifest.member(i).status = "completed"
        manifest.aggregated_members = used
    members_table.write(ctx, splits.get("validation"), history, fit)  # held: not read back
