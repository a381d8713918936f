"""Fitting the fitted aggregators on the validation split; their parameters as JSON.

Every function here takes the members' *validation* probabilities `[n_members, n_rows,
n_classes]` and integer labels `[n_rows]`, and nothing else: no test row can reach a fit.
Parameters are plain JSON (lists and floats, no pickle) and are stored in the run's
`aggregators.json`, so `predict`, `export` and the in-graph graph apply exactly them.

- `weighted`: weights on the simplex minimising validation NLL (SciPy SLSQP; the NLL of a
  mixture is convex in its weights), or fixed weights from the config.
- `greedy`: ensemble selection with replacement (Caruana et al. 2004, "Ensemble Selection from
  Libraries of Models"): a fixed number of rounds, each adds the member that most lowers the
  NLL of the running average; the best prefix is kept; weight = times chosen / prefix length.
  Written here (about 20 lines) because auto-sklearn's and AutoGluon's versions come with
  their whole frameworks.
- `stacking`: scikit-learn `LogisticRegressionCV` chooses `C` by stratified k-fold
  cross-validation on validation NLL, then `LogisticRegression(C)` is fitted on all validation
  rows; its coefficients are stored.
- `temperature`: the temperature of the mean minimising validation NLL (Guo et al. 2017;
  SciPy `minimize_scalar` over log T).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ensemble.tasks.classification import aggregators as A
from ensemble.tasks.classification import metrics as M
from ensemble.core.errors import UsageError
from ensemble.tasks.base import fit_member_weights

FILENAME = "aggregators.json"
CHUNK_ROWS = 65536  # validation rows read at a time by the fits
STACKING_ROWS = 200_000  # stacking fits on a uniform sample of at most this many rows
MISSING_CLASS_LOGIT = -50.0  # a class absent from the validation labels gets no mass


def _check(probs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`probs` as it is (an array or a memory map: read a chunk at a time, never copied
    whole) and `y` as int64, their shapes checked."""
    probs = A._check(probs)
    y = np.asarray(y, np.int64)
    if y.shape != (probs.shape[1],):
        raise UsageError(f"Expected {probs.shape[1]} validation labels. Received: {y.shape}")
    return probs, y


def _spans(n: int) -> list[slice]:
    """The `CHUNK_ROWS`-row slices of `n` rows."""
    return [slice(lo, min(n, lo + CHUNK_ROWS)) for lo in range(0, n, CHUNK_ROWS)]


def _nll_sum(y: np.ndarray, p: np.ndarray) -> float:
    """The summed (not mean) NLL of `p` `[n, n_classes]` at class indices `y` `[n]`."""
    return float(-np.sum(np.log(np.clip(np.asarray(p, np.float64)[np.arange(len(y)), y],
                                        M.NLL_CLIP, 1.0))))


def chunked_nll(probs: np.ndarray, y: np.ndarray, combine) -> float:
    """The mean NLL over all rows of `combine(probs[:, span]) -> [n, n_classes]` (an
    aggregator's outputs of the rows of `span`), summed a chunk of rows at a time."""
    return sum(_nll_sum(y[s], combine(np.asarray(probs[:, s], np.float64)))
               for s in _spans(len(y))) / len(y)


def fit_weights(probs: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Member weights on the simplex minimising the validation NLL of `sum_m w_m p_m`.

    Returns:
        `{"weights": [n_members]}`.
    """
    from scipy.optimize import minimize

    probs, y = _check(probs, y)
    n = probs.shape[0]
    spans = _spans(len(y))

    def loss(w):  # the mean NLL of the mixture and its gradient, summed over chunks
        total, grad = 0.0, np.zeros(n)
        for sp in spans:
            true = np.clip(np.asarray(probs[:, sp], np.float64)[
                :, np.arange(sp.stop - sp.start), y[sp]].T, 0.0, 1.0)  # [rows, n_members]
            mix = np.clip(true @ w, M.NLL_CLIP, None)
            total -= np.sum(np.log(mix))
            grad -= (true / mix[:, None]).sum(axis=0)
        return total / len(y), grad / len(y)

    res = minimize(loss, np.full(n, 1.0 / n), jac=True, method="SLSQP",
                   bounds=[(0.0, 1.0)] * n,
                   constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0,
                                 "jac": lambda w: np.ones_like(w)}],
                   options={"ftol": 1e-12, "maxiter": 500})
    w = np.where(res.x < 1e-6, 0.0, res.x)
    return {"weights": (w / w.sum()).tolist()}


def greedy_selection(probs: np.ndarray, y: np.ndarray, rounds: int) -> dict[str, Any]:
    """Caruana's forward selection with replacement on validation NLL.

    Args:
        rounds: number of additions (a member may be added several times).

    Returns:
        `{"order": [rounds] member positions in the order chosen, "size": length of the kept
        (best) prefix, "weights": [n_members] times chosen in the prefix / size}`. Ties go to
        the smallest member position; a later prefix is kept only if strictly better.
    """
    probs, y = _check(probs, y)
    if rounds < 1:
        raise UsageError(f"Expected `aggregation.greedy_rounds` >= 1. Received: {rounds}")
    order, best, size = [], np.inf, 0
    for r in range(1, rounds + 1):
        sums = np.zeros(len(probs))
        for sp in _spans(len(y)):  # the running average's chunk, summed in pick order
            chunk = np.asarray(probs[:, sp], np.float64)
            total = np.zeros(chunk.shape[1:])
            for pick in order:
                total += chunk[pick]
            sums += [_nll_sum(y[sp], (total + p) / r) for p in chunk]
        scores = sums / len(y)
        pick = int(np.argmin(scores))
        order.append(pick)
        if scores[pick] < best - 1e-12:
            best, size = scores[pick], r
    counts = np.bincount(order[:size], minlength=probs.shape[0])
    return {"order": order, "size": size, "weights": (counts / size).tolist()}


def fit_stacking(probs: np.ndarray, y: np.ndarray, folds: int, seed: int = 0,
                 c: float | None = None) -> dict[str, Any]:
    """Multinomial logistic regression on the members' validation probabilities.

    `C` is `c` when given (no cross-validation: the out-of-fold scoring's folds reuse the C
    the fit on every row chose), else chosen by `LogisticRegressionCV` (stratified
    `folds`-fold cross-validation, NLL), with `folds` lowered to the smallest class count (no
    cross-validation, C = 1, below 2).

    Returns:
        `{"coef": [n_classes, n_members * n_classes], "intercept": [n_classes], "C": float,
        "folds": int}` for `ensemble.tasks.classification.aggregators.stacked`.
    """
    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from threadpoolctl import threadpool_limits

    probs, y = _check(probs, y)
    rows = stacking_sample(len(y), seed)
    if rows is not None:  # a uniform sample (sorted: read in file order)
        probs, y = np.asarray(probs[:, rows]), y[rows]
    x, n_classes = A.stacking_features(np.asarray(probs, np.float64)), probs.shape[2]
    present = np.unique(y)
    folds = 0 if c is not None else int(min(folds, np.bincount(y)[present].min()))
    c = 1.0 if c is None else float(c)
    # the fits on one BLAS thread: OpenBLAS's pool of spinning threads made these small fits
    # 2-3x slower beside TensorFlow on 2 cores (7-11 s against 3.3 s in test_fitted)
    if folds >= 2 and len(present) >= 2:
        with threadpool_limits(1, user_api="blas"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cv = LogisticRegressionCV(Cs=10, cv=StratifiedKFold(folds, shuffle=True,
                                                                random_state=seed),
                                      scoring="neg_log_loss", max_iter=1000).fit(x, y)
        c = float(np.ravel(cv.C_)[0])
    coef = np.zeros((n_classes, x.shape[1]))
    intercept = np.full(n_classes, MISSING_CLASS_LOGIT)
    if len(present) < 2:  # one class only: it gets all the mass
        intercept[present] = 0.0
        return {"coef": coef.tolist(), "intercept": intercept.tolist(), "C": c, "folds": 0,
                "rows": int(len(y))}
    with threadpool_limits(1, user_api="blas"):
        model = LogisticRegression(C=c, max_iter=1000).fit(x, y)
    if len(model.classes_) == 2:  # binary: sigmoid(z) = softmax([0, z])
        coef[model.classes_[1]], intercept[model.classes_] = model.coef_[0], [0.0,
                                                                             model.intercept_[0]]
    else:
        coef[model.classes_], intercept[model.classes_] = model.coef_, model.intercept_
    return {"coef": coef.tolist(), "intercept": intercept.tolist(), "C": c, "folds": folds,
            "rows": int(len(y))}


def stacking_sample(n_rows: int, seed: int = 0) -> np.ndarray | None:
    """The sorted positions of a seeded uniform sample of `STACKING_ROWS` of `n_rows`
    validation rows (stacking's design matrix), None when every row fits; prints a notice
    naming the sample size."""
    if n_rows <= STACKING_ROWS:
        return None
    from ensemble.core.notices import notice

    notice(f"stacking fits on a uniform sample of {STACKING_ROWS:,} of the {n_rows:,} "
           "validation rows (its design matrix held in memory); `rows` in aggregators.json.",
           once=True)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_rows, STACKING_ROWS, replace=False))


def fit_temperature(probs: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The temperature T in [0.05, 20] minimising the validation NLL of
    `softmax(log(mean_m p_m) / T)`. Returns `{"temperature": T}`."""
    from scipy.optimize import minimize_scalar

    probs, y = _check(probs, y)
    res = minimize_scalar(lambda t: chunked_nll(probs, y, lambda p: A.temperature_scaled(
                              p, np.exp(t))),
                          bounds=(np.log(0.05), np.log(20.0)), method="bounded",
                          options={"xatol": 1e-6})
    return {"temperature": float(np.exp(res.x))}


def fit_weighted(probs: np.ndarray, y: np.ndarray, settings: dict) -> dict[str, Any]:
    """`weighted`: the config's weights, else `fit_weights` (`ensemble.tasks.base`)."""
    return fit_member_weights(fit_weights, probs, y, settings)


def fit_greedy(probs: np.ndarray, y: np.ndarray, settings: dict) -> dict[str, Any]:
    """`greedy`: `greedy_selection` for `settings["greedy_rounds"]` rounds."""
    return greedy_selection(probs, y, int(settings["greedy_rounds"]))


def fit_stacking_on(probs: np.ndarray, y: np.ndarray, settings: dict) -> dict[str, Any]:
    """`stacking`: `fit_stacking` with `settings["stacking_folds"]` folds, or with the C of
    `settings["refit"]` (the parameters fitted on every validation row) when given."""
    c = (settings.get("refit") or {}).get("C")
    return fit_stacking(probs, y, int(settings["stacking_folds"]), c=c)


def fit_temperature_on(probs: np.ndarray, y: np.ndarray, settings: dict) -> dict[str, Any]:
    """`temperature`: `fit_temperature` (no setting)."""
    return fit_temperature(probs, y)


def member_losses(probs: np.ndarray, y: np.ndarray) -> list[float]:
    """Per member of `[n_members, n_rows, n_classes]`, its validation NLL.

    Raises:
        UsageError: `y` not `[n_rows]` labels.
    """
    probs, y = _check(probs, y)
    return [chunked_nll(probs[m:m + 1], y, lambda p: p[0]) for m in range(len(probs))]


def member_params(fitted: dict[str, Any] | None, members: Sequence[int]) -> dict[str, Any]:
    """The `{name: params}` of `fitted` (an `aggregators.json`) for the stacked members
    `members`, checking that they are the members the parameters were fitted for.

    Raises:
        UsageError: other members than at fit time.
    """
    if not fitted:
        return {}
    if list(fitted["members"]) != list(members) and fitted["params"]:
        raise UsageError(f"The fitted aggregators are for members {fitted['members']}; "
                         f"these predictions have members {list(members)}. "
                         "Rerun `ensemble aggregate` on the run.")
    return fitted["params"]


def read(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's `aggregators.json`, or None when it has none (a run from before it)."""
    path = Path(run_dir) / FILENAME
    return json.loads(path.read_text()) if path.is_file() else None


def write(run_dir: str | Path, fitted: dict[str, Any]) -> Path:
    """Write `aggregators.json` atomically. Returns its path."""
    from ensemble.core import artifacts

    path = Path(run_dir) / FILENAME
    artifacts.write_text(path, json.dumps(fitted, indent=1))
    return path
