"""Upper bounds of a run config's numbers: the largest values a run can use (beyond them:
memory, integer overflow in seeds, divergence), checked by `ensemble.config` after types and
finiteness, before anything is written.
"""

from __future__ import annotations

import math
from typing import Any

from ensemble.errors import UsageError


SEED_MAX = 2 ** 32 - 1  # scikit-learn's random_state, NumPy's legacy seeds
UPPER = {  # key -> the largest value a run can use (beyond: memory, overflow, divergence)
    "members.count": 10_000, "training.epochs": 1_000_000, "training.batch_size": 2 ** 31 - 1,
    "training.checkpoint_every": 2 ** 31 - 1, "training.steps_per_execution": 2 ** 31 - 1,
    "training.intra_op_threads": 4096,
    "training.learning_rate": 10.0, "members.l2": 100.0, "training.seed": SEED_MAX,
    "data.split_seed": SEED_MAX, "data.synthetic.seed": SEED_MAX,
    "data.synthetic.rows": 100_000_000, "data.synthetic.features": 100_000,
    "data.synthetic.classes": 10_000, "placement.memory_limit_mb": 2 ** 31 - 1,
    "aggregation.greedy_rounds": 1_000_000, "aggregation.stacking_folds": 100,
}
WIDTH_MAX = 2 ** 20  # units of one hidden layer


def check_bounds(cfg) -> None:
    """Upper bounds of every numeric key (`UPPER`), hidden widths, per-member overrides, the
    weights' sum and the synthetic source's own constraints.

    Raises:
        UsageError: names the key, its bound and the value received.
    """
    def at_most(key: str, value: float, bound: float) -> None:
        if value > bound:
            raise UsageError(f"Expected `{key}` <= {bound:g}. Received: {key}={value!r}")

    for key, bound in UPPER.items():
        node: Any = cfg
        for part in key.split("."):
            node = getattr(node, part)
        at_most(key, node, bound)
    for i, width in enumerate(cfg.members.hidden):
        at_most(f"members.hidden[{i}]", width, WIDTH_MAX)
    for k, o in enumerate(cfg.members.override):
        for i, width in enumerate(o.hidden or ()):
            at_most(f"members.override[{k}].hidden[{i}]", width, WIDTH_MAX)
        if o.learning_rate is not None:
            at_most(f"members.override[{k}].learning_rate", o.learning_rate,
                    UPPER["training.learning_rate"])
        if o.l2 is not None:
            at_most(f"members.override[{k}].l2", o.l2, UPPER["members.l2"])
    if not math.isfinite(sum(cfg.aggregation.weights)):
        raise UsageError("Expected `aggregation.weights` to have a finite sum. Received: "
                         f"{list(cfg.aggregation.weights)}")
    syn = cfg.data.synthetic
    if syn.classes < 2 or 2 * syn.classes > 2 ** max(2, syn.features // 2):
        raise UsageError("Expected `data.synthetic.classes` >= 2 and at most "
                         "2 ** max(2, features // 2) / 2 (two clusters per class in the "
                         f"informative features). Received: classes={syn.classes}, "
                         f"features={syn.features}")
