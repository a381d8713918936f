"""Which aggregator a run answers with when none is named: the best on validation NLL.

`ensemble predict` (its one-row-per-input layout), `ensemble export` (the `serving_default`
signature, hence `ensemble serve`) and the Python API apply one rule, for both tasks: the
run's aggregator with the lowest validation NLL in `aggregators.json` (`validation_nll`,
fitted on the validation split only: Gaussian NLL of the mixture for regression, NLL of the
probabilities for classification; `vote` has none). Ties go to the earlier aggregator of the
run's list; a run without validation NLLs (one from before `aggregators.json`) answers with
its first aggregator. `--aggregator NAME` names another.
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
        validation NLL (ties: the earlier one), else `names[0]`.

    Raises:
        UsageError: `requested` is not one of `names` (names the run's aggregators).
    """
    names = list(names)
    if requested is not None:
        if requested not in names:
            raise UsageError(f"Expected --aggregator to be one of the run's aggregators "
                             f"({', '.join(names)}). Received: {requested!r}")
        return requested
    scores = (fit or {}).get("validation_nll") or {}
    ranked = [(float(v), i) for i, a in enumerate(names)
              if isinstance(v := scores.get(a), (int, float)) and math.isfinite(v)]
    return names[min(ranked)[1]] if ranked else names[0]
