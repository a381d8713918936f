"""The Parquet tables of a regression run: predictions, metrics and the ensemble-size curve.

`predictions.parquet` of a regression run (docs/reference/run-directory.md) has, besides
`model`, `member`, `aggregator`, `split`, `row` and `source_row`: `y_true` (float64, null when unknown),
`y_pred` (the predictive mean), `std` (the predictive standard deviation), and for ensemble
rows `aleatoric_std` and `epistemic_std` (`std^2 = aleatoric_std^2 + epistemic_std^2`; null
on member rows), all float64 in the target's units. Its Parquet key-value metadata hold
`task = regression`, `classes = []` and `mixture`: each aggregator's member weights and std
scale, so the exact mixture behind an ensemble row can be rebuilt from the file alone.
`ensemble.tasks.tables` dispatches here for a run without classes.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.tasks.regression import aggregators as R
from ensemble.tasks.regression import metrics as RM

COLUMNS = ("y_true", "y_pred", "std", "aleatoric_std", "epistemic_std")


def metadata(params: dict | None, aggregators: Sequence[str], n_members: int
             ) -> dict[bytes, bytes]:
    """Parquet metadata of a regression predictions table (see the module docstring)."""
    mix = {a: {"weights": R.member_weights(a, n_members, (params or {}).get(a)).tolist(),
               "scale": float(((params or {}).get(a) or {}).get("scale", 1.0))
               if a == "std-scaling" else 1.0} for a in aggregators}
    return {b"classes": b"[]", b"task": b"regression", b"mixture": json.dumps(mix).encode()}


def model_rows(model: str, member: int | None, aggregator: str | None, split: str,
               rows: np.ndarray, y_true: np.ndarray | None, outputs: np.ndarray,
               first_row: int = 0) -> pa.Table:
    """Prediction rows of one model on one split.

    Args:
        outputs: a member's `[n_rows, 2]` (mean, variance) or an aggregator's `[n_rows, 3]`
            (mean, aleatoric variance, epistemic variance), target units.
        rows, first_row: as `ensemble.tasks.tables.model_rows`.
    """
    n = len(rows)
    out = np.asarray(outputs, np.float64)
    if out.shape[1] == 3:
        std, ale, epi = R.std_of(out)
        ale, epi = pa.array(ale), pa.array(epi)
    else:
        std, ale, epi = np.sqrt(out[:, 1]), pa.nulls(n, pa.float64()), pa.nulls(n, pa.float64())
    return pa.table({
        "model": pa.repeat(pa.scalar(model, pa.string()), n),
        "member": pa.repeat(pa.scalar(member, pa.int32()), n),
        "aggregator": pa.repeat(pa.scalar(aggregator, pa.string()), n),
        "split": pa.repeat(pa.scalar(split, pa.string()), n),
        "row": pa.array(np.arange(first_row, first_row + n, dtype=np.int64)),
        "y_true": pa.nulls(n, pa.float64()) if y_true is None
        else pa.array(np.asarray(y_true, np.float64)),
        "y_pred": pa.array(out[:, 0]),
        "std": pa.array(std),
        "aleatoric_std": ale, "epistemic_std": epi,
        "source_row": pa.array(np.asarray(rows, np.int64)),
    })


def predictions_table(member_outputs: dict[int, np.ndarray], split: str, rows: np.ndarray,
                      y_true: np.ndarray | None, aggregators: Sequence[str],
                      ensemble_outputs: dict[str, np.ndarray] | None = None,
                      params: dict | None = None, first_row: int = 0) -> pa.Table:
    """Member rows and ensemble rows of one split (`ensemble.tasks.tables.predictions_table` for
    regression): `member_outputs` index -> `[n_rows, 2]`; `ensemble_outputs` aggregator ->
    `[n_rows, 3]`, computed with `ensemble.tasks.regression.aggregators.aggregate` when None."""
    params = params or {}
    parts = [model_rows(f"member-{i}", i, None, split, rows, y_true, o, first_row)
             for i, o in sorted(member_outputs.items())]
    stacked = np.stack([o for _, o in sorted(member_outputs.items())])
    if ensemble_outputs is None:
        ensemble_outputs = {a: R.aggregate(stacked, a, params.get(a)) for a in aggregators}
    for a in aggregators:
        parts.append(model_rows(f"ensemble-{a}", None, a, split, rows, y_true,
                                ensemble_outputs[a], first_row))
    return pa.concat_tables(parts).replace_schema_metadata(
        metadata(params, aggregators, len(stacked)))


def outputs(table: pa.Table) -> np.ndarray:
    """A member's `[n_rows, 2]` (mean, variance) from its rows' `y_pred` and `std`."""
    return np.column_stack([table.column("y_pred").to_numpy(),
                            table.column("std").to_numpy() ** 2])


GAINS = tuple(f"gain_vs_{ref}_{m}" for ref in ("mean", "best") for m in RM.GAIN_METRICS)
METRICS_SCHEMA = pa.schema(
    [("model", pa.string()), ("member", pa.int32()), ("aggregator", pa.string()),
     ("split", pa.string()), ("n", pa.int64())]
    + [(m, pa.float64()) for m in RM.METRICS]
    + [("disagreement", pa.float64()), ("mean_epistemic_std", pa.float64()),
       ("best_member", pa.int32())]
    + [(g, pa.float64()) for g in GAINS])


def gain(ensemble: float | None, reference: float | None, metric: str) -> float | None:
    """Ensemble gain on `metric`, positive = ensemble better; None when either is None."""
    if ensemble is None or reference is None:
        return None
    return reference - ensemble if metric in RM.LOWER_IS_BETTER else ensemble - reference


def _key(r: dict) -> tuple:
    return (np.inf if r["nll"] is None else r["nll"], r["rmse"], r["member"])


def metrics_table(predictions: pa.Table, best_member: int | None = None) -> pa.Table:
    """One row per model and split with `n` and every metric of
    `ensemble.tasks.regression.metrics.METRICS`; rows with unknown `y_true` are left out. An
    ensemble row's `mixture_nll` is the exact mixture's (its member rows on that split and
    the weights and scale of the table's `mixture` metadata). Ensemble rows also carry the
    members' `disagreement` (mean std of the member means), `mean_epistemic_std`,
    `best_member` (lowest validation NLL, then RMSE; or `best_member`), and the gains
    `gain_vs_{mean,best}_<metric>` over the mean and the best member (positive = better).
    """
    meta = predictions.schema.metadata or {}
    mix = json.loads(meta.get(b"mixture", b"{}"))
    labelled = predictions.filter(pc.is_valid(predictions.column("y_true")))
    out = []
    for split in sorted(set(labelled.column("split").to_pylist())):
        part = labelled.filter(pc.equal(labelled.column("split"), split))
        members, first = {}, len(out)
        for model in dict.fromkeys(part.column("model").to_pylist()):
            t = part.filter(pc.equal(part.column("model"), model))
            t = t.take(pc.sort_indices(t.column("row")))
            member, agg = t.column("member")[0].as_py(), t.column("aggregator")[0].as_py()
            y, mu, sd = (t.column(c).to_numpy() for c in ("y_true", "y_pred", "std"))
            row = {"model": model, "member": member, "aggregator": agg, "split": split,
                   "n": len(y), "_y": y, "_mu": mu, "_sd": sd}
            if member is not None:
                members[member] = outputs(t)
            out.append(row)
        stacked = np.stack([o for _, o in sorted(members.items())]) if members else None
        for row in out[first:]:
            y, mu, sd = row.pop("_y"), row.pop("_mu"), row.pop("_sd")
            agg = row["aggregator"]
            if agg is None or stacked is None:
                row.update(RM.all_metrics(y, mu, sd))
                continue
            m = mix.get(agg, {"weights": None, "scale": 1.0})
            params = {"weights": m["weights"], "scale": m["scale"]}
            mu_m, var_m, w = R.components(stacked, agg, params)
            row.update(RM.all_metrics(y, mu, sd, mu_m, var_m, w))
            row["disagreement"] = R.disagreement(stacked)
    for row in out:  # mean epistemic std of ensemble rows
        if row["aggregator"] is not None:
            t = labelled.filter(pc.and_(pc.equal(labelled.column("split"), row["split"]),
                                        pc.equal(labelled.column("model"), row["model"])))
            row["mean_epistemic_std"] = float(np.mean(t.column("epistemic_std").to_numpy()))
    for split in {r["split"] for r in out}:
        rows = [r for r in out if r["split"] == split]
        members = {r["member"]: r for r in rows if r["member"] is not None}
        if not members:
            continue
        val = [r for r in out if r["member"] is not None and r["split"] == "validation"]
        best = best_member if best_member in members else (
            min(val, key=_key)["member"] if val else None)
        best = best if best in members else min(members.values(), key=_key)["member"]
        for r in rows:
            if r["aggregator"] is None:
                continue
            r["best_member"] = best
            for m in RM.GAIN_METRICS:
                values = [x[m] for x in members.values()]
                mean = None if any(v is None for v in values) else float(np.mean(values))
                r[f"gain_vs_mean_{m}"] = gain(r[m], mean, m)
                r[f"gain_vs_best_{m}"] = gain(r[m], members[best][m], m)
    return pa.Table.from_pylist(out, schema=METRICS_SCHEMA)


def ensemble_size_table(member_outputs: dict[str, np.ndarray], y: dict[str, np.ndarray],
                        greedy_order: list[int] | None = None) -> pa.Table:
    """The ensemble-size curve of a regression run (`ensemble.tasks.tables.ensemble_size_table`):
    metrics of the mean mixture of the first k members, and of greedy's first k picks."""
    out = []
    for split, stacked in member_outputs.items():
        stacked = np.asarray(stacked, np.float64)
        orders = {"first": list(range(len(stacked)))}
        if greedy_order:
            orders["greedy"] = list(greedy_order)
        for name, order in orders.items():
            for k in range(1, len(order) + 1):
                picks = np.bincount(order[:k], minlength=len(stacked)) / k
                e = R.mixture(stacked, picks)
                mu_m, var_m = stacked[..., 0], stacked[..., 1]
                out.append({"order": name, "k": k, "split": split,
                            "member_added": int(order[k - 1]),
                            **RM.all_metrics(y[split], e[:, 0], np.sqrt(e[:, 1] + e[:, 2]),
                                             mu_m, var_m, picks)})
    schema = pa.schema([("order", pa.string()), ("k", pa.int32()), ("split", pa.string()),
                        ("member_added", pa.int32())]
                       + [(m, pa.float64()) for m in RM.METRICS])
    return pa.Table.from_pylist(out, schema=schema)


HISTORY_SCHEMA = pa.schema([("member", pa.int32()), ("epoch", pa.int32()),
                            ("loss", pa.float64()), ("val_loss", pa.float64()),
                            ("val_rmse", pa.float64()), ("seconds", pa.float64())])
