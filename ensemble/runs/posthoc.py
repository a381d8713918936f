"""Post hoc aggregation: ensemble rows, fitted parameters and the size curve from stored member
predictions, for runs of either replication mode. Numpy, SciPy and scikit-learn only: this
module never imports TensorFlow (`ensemble aggregate` runs without it).

A *member table* is a predictions table's member rows (from `predictions.parquet` or the
between-graph clients' `members/member-<i>.predictions.parquet` files, concatenated). The
fitted aggregators see only its `validation` rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.core import artifacts
from ensemble.core.manifest import Manifest
from ensemble.tasks.classification import fitted
from ensemble.tasks import tables
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


def run_prior(run_dir: str | Path, task, classes: np.ndarray) -> list | dict | None:
    """The `task`'s prior (`Task.prior`, the metrics tables' baseline row) of a run's prepared
    training split (its labels only), None when the run directory holds none."""
    try:
        y = artifacts.read_split(Path(run_dir), "train")[1]
    except UsageError:
        return None
    return task.prior(classes, y)


def member_rows(predictions: pa.Table) -> pa.Table:
    """The member rows of a predictions table (ensemble rows dropped)."""
    return predictions.filter(pc.is_valid(predictions.column("member")))


def by_split(members_table: pa.Table, task) -> dict[str, SplitMembers]:
    """Split a member table into `{split: SplitMembers}` (splits in table order), each
    member's outputs read by the run's `task` (`Task.outputs_of`).

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
            probs.append(task.outputs_of(t, classes))
        y = first.column("y_true")
        y = None if y.null_count else encode(y.to_numpy(zero_copy_only=False), classes)
        out[split] = SplitMembers(members, np.stack(probs),
                                  first.column("source_row").to_numpy(), y)
    return out


def read_members(paths: Sequence[Path], task, classes: np.ndarray, files,
                 batch_rows: int = 65536) -> dict[str, SplitMembers]:
    """The member rows of predictions files (between-graph clients' member files, or a run's
    `predictions.parquet`) read `batch_rows` rows at a time (Parquet page checksums verified)
    into `{split: SplitMembers}` whose `probs` are memory maps of `files`
    (`eval_writer.OutputFiles`): `[n_members, n_rows, k]` outputs of the run's `task`
    (`Task.outputs_of`: probabilities, a regression member's mean and variance, ...), each
    row at its column `row`; splits in the order of their first row, members sorted.

    Raises:
        UsageError: a damaged file (names it); members whose rows of a split do not line up
            (`source_row`), or a `row` outside its split.
    """
    import pyarrow.parquet as pq

    wanted = ["split", "member", "row", "source_row", "y_true", *task.output_columns(classes)]
    k = len(task.output_columns(classes))

    def batches(path):
        try:
            f = pq.ParquetFile(path, page_checksum_verification=True, pre_buffer=False)
            for batch in f.iter_batches(batch_size=batch_rows, columns=wanted):
                batch = batch.filter(pc.is_valid(batch.column("member")))
                for split in pc.unique(batch.column("split")).to_pylist():
                    part = batch.filter(pc.equal(batch.column("split"), split))
                    for m in pc.unique(part.column("member")).to_pylist():
                        yield split, m, part.filter(pc.equal(part.column("member"), m))
        except (pa.ArrowInvalid, OSError) as exc:
            raise UsageError(f"Damaged or invalid Parquet file {path}: {exc}") from None

    counts: dict[str, dict[int, int]] = {}
    for path in paths:  # pass 1: rows per split and member
        for split, m, part in batches(path):
            counts.setdefault(split, {}).setdefault(m, 0)
            counts[split][m] += part.num_rows
    out: dict[str, SplitMembers] = {}
    labelled: dict[str, bool] = {}
    for split, per_member in counts.items():
        members = sorted(per_member)
        n = per_member[members[0]]
        probs = files.new((len(members), n, k), task.output_dtype)
        y = np.zeros(n, task.target_dtype)
        out[split] = SplitMembers(members, probs, np.full(n, -1, np.int64), y)
        labelled[split] = True
    seen: dict[str, np.ndarray] = {s: np.zeros(len(o.rows), bool) for s, o in out.items()}
    for path in paths:  # pass 2: each row at its place
        for split, m, part in batches(path):
            s = out[split]
            rows = part.column("row").to_numpy().astype(np.int64)
            if len(rows) and (rows.min() < 0 or rows.max() >= len(s.rows)):
                raise UsageError(f"Rows of member {m} on split {split!r} do not match the "
                                 "other members' rows.")
            source = part.column("source_row").to_numpy().astype(np.int64)
            s.probs[s.members.index(m), rows] = task.outputs_of(part, classes)
            if m == s.members[0]:
                s.rows[rows] = source
                seen[split][rows] = True
                y_true = part.column("y_true")
                if y_true.null_count:
                    labelled[split] = False
                else:
                    s.y[rows] = encode(y_true.to_numpy(zero_copy_only=False), classes)
            elif not np.array_equal(s.rows[rows], source) and seen[split][rows].all():
                raise UsageError(f"Rows of member {m} on split {split!r} do not match the "
                                 "other members' rows.")
    for split, s in out.items():
        for m, n in counts[split].items():
            if n != len(s.rows):
                raise UsageError(f"Rows of member {m} on split {split!r} do not match the "
                                 "other members' rows.")
        if not labelled[split]:
            out[split] = SplitMembers(s.members, s.probs, s.rows, None)
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


def rebuild(splits: dict[str, SplitMembers], task, classes: np.ndarray, names: Sequence[str],
            params: dict[str, Any] | None) -> pa.Table:
    """Member rows and the `task`'s numpy aggregators' ensemble rows of every split."""
    parts = [tables.predictions_table(split, SplitPredictions(dict(zip(s.members, s.probs)),
                                                              None, s.rows, s.y),
                                      classes, names, params, task=task)
             for split, s in splits.items()]
    return pa.concat_tables(parts).replace_schema_metadata(parts[0].schema.metadata)


def size_curve(task, splits: dict[str, SplitMembers], fit: dict[str, Any] | None,
               settings: dict[str, Any] | None = None) -> pa.Table | None:
    """`ensemble_size.parquet`: the `task`'s curve (`Task.size_table`) on every labelled
    split, None when the task has none. Its selection order is that of the task's selecting
    aggregator (`Task.selection`) in `fit`, or of that aggregator fitted on validation for
    it; both curves stop at the run's member count (the selection's later picks, with
    repeats, are left out, so k never exceeds the members there are)."""
    greedy = task.selected(fit)
    val = splits.get("validation")
    if (greedy is None and task.selection is not None and val is not None
            and val.y is not None):
        rounds = int((settings or {}).get("greedy_rounds", 20))
        greedy = task.selection.fit_on(val.probs, val.y, {"greedy_rounds": rounds})
    labelled = {k: s for k, s in splits.items() if s.y is not None}
    n_members = max((len(s.probs) for s in labelled.values()), default=0)
    return task.size_table({k: s.probs for k, s in labelled.items()},
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
        data = artifacts.read_verified(run_dir, manifest, path)  # hashed as read: one read
        with artifacts.opened(path, "aggregators file"):
            fit_ = json.loads(data)
            _check_fit(fit_, task)
        return list(fit_["aggregators"]), fit_
    names = task.applied_aggregators(manifest.config["aggregation"]["aggregators"])
    if task.fitted_names(names):
        raise UsageError(f"Run {run_dir} names fitted aggregators but has no "
                         f"{fitted.FILENAME}; run `ensemble aggregate --run {run_dir}`.")
    return names, None


def write_fit(run_dir: str | Path, task, fit_: dict[str, Any], splits: dict[str, SplitMembers],
              settings: dict[str, Any] | None = None) -> None:
    """Write `aggregators.json` and (when the task has a size curve) `ensemble_size.parquet`
    of a run of `task`, atomically."""
    fitted.write(run_dir, fit_)
    curve = size_curve(task, splits, fit_, settings)
    if curve is not None:
        artifacts.write_parquet(Path(run_dir) / SIZE_CURVE, curve)
