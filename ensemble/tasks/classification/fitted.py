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
MISSING_CLASS_LOGIT = -50.0  # a class absent from the validation labels gets no mass


def _check(probs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    probs = A._check(probs).astype(np.float64)
    y = np.asarray(y, np.int64)
    if y.shape != (probs.shape[1],):
        raise UsageError(f"Expected {probs.shape[1]} validation labels. Received: {y.shape}")
    return probs, y


def fit_weights(probs: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Member weights on the simplex minimising the validation NLL of `sum_m w_m p_m`.

    Returns:
        `{"weights": [n_members]}`.
    """
    from scipy.optimize import minimize

    probs, y = _check(probs, y)
    true = np.clip(probs[:, np.arange(len(y)), y].T, 0.0, 1.0)  # [n_rows, n_members]
    n = probs.shape[0]

    def loss(w):
        mix = np.clip(true @ w, M.NLL_CLIP, None)
        return -np.mean(np.log(mix)), -(true / mix[:, None]).mean(axis=0)

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
    total = np.zeros(probs.shape[1:])
    order, best, size = [], np.inf, 0
    for r in range(1, rounds + 1):
        scores = [M.nll(y, (total + p) / r) for p in probs]
        pick = int(np.argmin(scores))
        order.append(pick)
        total += probs[pick]
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

    probs, y = _check(probs, y)
    x, n_classes = A.stacking_features(probs), probs.shape[2]
    present = np.unique(y)
    folds = 0 if c is not None else int(min(folds, np.bincount(y)[present].min()))
    c = 1.0 if c is None else float(c)
    if folds >= 2 and len(present) >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cv = LogisticRegressionCV(Cs=10, cv=StratifiedKFold(folds, shuffle=True,
                                                                random_state=seed),
                                      scoring="neg_log_loss", max_iter=1000).fit(x, y)
        c = float(np.ravel(cv.C_)[0])
    coef = np.zeros((n_classes, x.shape[1]))
    intercept = np.full(n_classes, MISSING_CLASS_LOGIT)
    if len(present) < 2:  # one class only: it gets all the mass
        intercept[present] = 0.0
        return {"coef": coef.tolist(), "intercept": intercept.tolist(), "C": c, "folds": 0}
    model = LogisticRegression(C=c, max_iter=1000).fit(x, y)
    if len(model.classes_) == 2:  # binary: sigmoid(z) = softmax([0, z])
        coef[model.classes_[1]], intercept[model.classes_] = model.coef_[0], [0.0,
                                                                             model.intercept_[0]]
    else:
        coef[model.classes_], intercept[model.classes_] = model.coef_, model.intercept_
    return {"coef": coef.tolist(), "intercept": intercept.tolist(), "C": c, "folds": folds}


def fit_temperature(probs: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The temperature T in [0.05, 20] minimising the validation NLL of
    `softmax(log(mean_m p_m) / T)`. Returns `{"temperature": T}`."""
    from scipy.optimize import minimize_scalar

    probs, y = _check(probs, y)
    res = minimize_scalar(lambda t: M.nll(y, A.temperature_scaled(probs, np.exp(t))),
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
    return [M.nll(y, p) for p in probs]


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
