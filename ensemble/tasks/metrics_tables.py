"""The metrics tables of a classification run: `metrics.parquet`'s rows (one per model and
split, with the ensemble's gain over the mean and the best member) and the ensemble-size curve
(`ensemble_size.parquet`), computed from a predictions table, its arrays or the arrays a run
predicted (docs/reference/run-directory.md). A regression run's twins are in
`ensemble.tasks.regression.tables`; `ensemble.tasks.tables` builds the predictions tables.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from ensemble.tasks.classification import metrics as M
from ensemble.tasks.classification import running
from ensemble.tasks.classification import threshold as decision
from ensemble.tasks.classification.aggregators import REGISTRY, member_weights
from ensemble.tasks.model_arrays import PredictionArrays
from ensemble.tasks.table_parts import PRIOR, metrics_schema, prior_of, size_table

CHUNK_ROWS = 65536  # rows of one model's outputs scored at a time
NOT_PROBABILITIES = {n for n, a in REGISTRY.items() if not a.probabilities}  # vote shares

GAINS, METRICS_SCHEMA = metrics_schema(
    M.METRICS, ("disagreement", "mean_pairwise_kl", "mean_mutual_information"), M.METRICS)


def gain(ensemble: float | None, reference: float | None, metric: str) -> float | None:
    """Ensemble gain on `metric`: positive = ensemble better (lower NLL/Brier/ECE, higher
    accuracy); None when either value is None."""
    if ensemble is None or reference is None:
        return None
    return reference - ensemble if metric in M.LOWER_IS_BETTER else ensemble - reference


def _best_member(rows: list[dict]) -> int | None:
    """The member with the lowest validation NLL (ties: higher accuracy, smaller index)."""
    val = [r for r in rows if r["member"] is not None and r["split"] == "validation"]
    if not val:
        return None
    return min(val, key=lambda r: (r["nll"], -r["accuracy"], r["member"]))["member"]


def metrics_table(arrays: PredictionArrays, best_member: int | None = None) -> pa.Table:
    """One row per model and split with `n`, accuracy, NLL, Brier and ECE; rows with unknown
    `y_true` are left out. Vote rows have null NLL/Brier/ECE (vote shares are not
    probabilities).

    Ensemble rows also carry, per split: the members' `disagreement`, `mean_pairwise_kl`, the
    ensemble's `mean_mutual_information`, `best_member` (chosen on the validation split, or
    given by `best_member`, e.g. from the run's `aggregators.json`), and the ensemble gain
    `gain_vs_{mean,best}_<metric>` over the mean member (mean of the members' metrics) and
    over the best member on that split (positive = ensemble better).

    Args:
        arrays: a predictions file's arrays (`model_arrays.read`, which never holds the
            table whole; `Task.metrics_table` reads a table); the decision thresholds in its metadata
            (`threshold.metadata`) set the ensembles' labels.
    """
    thresholds = decision.from_metadata(arrays.metadata)  # a binary run's decision thresholds
    outputs = {}
    for split in sorted(arrays.splits):
        outputs[split] = [ModelOutput(
            a.model, a.member, a.aggregator, a.y, a.values,
            None if a.aggregator is None or a.extra is None or a.extra_nulls
            else float(np.mean(a.extra)), thresholds.get(a.aggregator))
            for a in arrays.of_split(split)]
    return metrics_of({s: o for s, o in outputs.items() if o}, best_member,
                      arrays.classes.tolist(), prior_of(arrays.metadata))


class ModelOutput(NamedTuple):
    """One model's labelled rows of one split, what its metrics row is computed from.

    Attributes:
        model, member, aggregator: as the predictions table's columns.
        y: `[n_rows]` class indices; p: `[n_rows, n_classes]` float32 probabilities (vote
            shares for `vote`).
        mean_mutual_information: the ensemble rows' mean mutual information, None for
            members and vote.
        threshold: the aggregator's decision threshold (`aggregators.json`), None: argmax.
    """

    model: str
    member: int | None
    aggregator: str | None
    y: np.ndarray
    p: np.ndarray
    mean_mutual_information: float | None = None
    threshold: float | None = None  # a binary run's decision threshold (`threshold.labels`)


def split_outputs(member_probs: dict[int, np.ndarray], y: np.ndarray,
                  aggregators: Sequence[str], ensemble_probs: dict[str, np.ndarray],
                  params: dict | None = None, chunk_rows: int = CHUNK_ROWS
                  ) -> list[ModelOutput]:
    """The `ModelOutput`s of one labelled split from the arrays a run predicted (what
    `metrics_table` reads back from `predictions_table`'s rows, without building them); the
    outputs may be memory maps, read `chunk_rows` rows at a time.

    Args:
        member_probs: member index -> `[n_rows, n_classes]`; y: `[n_rows]` class indices;
        ensemble_probs: aggregator -> `[n_rows, n_classes]`; params: fitted aggregators'.
    """
    params = params or {}
    members = [p for _, p in sorted(member_probs.items())]
    out = [ModelOutput(f"member-{i}", i, None, y, p) for i, p in sorted(member_probs.items())]
    for a in aggregators:
        mi = None
        if a not in NOT_PROBABILITIES and len(y):
            w = member_weights(a, len(members), params.get(a))
            total = 0.0
            for span in _spans(len(y), chunk_rows):
                stacked = np.stack([p[span] for p in members])
                total += float(np.sum(M.uncertainty(stacked, ensemble_probs[a][span], w)[
                    "mutual_information"]))
            mi = total / len(y)
        out.append(ModelOutput(f"ensemble-{a}", None, a, y, ensemble_probs[a], mi,
                               decision.of(params.get(a))))
    return out


def _spans(n: int, chunk_rows: int) -> list[slice]:
    """The `slice`s of `n` rows `chunk_rows` at a time."""
    return [slice(lo, min(n, lo + chunk_rows)) for lo in range(0, n, max(1, chunk_rows))]


def diversity(members: list[np.ndarray], chunk_rows: int = CHUNK_ROWS) -> tuple[float, float]:
    """`(disagreement, mean_pairwise_kl)` of the members' `[n_rows, n_classes]` outputs (as
    `aggregators.disagreement` and `metrics.mean_pairwise_kl` on the stacked arrays), summed
    over chunks of `chunk_rows` rows; `(0.0, 0.0)` for one member."""
    n_members, n = len(members), len(members[0]) if members else 0
    if n_members < 2 or n == 0:
        return 0.0, 0.0
    differ = np.zeros((n_members, n_members))
    kl = np.zeros((n_members, n_members))
    for span in _spans(n, chunk_rows):
        raw = np.stack([np.asarray(m[span], np.float64) for m in members])
        labels, p = np.argmax(raw, axis=2), np.clip(raw, M.NLL_CLIP, 1.0)
        logp = np.log(p)
        for i in range(n_members):
            for j in range(n_members):
                if i != j:
                    differ[i, j] += np.sum(labels[i] != labels[j])
                    kl[i, j] += np.sum(p[i] * (logp[i] - logp[j]))
    upper = [differ[i, j] / n for i in range(n_members) for j in range(i + 1, n_members)]
    pairs = [kl[i, j] / n for i in range(n_members) for j in range(n_members) if i != j]
    return float(np.mean(upper)), float(np.mean(pairs))


def scores(y: np.ndarray, p: np.ndarray, chunk_rows: int = CHUNK_ROWS,
           probabilities: bool = True, threshold: float | None = None
           ) -> dict[str, float | None]:
    """Every metric of one model's labelled rows (`running.Running`, over chunks of
    `chunk_rows` rows): `M.METRICS`, `running.RANK_METRICS` and `recall` (a per-class list);
    vote shares (`probabilities` False) get null NLL, Brier, ECE, ROC AUC and average
    precision; `threshold`: the decision threshold of the labels (`running.Running.update`)."""
    row = running.metrics(y, p, chunk_rows, rank=probabilities, threshold=threshold)
    if not probabilities:
        row.update(nll=None, brier=None, ece=None)
    return row


def prior_output(shares: Sequence[float], y: np.ndarray) -> ModelOutput:
    """The `prior` baseline of one split: every row gets the training split's class shares
    `shares` `[n_classes]` as its probabilities (a read-only broadcast view: no per-row
    copy)."""
    p = np.broadcast_to(np.asarray(shares, np.float32), (len(y), len(shares)))
    return ModelOutput(PRIOR, None, None, y, p)


def schema_of(classes: Sequence) -> pa.Schema:
    """`metrics.parquet`'s schema for a run of `classes`: `METRICS_SCHEMA`, then the rank
    metrics and one `recall_<class>` column per class."""
    schema = METRICS_SCHEMA
    for name in (*running.RANK_METRICS, *(f"recall_{c}" for c in classes)):
        schema = schema.append(pa.field(name, pa.float64()))
    return schema


def metrics_of(outputs: dict[str, list[ModelOutput]], best_member: int | None = None,
               classes: Sequence | None = None, prior: Sequence[float] | None = None,
               chunk_rows: int = CHUNK_ROWS) -> pa.Table:
    """`metrics_table`'s rows from each split's `ModelOutput`s (members and ensembles), each
    model's metrics over chunks of `chunk_rows` rows (its outputs may be memory maps), with a
    `prior` row per split when the training split's class shares `prior` are given.

    Args:
        classes: the class labels, naming the `recall_<class>` columns (class positions when
            None).
    """
    out = []
    for split, models in sorted(outputs.items()):
        if prior is not None and models:
            models = [*models, prior_output(prior, models[0].y)]
        first = len(out)
        for o in models:
            row = {"model": o.model, "member": o.member, "aggregator": o.aggregator,
                   "split": split, "n": len(o.y),
                   **scores(o.y, o.p, chunk_rows, o.aggregator not in NOT_PROBABILITIES,
                            o.threshold),
                   "mean_mutual_information": o.mean_mutual_information}
            names = classes if classes is not None else range(len(row["recall"]))
            row.update({f"recall_{c}": r for c, r in zip(names, row.pop("recall"))})
            out.append(row)
        members = [o.p for o in sorted((o for o in models if o.member is not None),
                                       key=lambda o: o.member)]
        div = diversity(members, chunk_rows) if members else (None, None)
        for row in out[first:]:
            is_ens = row["aggregator"] is not None and members
            row["disagreement"] = div[0] if is_ens else None
            row["mean_pairwise_kl"] = div[1] if is_ens else None
    for split in {r["split"] for r in out}:
        rows = [r for r in out if r["split"] == split]
        members = {r["member"]: r for r in rows if r["member"] is not None}
        best = best_member if best_member in members else _best_member(out)
        best = best if best in members else (
            min(members.values(), key=lambda r: (r["nll"], r["member"]))["member"]
            if members else None)
        for r in rows:
            if r["aggregator"] is None or not members:
                continue
            r["best_member"] = best
            for m in M.METRICS:
                mean = float(np.mean([x[m] for x in members.values()]))
                r[f"gain_vs_mean_{m}"] = gain(r[m], mean, m)
                r[f"gain_vs_best_{m}"] = gain(r[m], members[best][m], m)
    n_classes = len(classes) if classes is not None else max(
        (len([k for k in r if k.startswith("recall_")]) for r in out), default=0)
    return pa.Table.from_pylist(out, schema=schema_of(
        classes if classes is not None else range(n_classes)))


def ensemble_size_table(member_probs: dict[str, np.ndarray], y: dict[str, np.ndarray],
                        greedy_order: list[int] | None = None) -> pa.Table:
    """The ensemble-size curve: metrics of the mean of the first k members, k = 1..n_members
    (`order` = "first": members in index order; k = 1 is member 0 and k = n_members the
    mean ensemble), and of the first k picks of greedy selection (`order` = "greedy", picks
    with replacement, k = 1..len(greedy_order)).

    Args:
        member_probs: split -> `[n_members, n_rows, n_classes]` (members in index order).
        y: split -> `[n_rows]` class indices.
        greedy_order: member positions in the order greedy selection picked them.
    """
    def scores(split, probs, order):  # the mean of the first k members, k = 1, 2, ...
        labels = np.asarray(y[split])
        for k in range(1, len(order) + 1):
            acc = running.Running(probs.shape[2])
            for span in _spans(len(labels), CHUNK_ROWS):  # summed in pick order, as a whole
                total = np.zeros((span.stop - span.start, probs.shape[2]))
                for m in order[:k]:
                    total += np.asarray(probs[m, span], np.float64)
                acc.update(labels[span], (total / k).astype(np.float32))
            yield {m: acc.result()[m] for m in M.METRICS}

    return size_table(member_probs, greedy_order, scores, M.METRICS)
