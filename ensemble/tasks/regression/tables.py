"""The Parquet tables of a regression run: predictions, metrics and the ensemble-size curve.

`predictions.parquet` of a regression run (docs/reference/run-directory.md) has, besides
`model`, `member`, `aggregator`, `split`, `row` and `source_row`: `y_true` (float64, null when unknown),
`y_pred` (the predictive mean), `std` (the predictive standard deviation), and for ensemble
rows `aleatoric_std` and `epistemic_std` (`std^2 = aleatoric_std^2 + epistemic_std^2`; null
on member rows), all float64 in the target's units. Its Parquet key-value metadata hold
`task = regression`, `classes = []` and `mixture`: each aggregator's member weights and std
scale, so the exact mixture behind an ensemble row can be rebuilt from the file alone, and
under a target transform `target_transform` (`log1p`, `log`): `y_pred` and `std` are then the
log-normals' moments, and the metrics the log-normals' (`running.Running`).
`ensemble.tasks.tables` dispatches here for a run without classes.
"""

from __future__ import annotations

import json
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from ensemble.tasks.regression import aggregators as R
from ensemble.tasks.regression import metrics as RM
from ensemble.tasks.regression import running
from ensemble.tasks.model_arrays import PredictionArrays
from ensemble.tasks.predicted import SplitPredictions
from ensemble.tasks.table_parts import (PRIOR, ModelRows, chunks, key_columns,
                                         metrics_schema, prior_of, size_table, source_row)

CHUNK_ROWS = 65536  # rows of one model's outputs scored at a time
COLUMNS = ("y_true", "y_pred", "std", "aleatoric_std", "epistemic_std")


def transform_metadata(task) -> dict[bytes, bytes]:
    """`{b"target_transform": name}` of a task with a target transform, else `{}`."""
    t = task.transform
    return {} if t is None else {b"target_transform": t.name.encode()}


def transform_of(meta: dict | None):
    """The `transform.TargetTransform` a table's metadata names, or None."""
    from ensemble.tasks.regression import transform

    name = (meta or {}).get(b"target_transform")
    return None if name is None else transform.get(name.decode())


def metadata(params: dict | None, aggregators: Sequence[str], n_members: int
             ) -> dict[bytes, bytes]:
    """Parquet metadata of a regression predictions table (see the module docstring)."""
    mix = {a: {"weights": R.member_weights(a, n_members, (params or {}).get(a)).tolist(),
               "scale": float(((params or {}).get(a) or {}).get("scale", 1.0))
               if a == "std-scaling" else 1.0} for a in aggregators}
    return {b"classes": b"[]", b"task": b"regression", b"mixture": json.dumps(mix).encode()}


def model_rows(key: ModelRows, y_true: np.ndarray | None, outputs: np.ndarray) -> pa.Table:
    """Prediction rows of one model on one split.

    Args:
        key: the model, split and rows (`ensemble.tasks.table_parts.ModelRows`).
        y_true: `[n_rows]` targets (NaN: unknown, null in `y_true`), or None when unknown.
        outputs: a member's `[n_rows, 2]` (mean, variance) or an aggregator's `[n_rows, 3]`
            (mean, aleatoric variance, epistemic variance), target units.
    """
    n = len(key.rows)
    out = np.asarray(outputs, np.float64)
    if out.shape[1] == 3:
        std, ale, epi = R.std_of(out)
        ale, epi = pa.array(ale), pa.array(epi)
    else:
        std, ale, epi = np.sqrt(out[:, 1]), pa.nulls(n, pa.float64()), pa.nulls(n, pa.float64())
    return pa.table({
        **key_columns(key),
        "y_true": pa.nulls(n, pa.float64()) if y_true is None
        else pa.array(y := np.asarray(y_true, np.float64), mask=np.isnan(y)),
        "y_pred": pa.array(out[:, 0]),
        "std": pa.array(std),
        "aleatoric_std": ale, "epistemic_std": epi,
        "source_row": source_row(key),
    })


def predictions_table(split: str, pred: SplitPredictions, aggregators: Sequence[str] = (),
                      params: dict | None = None) -> pa.Table:
    """Member rows and ensemble rows of one split (`ensemble.tasks.tables.predictions_table` for
    regression): `pred.members` index -> `[n_rows, 2]`; `pred.ensembles` aggregator ->
    `[n_rows, 3]`, computed with `ensemble.tasks.regression.aggregators.aggregate` when None."""
    params = params or {}
    parts = prediction_chunks(split, pred, aggregators, params, max(1, len(pred.rows)))
    return pa.concat_tables(parts).replace_schema_metadata(
        metadata(params, aggregators, len(pred.members)))


def prediction_chunks(split: str, pred: SplitPredictions, aggregators: Sequence[str],
                      params: dict | None = None, chunk_rows: int = 65536
                      ) -> Iterator[pa.Table]:
    """`predictions_table`'s rows of `pred` as tables of at most `chunk_rows` rows, model by
    model, in its order (`ensemble.tasks.tables.prediction_chunks` for regression)."""
    params = params or {}
    ensembles = pred.ensembles
    if ensembles is None:
        stacked = np.stack([o for _, o in sorted(pred.members.items())])
        ensembles = {a: R.aggregate(stacked, a, params.get(a)) for a in aggregators}
    for key, y, out, _ in chunks(split, pred, ensembles, aggregators, chunk_rows):
        yield model_rows(key, y, out)


def outputs(table: pa.Table) -> np.ndarray:
    """A member's `[n_rows, 2]` (mean, variance) from its rows' `y_pred` and `std`."""
    return np.column_stack([table.column("y_pred").to_numpy(),
                            table.column("std").to_numpy() ** 2])


GAINS, METRICS_SCHEMA = metrics_schema(RM.METRICS, ("disagreement", "mean_epistemic_std"),
                                       RM.GAIN_METRICS)


def gain(ensemble: float | None, reference: float | None, metric: str) -> float | None:
    """Ensemble gain on `metric`, positive = ensemble better; None when either is None."""
    if ensemble is None or reference is None:
        return None
    return reference - ensemble if metric in RM.LOWER_IS_BETTER else ensemble - reference


def _key(r: dict) -> tuple:
    return (np.inf if r["nll"] is None else r["nll"], r["rmse"], r["member"])


def metrics_table(arrays: PredictionArrays, best_member: int | None = None) -> pa.Table:
    """One row per model and split with `n` and every metric of
    `ensemble.tasks.regression.metrics.METRICS`; rows with unknown `y_true` are left out. An
    ensemble row's `mixture_nll` is the exact mixture's (its member rows on that split and
    the weights and scale of the table's `mixture` metadata). Ensemble rows also carry the
    members' `disagreement` (mean std of the member means), `mean_epistemic_std`,
    `best_member` (lowest validation NLL, then RMSE; or `best_member`), and the gains
    `gain_vs_{mean,best}_<metric>` over the mean and the best member (positive = better).

    Args:
        arrays: a predictions file's arrays (`model_arrays.read`; `Task.metrics_table`
            reads a table).
    """
    mix = json.loads(arrays.metadata.get(b"mixture", b"{}"))
    outputs = {}
    for split in sorted(arrays.splits):
        outputs[split] = []
        for a in arrays.of_split(split):
            a = a.by_row()
            epi = None if a.aggregator is None else float(np.mean(a.extra))
            outputs[split].append(ModelOutput(a.model, a.member, a.aggregator, a.y,
                                              a.values[:, 0], a.values[:, 1], epi))
    return metrics_of({s: o for s, o in outputs.items() if o}, mix, best_member,
                      prior_of(arrays.metadata), transform=transform_of(arrays.metadata))


class ModelOutput(NamedTuple):
    """One model's labelled rows of one split, in row order: `y`, `mu` (the predictive mean)
    and `sd` (its std) `[n_rows]` float64, target units; `mean_epistemic_std` for ensemble
    rows (None for members)."""

    model: str
    member: int | None
    aggregator: str | None
    y: np.ndarray
    mu: np.ndarray
    sd: np.ndarray
    mean_epistemic_std: float | None = None


def split_outputs(member_outputs: dict[int, np.ndarray], y: np.ndarray,
                  aggregators: Sequence[str], ensemble_outputs: dict[str, np.ndarray]
                  ) -> list[ModelOutput]:
    """The `ModelOutput`s of one labelled split from the arrays a run predicted: members'
    `[n_rows, 2]` (mean, variance), aggregators' `[n_rows, 3]` (as `model_rows` stores them,
    without building the rows)."""
    y = np.asarray(y, np.float64)
    out = []
    for i, o in sorted(member_outputs.items()):
        o = np.asarray(o, np.float64)
        out.append(ModelOutput(f"member-{i}", i, None, y, o[:, 0], np.sqrt(o[:, 1])))
    for a in aggregators:
        e = np.asarray(ensemble_outputs[a], np.float64)
        std, _, epi = R.std_of(e)
        out.append(ModelOutput(f"ensemble-{a}", None, a, y, e[:, 0], std,
                               float(np.mean(epi))))
    return out


def metrics_of(outputs: dict[str, list[ModelOutput]], mix: dict,
               best_member: int | None = None, prior: dict | None = None,
               chunk_rows: int = CHUNK_ROWS, transform=None) -> pa.Table:
    """`metrics_table`'s rows from each split's `ModelOutput`s, each model's metrics over
    chunks of `chunk_rows` rows (`running.Running`; its arrays may be memory maps); `mix`: the
    `mixture` metadata (`metadata`: each aggregator's member weights and std scale); `prior`:
    the training split's `{"mean", "std"}`, the Gaussian of a `prior` row per split;
    `transform`: a target transform's `TargetTransform` (log-normals with the rows'
    moments, the prior's too), None for Gaussians."""
    out = []
    for split, models in sorted(outputs.items()):
        if prior is not None and models:
            y = models[0].y
            models = [*models, ModelOutput(
                PRIOR, None, None, y, np.broadcast_to(np.float64(prior["mean"]), y.shape),
                np.broadcast_to(np.float64(prior["std"]), y.shape))]
        members = sorted((o for o in models if o.member is not None), key=lambda o: o.member)
        for o in models:
            row = {"model": o.model, "member": o.member, "aggregator": o.aggregator,
                   "split": split, "n": len(o.y), "mean_epistemic_std": o.mean_epistemic_std}
            acc, spread = running.Running(transform), 0.0
            m = mix.get(o.aggregator, {"weights": None, "scale": 1.0})
            for lo in range(0, len(o.y), chunk_rows):
                span = slice(lo, lo + chunk_rows)
                if o.aggregator is None or not members:
                    acc.update(o.y[span], o.mu[span], o.sd[span])
                    continue
                stacked = np.stack([np.column_stack([np.asarray(x.mu[span], np.float64),
                                                     np.asarray(x.sd[span], np.float64) ** 2])
                                    for x in members])
                mu_m, var_m, w = R.components(stacked, o.aggregator,
                                              {"weights": m["weights"], "scale": m["scale"]})
                acc.update(o.y[span], o.mu[span], o.sd[span], mu_m, var_m, w)
                spread += R.disagreement(stacked) * stacked.shape[1]
            row.update(acc.result())
            if o.aggregator is not None and members:
                row["disagreement"] = spread / len(o.y)
            out.append(row)
    for split in {r["split"] for r in out}:
        _gains([r for r in out if r["split"] == split], out, best_member)
    return pa.Table.from_pylist(out, schema=METRICS_SCHEMA)


def _gains(rows: list[dict], out: list[dict], best_member: int | None) -> None:
    """Set `best_member` and the gains of one split's ensemble `rows` (all splits' `out`)."""
    members = {r["member"]: r for r in rows if r["member"] is not None}
    if not members:
        return
    val = [r for r in out if r["member"] is not None and r["split"] == "validation"]
    best = best_member if best_member in members else (
        min(val, key=_key)["member"] if val else None)
    best = best if best in members else None  # never chosen on the split it is scored on
    for r in rows:
        if r["aggregator"] is None:
            continue
        r["best_member"] = best
        for m in RM.GAIN_METRICS:
            values = [x[m] for x in members.values()]
            mean = None if any(v is None for v in values) else float(np.mean(values))
            r[f"gain_vs_mean_{m}"] = gain(r[m], mean, m)
            r[f"gain_vs_best_{m}"] = gain(r[m], None if best is None else members[best][m], m)


def ensemble_size_table(member_outputs: dict[str, np.ndarray], y: dict[str, np.ndarray],
                        greedy_order: list[int] | None = None) -> pa.Table:
    """The ensemble-size curve of a regression run (`ensemble.tasks.metrics_tables.ensemble_size_table`):
    metrics of the mean mixture of the first k members, and of greedy's first k picks."""

    def scores(split, stacked, order):  # the mixture of the first k picks, k = 1, 2, ...
        stacked = np.asarray(stacked, np.float64)
        mu_m, var_m = stacked[..., 0], stacked[..., 1]
        for k in range(1, len(order) + 1):
            picks = np.bincount(order[:k], minlength=len(stacked)) / k
            e = R.mixture(stacked, picks)
            yield RM.all_metrics(y[split], e[:, 0], np.sqrt(e[:, 1] + e[:, 2]), mu_m, var_m,
                                 picks)

    return size_table(member_outputs, greedy_order, scores, RM.METRICS)
