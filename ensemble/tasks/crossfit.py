"""Out-of-fold validation NLL of a run's aggregators: the score that picks predict's default.

A fitted aggregator (weights, greedy selection, stacking, temperature or std scaling) is fitted
on the validation rows; its NLL on those same rows is in-sample and flatters it, the more so
the fewer the rows (30 separable rows fit a temperature of 0.06: NLL 0 on validation, twice
the mean's on test). The field's answer is cross-fitting: split the validation rows into K
folds (scikit-learn `StratifiedKFold` for a stratified task whose every class has K rows,
else `KFold`, shuffled with seed 0), fit each fitted aggregator on K - 1 folds, apply it to
the held-out fold, and score the NLL of the held-out rows put back together. An aggregator
that fits nothing (`mean`, `geometric`) is scored on the same rows, so its out-of-fold NLL is
its validation NLL (above `MAX_ROWS` rows: its NLL on the sample). The parameters a run
applies are still the ones fitted on every validation row; only the choice among aggregators
(`ensemble.tasks.choice`) uses these scores.

Cross-fitting is blind in one case, common on small splits: validation rows the plain mean
gets all right (a classifier's 30 rows, none wrong). Every held-out fold then says a sharper
temperature or stacker costs nothing (NLL near 0), and the first wrong row at test time pays
for it (digits, 31 validation rows: temperature's test NLL 0.53 against the mean's 0.14).
NLL cannot price overconfidence without a mistake to price it on, so then the fitted
aggregators get no out-of-fold NLL (None) and the default stays with those fitting nothing
(`Task.mistakes`: the classification task counts the mean's wrong rows; regression has no
such case, a residual is never 0).

Above `MAX_ROWS` validation rows the folds are drawn from a seeded sample of `MAX_ROWS` rows
(every aggregator scored on the same sample): at that size an in-sample NLL hardly flatters,
and `ensemble aggregate` keeps to a few times one fit.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

FOLDS = 5  # cross-fitting folds (fewer when the validation split has fewer rows)
MAX_ROWS = 20_000  # validation rows cross-fitted at most (a seeded sample above it)
SMALL_VALIDATION = 100  # fewer validation rows than this: `small_validation_notice` speaks
REUSE_ROWS = 1_000  # from this many cross-fitted rows, folds reuse the full fit's C
SEED = 0


def folds(y: np.ndarray, stratified: bool, k: int = FOLDS,
          seed: int = SEED) -> list[tuple[np.ndarray, np.ndarray]]:
    """The cross-fitting folds of targets `y` `[n_rows]`: `(fit rows, held-out rows)` index
    pairs, every row held out exactly once.

    `k` is lowered to `n_rows`; with `stratified` (class indices in `y`) and every present
    class holding at least `k` rows, `StratifiedKFold`, else `KFold`; both shuffled with
    `seed`.

    Returns:
        `k` pairs of int arrays, or `[]` when `n_rows < 2` (nothing to hold out).
    """
    from sklearn.model_selection import KFold, StratifiedKFold

    y = np.asarray(y)
    k = min(int(k), len(y))
    if k < 2:
        return []
    if stratified:
        counts = np.unique(y, return_counts=True)[1]
        if counts.min() >= k:
            split = StratifiedKFold(k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y)
            return [(a, b) for a, b in split]
    return [(a, b) for a, b in KFold(k, shuffle=True, random_state=seed).split(np.zeros(len(y)))]


def sample_rows(n_rows: int, cap: int = MAX_ROWS, seed: int = SEED) -> np.ndarray:
    """The validation rows cross-fitted: all `n_rows`, or a seeded sorted sample of `cap`."""
    if n_rows <= cap:
        return np.arange(n_rows)
    return np.sort(np.random.default_rng(seed).choice(n_rows, cap, replace=False))


def out_of_fold_nll(task, outputs: np.ndarray, y: np.ndarray, names: Sequence[str],
                    settings: dict[str, Any], params: dict[str, Any] | None = None
                    ) -> tuple[dict[str, float | None], dict[str, int]]:
    """Every aggregator's NLL on validation rows it was not fitted on (`FOLDS` folds over at
    most `MAX_ROWS` rows).

    Args:
        task: the run's `ensemble.tasks.base.Task` (its aggregators, `ensemble_nll`,
            `stratified`).
        outputs: the members' validation outputs `[n_members, n_rows, k_out]`.
        y: validation targets `[n_rows]`.
        names: the aggregators to score (all of `task`'s).
        settings: the complete `[aggregation]` table the fits take.
        params: `{name: parameters fitted on every row}`; from `REUSE_ROWS` cross-fitted
            rows on, each fold's fit gets its aggregator's as `settings["refit"]` and reuses
            a hyperparameter they chose by their own cross-validation (stacking's C) instead
            of a nested one (50 logistic fits a fold; the leak of C is small at that size,
            large on a few dozen rows, where the nested one costs nothing).

    Returns:
        `({name: NLL or None}, {"folds": folds used (0 without a fitted aggregator), "rows":
        rows scored, "mistakes": rows of them the mean gets wrong, None where the task
        counts none})`: None for an aggregator with no NLL (`vote`), for a fitted one when
        fewer than 2 rows leave nothing to hold out or when the mean gets no row wrong
        (`mistakes` 0), and where the NLL is not finite.

    Raises:
        UsageError: an aggregator `task` does not have, or a fit refusing its rows.
    """
    task.check_aggregators(names)
    rows = sample_rows(len(y), MAX_ROWS)
    outputs, y = np.asarray(outputs)[:, rows], np.asarray(y)[rows]
    fitted = set(task.fitted_names(names))
    pairs = folds(y, task.stratified, FOLDS) if fitted else []  # only fits are held out
    mistakes = task.mistakes(outputs, y)
    scores: dict[str, float | None] = {}
    for name in names:
        if name not in fitted:
            held = task.aggregate(outputs, name)
        elif not pairs or mistakes == 0:
            scores[name] = None
            continue
        else:
            reuse = (params or {}).get(name) if len(y) >= REUSE_ROWS else None
            held, refit = None, {**settings, "refit": reuse}
            for fit_rows, test_rows in pairs:
                fold = task.aggregators[name].fit_on(outputs[:, fit_rows], y[fit_rows], refit)
                part = task.aggregate(outputs[:, test_rows], name, fold)
                if held is None:
                    held = np.empty((len(y), *part.shape[1:]), part.dtype)
                held[test_rows] = part
        value = task.ensemble_nll(y, held, name)
        scores[name] = float(value) if value is not None and math.isfinite(value) else None
    return scores, {"folds": len(pairs), "rows": int(len(y)), "mistakes": mistakes}


def small_validation_notice(n_rows: int, fitted_names: Sequence[str],
                            threshold: int = SMALL_VALIDATION) -> str | None:
    """The notice for fitted aggregators fitted on fewer than `threshold` validation rows
    (what to do about it), or None when there are enough rows or no fitted aggregator."""
    if not fitted_names or n_rows >= threshold:
        return None
    return (f"the fitted aggregators ({', '.join(fitted_names)}) are fitted on only {n_rows} "
            f"validation row{'s' * (n_rows != 1)} (under {threshold}): they overfit easily "
            "and their out-of-fold NLL, which chooses predict's default aggregator, is noisy. "
            "Give validation more rows (the config's `data.validation_size`, a fraction of "
            "all rows, 0.1 by default: `ensemble train --set data.validation_size=0.3`), or "
            "answer with `ensemble predict --aggregator mean`.")
