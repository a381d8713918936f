"""Post hoc aggregation: ensemble rows, fitted parameters and the size curve from stored member
predictions, for runs of either replication mode. Numpy, SciPy and scikit-learn only: this
module never imports TensorFlow (`ensemble aggregate` runs without it).

A *member table* is a predictions table's member rows (from `predictions.parquet` or the
between-graph clients' `members/member-<i>.predictions.parquet` files, concatenated). The
fitted aggregators see only its `validation` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.core import artifacts
from ensemble.core.record import Manifest
from ensemble.tasks.classification import fitted
from ensemble.tasks import metrics_tables, tables
from ensemble.tasks.predicted import SplitPredictions
from ensemble.core.labels import encode
from ensemble.core.errors import UsageError

SIZE_CURVE = "ensemble_size.parquet"


@dataclass
class SplitMembers:
    """The member predictions of one split: `members` `[n_members]` indices (sorted),
    `probs` `[n_members, n_rows, n_classes]`, `rows` `[n_rows]` source rows, `y` `[n_rows]`
    class indices or None."""

    members: list[int]
    probs: np.ndarray
    rows: np.ndarray
    y: np.ndarray | None


def prior(classes: np.ndarray, y_train: np.ndarray | None) -> list | dict | None:
    """The run's prior, the metrics tables' baseline row (`eval_writer.write`): the training
    split's class shares `[n_classes]` (from its class indices `y_train`), or for regression
    (no `classes`) its targets' `{"mean", "std"}` (population std, target units); None without
    training labels, or for a constant regression target (a Gaussian of std 0 has no NLL)."""
    if y_train is None or len(y_train) == 0:
        return None
    if len(classes):
        counts = np.bincount(np.asarray(y_train, np.int64), minlength=len(classes))
        return (counts[:len(classes)] / counts.sum()).tolist()
    y = np.asarray(y_train, np.float64)
    std = float(np.std(y))
    return {"mean": float(np.mean(y)), "std": std} if std > 0 else None


def run_prior(run_dir: str | Path, classes: np.ndarray) -> list | dict | None:
    """`prior` of a run's prepared training split (its labels only), None when the run
    directory holds none."""
    try:
        y = artifacts.read_split(Path(run_dir), "train")[1]
    except UsageError:
        return None
    return prior(classes, y)


def member_rows(predictions: pa.Table) -> pa.Table:
    """The member rows of a predictions table (ensemble rows dropped)."""
    return predictions.filter(pc.is_valid(predictions.column("member")))


def by_split(members_table: pa.Table) -> dict[str, SplitMembers]:
    """Split a member table into `{split: SplitMembers}` (splits in table order).

    Raises:
        UsageError: members whose rows of a split do not line up (`source_row`).
    """
    classes = tables.classes_from(members_table)
    out = {}
    for split in dict.fromkeys(members_table.column("split").to_pylist()):
        part = members_table.filter(pc.equal(members_table.column("split"), split))
        members = sorted(set(part.column("member").to_pylist()))
        probs, first = [], None
        for m in members:
            t = part.filter(pc.equal(part.column("member"), m))
            t = t.take(pc.sort_indices(t.column("row")))
            if first is None:
                first = t
            elif t.column("source_row") != first.column("source_row"):
                raise UsageError(f"Rows of member {m} on split {split!r} do not match the other "
                                 "members' rows.")
            probs.append(tables.probabilities(t, classes))
        y = first.column("y_true")
        y = None if y.null_count else encode(y.to_numpy(zero_copy_only=False), classes)
        out[split] = SplitMembers(members, np.stack(probs),
                                  first.column("source_row").to_numpy(), y)
    return out


def fit(task, splits: dict[str, SplitMembers], names: Sequence[str],
        settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fit the fitted aggregators of `names` on the `validation` split only (the run's `task`,
    `ensemble.tasks.base.Task.fit_aggregators`); returns the content of `aggregators.json`.
    Prints a notice when fitted aggregators get fewer than `crossfit.SMALL_VALIDATION` rows.

    Raises:
        UsageError: no labelled validation split.
    """
    from ensemble.core.notices import notice
    from ensemble.tasks import crossfit

    val = splits.get("validation")
    if val is None or val.y is None:
        raise UsageError("Fitting aggregators needs the members' labelled validation "
                         "predictions; this run has none.")
    small = crossfit.small_validation_notice(len(val.y), task.fitted_names(names))
    if small:
        notice(small)
    fit_ = task.fit_aggregators(val.probs, val.y, names, val.members, settings)
    if fit_["out_of_fold"]["mistakes"] == 0 and task.fitted_names(names):
        rows = fit_["out_of_fold"]["rows"]
        rows = f"{rows}" if rows == len(val.y) else f"{rows} sampled"  # crossfit.MAX_ROWS
        notice(f"the mean gets all {rows} validation rows right, so "
               f"their NLL cannot judge the fitted aggregators "
               f"({', '.join(task.fitted_names(names))}): predict's default stays with one "
               "that fits nothing; name a fitted one with `--aggregator NAME`.")
    return fit_


def rebuild(splits: dict[str, SplitMembers], classes: np.ndarray, names: Sequence[str],
            params: dict[str, Any] | None) -> pa.Table:
    """Member rows and the numpy aggregators' ensemble rows of every split."""
    parts = [tables.predictions_table(split, SplitPredictions(dict(zip(s.members, s.probs)),
                                                              None, s.rows, s.y),
                                      classes, names, params)
             for split, s in splits.items()]
    return pa.concat_tables(parts).replace_schema_metadata(parts[0].schema.metadata)


def size_curve(task, splits: dict[str, SplitMembers], fit: dict[str, Any] | None,
               settings: dict[str, Any] | None = None) -> pa.Table:
    """`ensemble_size.parquet`: the curve of `metrics_tables.ensemble_size_table` on every labelled
    split, the greedy order from `fit` (or the `task`'s greedy selection run on validation for
    it); both curves stop at the run's member count (greedy's later picks, with repeats, are
    left out, so k never exceeds the members there are)."""
    greedy = (fit or {}).get("params", {}).get("greedy")
    val = splits.get("validation")
    if greedy is None and val is not None and val.y is not None:
        rounds = int((settings or {}).get("greedy_rounds", 20))
        greedy = task.aggregators["greedy"].fit_on(val.probs, val.y, {"greedy_rounds": rounds})
    labelled = {k: s for k, s in splits.items() if s.y is not None}
    n_members = max((len(s.probs) for s in labelled.values()), default=0)
    return metrics_tables.ensemble_size_table({k: s.probs for k, s in labelled.items()},
                                      {k: s.y for k, s in labelled.items()},
                                      list(greedy["order"])[:n_members] if greedy else None)


def _check_fit(fit_: Any, task) -> None:
    """Refuse an `aggregators.json` of the wrong shape or naming an aggregator `task` does not
    have (ValueError, turned into one line naming the file by `artifacts.opened`)."""
    known = tuple(task.aggregators)
    names = fit_.get("aggregators") if isinstance(fit_, dict) else None
    if not isinstance(names, list) or not names:
        raise ValueError("expected an object whose `aggregators` is a non-empty list")
    for name in names:
        if name not in known:
            raise ValueError(f"unknown aggregator {name!r}; expected one of {', '.join(known)}")
    if not isinstance(fit_.get("params", {}), dict):
        raise ValueError("expected `params` to be an object")


def run_aggregators(run_dir: str | Path, manifest: Manifest
                    ) -> tuple[list[str], dict[str, Any] | None]:
    """The aggregators a run applies and its fitted parameters: `aggregators.json` (checked
    against the manifest's sha256) when the run has one, else the config's list.

    Returns:
        (aggregator names, the `aggregators.json` content or None).
    """
    from ensemble import tasks

    task = tasks.for_run(manifest)
    path = Path(run_dir) / fitted.FILENAME
    if path.is_file():
        artifacts.verify(run_dir, manifest, path)
        with artifacts.opened(path, "aggregators file"):
            fit_ = fitted.read(run_dir)
            _check_fit(fit_, task)
        return list(fit_["aggregators"]), fit_
    names = task.applied_aggregators(manifest.config["aggregation"]["aggregators"])
    if task.fitted_names(names):
        raise UsageError(f"Run {run_dir} names fitted aggregators but has no "
                         f"{fitted.FILENAME}; run `ensemble aggregate --run {run_dir}`.")
    return names, None


def write_fit(run_dir: str | Path, task, fit_: dict[str, Any], splits: dict[str, SplitMembers],
              settings: dict[str, Any] | None = None) -> None:
    """Write `aggregators.json` and `ensemble_size.parquet` of a run of `task` (atomically)."""
    fitted.write(run_dir, fit_)
    artifacts.write_parquet(Path(run_dir) / SIZE_CURVE, size_curve(task, splits, fit_, settings))
