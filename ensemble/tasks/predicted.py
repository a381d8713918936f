"""What a run predicted on one split, as arrays: the input of its prediction and metrics tables."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class SplitPredictions(NamedTuple):
    """One split's predictions.

    Attributes:
        members: member index -> `[n_rows, n_outputs]` (probabilities, or a regression
            member's mean and variance).
        ensembles: aggregator -> `[n_rows, n_outputs]` (a regression aggregator's mean,
            aleatoric and epistemic variance); None: computed from `members`.
        rows: `[n_rows]` int64 row positions in the source (`source_row`).
        y: `[n_rows]` targets (class indices, or regression targets), or None when unknown.
        first_row: column `row` of the first row (a streamed prediction's batch offset).
    """

    members: dict
    ensembles: dict | None
    rows: np.ndarray
    y: np.ndarray | None
    first_row: int = 0
