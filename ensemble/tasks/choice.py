"""Which aggregator a run answers with when none is named: the best on out-of-fold NLL.

`ensemble predict` (its one-row-per-input layout), `ensemble export` (the `serving_default`
signature, hence `ensemble serve`) and the Python API apply one rule, for both tasks: the
run's aggregator with the lowest out-of-fold validation NLL in `aggregators.json`
(`out_of_fold_nll`, `ensemble.tasks.crossfit`: a fitted aggregator scored on validation rows
it was not fitted on, so one that overfits a small validation split does not beat the plain
mean by its in-sample NLL, and has none when the mean gets every validation row right,
as NLL cannot judge its sharpness there; Gaussian NLL of the mixture for regression, NLL of the
probabilities for classification; `vote` has none). A run from before `out_of_fold_nll` is
ranked on its `validation_nll`. Ties go to the earlier aggregator of the run's list (the mean
comes first by default); a run without either (one from before `aggregators.json`) answers
with its first aggregator. `--aggregator NAME` names another.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ensemble.core.errors import UsageError


def default_aggregator(names: Sequence[str], fit: dict[str, Any] | None,
                       requested: str | None = None) -> str:
    """The aggregator to answer with.

    Args:
        names: the run's aggregators, in the run's order (`posthoc.run_aggregators`).
        fit: the run's `aggregators.json` content, or None.
        requested: the user's `--aggregator`, or None for the default rule.

    Returns:
        `requested` when given, else the aggregator of `names` with the lowest finite
        `choice_scores(fit)` (ties: the earlier one), else `names[0]`.

    Raises:
        UsageError: `requested` is not one of `names` (names the run's aggregators).
    """
    names = list(names)
    if requested is not None:
        if requested not in names:
            raise UsageError(f"Expected --aggregator to be one of the run's aggregators "
                             f"({', '.join(names)}). Received: {requested!r}")
        return requested
    scores = choice_scores(fit)
    ranked = [(float(v), i) for i, a in enumerate(names)
              if isinstance(v := scores.get(a), (int, float)) and math.isfinite(v)]
    return names[min(ranked)[1]] if ranked else names[0]


def choice_scores(fit: dict[str, Any] | None) -> dict[str, Any]:
    """The `{aggregator: NLL or None}` the default is chosen on: `fit`'s (an
    `aggregators.json`) `out_of_fold_nll`, else (a run from before it) its `validation_nll`,
    else `{}`."""
    fit = fit or {}
    return fit.get("out_of_fold_nll") or fit.get("validation_nll") or {}
