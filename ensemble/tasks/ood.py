"""Out-of-distribution detection from stored predictions: per-row uncertainty scores of every
member and ensemble aggregator, and the AUROC/AUPR of telling in- from out-of-distribution rows.

Pure numpy and scikit-learn over member outputs `[n_members, n_rows, n_classes]`
(classification probabilities) or `[n_members, n_rows, 2]` (regression mean and variance,
target units); no TensorFlow. Every score is oriented so that *higher means more uncertain*
(more likely out of distribution), and the OOD rows are the positive class, as in Hendrycks
and Gimpel 2017 ("A Baseline for Detecting Misclassified and Out-of-Distribution Examples")
and google/uncertainty-baselines:

- `max_probability`: `1 - max_c p_c` (the maximum softmax probability baseline, negated);
- `entropy`: predictive entropy `-sum_c p_c log p_c` (nats);
- `mutual_information`: entropy of the ensemble minus its members' expected entropy (BALD;
  Depeweg et al. 2018); null for a member and for hard voting;
- regression `std`: the predictive std (target units); `epistemic_std`: the std of the
  member means (its epistemic part, null for a member).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from ensemble.tasks.classification import aggregators as A
from ensemble.tasks.classification import metrics as M
from ensemble.tasks.regression import aggregators as R
from ensemble.core.errors import UsageError

SCHEMA = pa.schema([
    ("model", pa.string()), ("member", pa.int32()), ("aggregator", pa.string()),
    ("score", pa.string()), ("auroc", pa.float64()), ("aupr", pa.float64()),
    ("n_in", pa.int64()), ("n_out", pa.int64()), ("in_split", pa.string()),
    ("ood_source", pa.string()), ("ood_sha256", pa.string())])


def ensemble_outputs(member_outputs: np.ndarray, aggregators: Sequence[str],
                     params: dict | None = None, regression: bool = False
                     ) -> dict[str, np.ndarray]:
    """The numpy aggregators' outputs: aggregator -> `[n_rows, n_classes]` probabilities
    (`ensemble.tasks.classification.aggregators.aggregate`) or `[n_rows, 3]` (mean, aleatoric and epistemic variance;
    `ensemble.tasks.regression.aggregators.aggregate`), with the run's fitted parameters `params`."""
    params = params or {}
    fn = R.aggregate if regression else A.aggregate
    return {a: fn(member_outputs, a, params.get(a)) for a in aggregators}


def uncertainty_scores(member_outputs: np.ndarray, aggregators: Sequence[str],
                       params: dict | None = None, regression: bool = False,
                       members: Sequence[int] | None = None) -> list[dict]:
    """Per-row uncertainty scores of every member and aggregator (higher = more uncertain).

    Args:
        member_outputs: `[n_members, n_rows, n_classes]` probabilities, or `[n_members,
            n_rows, 2]` mean and variance for regression.
        aggregators: the run's aggregators; params: their fitted parameters.
        regression: True for regression outputs (mean and variance).
        members: the members' indices in the run (default `0..n_members-1`).

    Returns:
        `[{"model", "member", "aggregator", "scores": {score: [n_rows] float64 | None}}]`,
        members first.

    Raises:
        UsageError: member outputs of the wrong shape.
    """
    out = np.asarray(member_outputs, np.float64)
    if out.ndim != 3 or 0 in out.shape:
        raise UsageError("Expected member outputs of shape [n_members, n_rows, n_classes]. "
                         f"Received shape: {out.shape}")
    members = list(range(out.shape[0])) if members is None else list(members)
    params = params or {}
    rows = []
    if regression:
        out = R.check_members(out)
        for i, o in zip(members, out):
            rows.append(_row(f"member-{i}", i, None, {"std": np.sqrt(o[:, 1]),
                                                      "epistemic_std": None}))
        for a, e in ensemble_outputs(out, aggregators, params, True).items():
            std, _, epi = R.std_of(e)
            rows.append(_row(f"ensemble-{a}", None, a, {"std": std, "epistemic_std": epi}))
        return rows
    for i, p in zip(members, out):
        rows.append(_row(f"member-{i}", i, None, {"max_probability": 1.0 - p.max(axis=1),
                                                  "entropy": M.entropy(p),
                                                  "mutual_information": None}))
    for a, p in ensemble_outputs(out, aggregators, params).items():
        mi = None
        if getattr(A.REGISTRY.get(a), "probabilities", True):  # not vote shares
            w = A.member_weights(a, out.shape[0], params.get(a))
            mi = M.uncertainty(out, p, w)["mutual_information"]
        rows.append(_row(f"ensemble-{a}", None, a, {"max_probability": 1.0 - p.max(axis=1),
                                                    "entropy": M.entropy(p),
                                                    "mutual_information": mi}))
    return rows


def _row(model: str, member: int | None, aggregator: str | None, scores: dict) -> dict:
    return {"model": model, "member": member, "aggregator": aggregator, "scores": scores}


def detection(score_in: np.ndarray, score_out: np.ndarray) -> tuple[float, float]:
    """AUROC and AUPR of telling OOD rows (positive) from in-distribution rows by a score
    (higher = more likely OOD): scikit-learn's `roc_auc_score` and `average_precision_score`.

    Args:
        score_in: `[n_in]`; score_out: `[n_out]`.

    Raises:
        UsageError: either side empty, or a score not finite.
    """
    from sklearn.metrics import average_precision_score, roc_auc_score

    s_in, s_out = np.asarray(score_in, np.float64), np.asarray(score_out, np.float64)
    if s_in.size == 0 or s_out.size == 0:
        raise UsageError(f"Expected in- and out-of-distribution rows. Received: {s_in.size} "
                         f"in, {s_out.size} out")
    scores = np.concatenate([s_in, s_out])
    if not np.all(np.isfinite(scores)):
        raise UsageError("Expected finite uncertainty scores (a member predicted NaN or inf).")
    labels = np.concatenate([np.zeros(s_in.size), np.ones(s_out.size)])
    return float(roc_auc_score(labels, scores)), float(average_precision_score(labels, scores))


def ood_table(scores_in: list[dict], scores_out: list[dict], source: str,
              sha256: str | None, in_split: str = "test") -> pa.Table:
    """`ood.parquet`: one row per model and score (schema `SCHEMA`); a score a model does not
    have (a member's mutual information) has null AUROC and AUPR.

    Args:
        scores_in, scores_out: `uncertainty_scores` of the in-distribution split and of the
            OOD inputs (same models in the same order).
    """
    recs = []
    for a, b in zip(scores_in, scores_out):
        for name, s_in in a["scores"].items():
            s_out = b["scores"][name]
            auroc, aupr = (None, None) if s_in is None else detection(s_in, s_out)
            recs.append({"model": a["model"], "member": a["member"],
                         "aggregator": a["aggregator"], "score": name, "auroc": auroc,
                         "aupr": aupr, "n_in": len(next(v for v in a["scores"].values()
                                                        if v is not None)),
                         "n_out": len(next(v for v in b["scores"].values() if v is not None)),
                         "in_split": in_split, "ood_source": str(source), "ood_sha256": sha256})
    return pa.Table.from_pylist(recs, schema=SCHEMA)


def estimator_table(estimator, x_in, x_out, regression: bool = False) -> pa.Table:
    """`ood_table` of a fitted scikit-learn estimator (`ensemble.sklearn`): its members and its
    aggregator on in-distribution rows `x_in` against OOD rows `x_out` (`[n, n_features]`),
    with its fitted aggregator parameters; `in_split` is `X_in`, `ood_source` `X_out`."""
    m_in, m_out = estimator.predict_members(x_in), estimator.predict_members(x_out)
    params = (getattr(estimator, "aggregators_", None) or {}).get("params", {})
    aggs = [estimator.aggregator_]
    return ood_table(uncertainty_scores(m_in, aggs, params, regression),
                     uncertainty_scores(m_out, aggs, params, regression), "X_out", None, "X_in")
