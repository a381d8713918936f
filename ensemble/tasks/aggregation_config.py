"""The `[aggregation]` table of a run config: the aggregators a run applies and the fitted ones' settings.

Owned by the tasks package (aggregators are task-specific); `ensemble.config` composes it into
a run's `Config` and checks it.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_AGGREGATORS = ("mean", "vote")


@dataclass(frozen=True)
class AggregationConfig:
    """Aggregators applied to the members' predictions, and the fitted ones' settings.

    `aggregators`: from `mean`, `vote`, `geometric`, `weighted`, `greedy`, `stacking`,
    `temperature` (the last four are fitted on the validation split); a regression run takes
    `mean`, `weighted`, `greedy`, `std-scaling` (`ensemble.tasks.regression.aggregators`) and applies `mean` and
    `std-scaling` when the list is the default. `weights`: fixed member
    weights for `weighted` (empty: fitted). `greedy_rounds`: additions of ensemble selection.
    `stacking_folds`: cross-validation folds choosing the stacker's regularisation.
    """

    aggregators: tuple[str, ...] = DEFAULT_AGGREGATORS
    weights: tuple[float, ...] = ()
    greedy_rounds: int = 20
    stacking_folds: int = 5
