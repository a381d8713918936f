"""Range checks of a run config: every value in its domain, before anything is written.

`ensemble.config.schema.from_dict` calls `check_ranges` after the types are checked; the upper bounds
of the numbers are in `ensemble.config.bounds`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ensemble.tasks.classification import threshold
from ensemble.tasks.registry import AGGREGATOR_NAMES, LOSSES, TASKS
from ensemble.models.builtin import ACTIVATIONS
from ensemble.models.precision import PRECISIONS
from ensemble.core.errors import UsageError

if TYPE_CHECKING:
    from ensemble.config.schema import Config

IMPUTE = ("error", "median", "most_frequent")
CATEGORICAL = ("auto", "none")
LR_SCHEDULES = ("constant", "cosine")


def check_ranges(cfg: Config) -> None:
    """Every key of `cfg` in its domain (positive counts, fractions in (0, 1), known names,
    per-member overrides, the bounds of `ensemble.config.bounds`).

    Raises:
        UsageError: names the key, what was expected and the value received.
    """
    _check_counts(cfg)
    _check_overrides(cfg)
    _check_training(cfg)
    _check_placement(cfg)
    _check_aggregation(cfg)
    _check_members(cfg)
    _check_data(cfg)
    _check_names(cfg)
    from ensemble.config.bounds import check_bounds  # upper bounds, non-finite sums

    check_bounds(cfg)


def _positive(key: str, value: float) -> None:
    if value <= 0:
        raise UsageError(f"Expected `{key}` to be positive. Received: {key}={value!r}")


def _check_counts(cfg: Config) -> None:
    """Positive counts, the training loop's integers, the widths of `members.hidden`."""
    _positive("members.count", cfg.members.count)
    if cfg.training.epochs != "auto":
        if not isinstance(cfg.training.epochs, int) or cfg.training.epochs <= 0:
            raise UsageError("Expected `training.epochs` to be auto or a positive integer. "
                             f"Received: training.epochs={cfg.training.epochs!r}")
    if cfg.training.batch_size != "auto":
        if not isinstance(cfg.training.batch_size, int) or cfg.training.batch_size <= 0:
            raise UsageError("Expected `training.batch_size` to be auto or a positive integer. "
                             f"Received: training.batch_size={cfg.training.batch_size!r}")
    _positive("training.learning_rate", cfg.training.learning_rate)
    _positive("training.checkpoint_every", cfg.training.checkpoint_every)
    if cfg.training.steps_per_execution < 0:
        raise UsageError("Expected `training.steps_per_execution` to be >= 0 (0: automatic). "
                         f"Received: {cfg.training.steps_per_execution}")
    if cfg.training.intra_op_threads < 0:
        raise UsageError("Expected `training.intra_op_threads` to be >= 0 (0: TensorFlow's "
                         f"default). Received: {cfg.training.intra_op_threads}")
    for i, width in enumerate(cfg.members.hidden):
        _positive(f"members.hidden[{i}]", width)


def _check_overrides(cfg: Config) -> None:
    """`members.override`: distinct member indices, each override's values in its domain."""
    seen = set()
    for k, o in enumerate(cfg.members.override):
        key = f"members.override[{k}]"
        if o.index == -1:  # the schema's default: not given
            raise UsageError(f"Expected `{key}.index`, the member the override is for (0.."
                             f"{cfg.members.count - 1}); the override names none")
        if not 0 <= o.index < cfg.members.count or o.index in seen:
            raise UsageError(f"Expected `{key}.index` to be a distinct member index in "
                             f"0..{cfg.members.count - 1}. Received: index={o.index}")
        seen.add(o.index)
        for i, width in enumerate(o.hidden or ()):
            _positive(f"{key}.hidden[{i}]", width)
        if o.learning_rate is not None:
            _positive(f"{key}.learning_rate", o.learning_rate)
        if o.l2 is not None and o.l2 < 0:
            raise UsageError(f"Expected `{key}.l2` to be >= 0. Received: {o.l2}")
        if o.dropout is not None and not 0.0 <= o.dropout < 1.0:
            raise UsageError(f"Expected `{key}.dropout` in [0, 1). Received: {o.dropout}")
        if o.activation is not None and o.activation not in ACTIVATIONS:
            raise UsageError(f"Expected `{key}.activation` to be one of "
                             f"{', '.join(ACTIVATIONS)}. Received: {o.activation!r}")


def _check_training(cfg: Config) -> None:
    """`training`: optimizer, schedule, early stopping, adversarial step."""
    t = cfg.training
    if not isinstance(t.optimizer, str) or not t.optimizer:
        raise UsageError(f"Expected `training.optimizer` to be an optimizer name such as "
                         f"\"adam\" or \"sgd\". Received: {t.optimizer!r}")
    if t.lr_schedule not in LR_SCHEDULES:
        raise UsageError(f"Expected `training.lr_schedule` to be one of "
                         f"{', '.join(LR_SCHEDULES)}. Received: {t.lr_schedule!r}")
    if t.precision not in PRECISIONS:
        raise UsageError(f"Expected `training.precision` to be one of "
                         f"{', '.join(PRECISIONS)}. Received: {t.precision!r}")
    if t.early_stopping != "auto" and not (isinstance(t.early_stopping, int)
                                           and t.early_stopping >= 0):
        raise UsageError("Expected `training.early_stopping` to be auto or >= 0 (patience in "
                         f"epochs; 0: off). Received: {t.early_stopping!r}")
    if not t.min_delta >= 0.0:
        raise UsageError("Expected `training.min_delta` >= 0 (the drop of validation loss that "
                         f"counts as better). Received: {t.min_delta!r}")
    if not 0.0 <= t.adversarial_epsilon <= 1.0:
        raise UsageError("Expected `training.adversarial_epsilon` in [0, 1] (the sign step in "
                         "units of the scaled input's range; 0: off, the paper's 0.01). "
                         f"Received: {t.adversarial_epsilon!r}")


def _check_placement(cfg: Config) -> None:
    """`placement`, the synthetic source's sizes, the seeds."""
    if cfg.placement.strategy not in ("round-robin", "balanced"):
        raise UsageError("Expected `placement.strategy` to be \"round-robin\" or \"balanced\". "
                         f"Received: {cfg.placement.strategy!r}")
    if cfg.placement.engine not in ("local", "ray"):
        raise UsageError("Expected `placement.engine` to be \"local\" or \"ray\". "
                         f"Received: {cfg.placement.engine!r}")
    rep = cfg.placement.replicas  # data-parallel members (issue #24)
    if rep != "auto" and not (isinstance(rep, int) and rep >= 1):
        raise UsageError("Expected `placement.replicas` to be auto or a positive integer. "
                         f"Received: {rep!r}")
    syn = cfg.data.synthetic
    for name in ("rows", "features", "classes"):
        _positive(f"data.synthetic.{name}", getattr(syn, name))
    if cfg.placement.memory_limit_mb < 0:
        raise UsageError("Expected `placement.memory_limit_mb` to be >= 0 (0: no limit). "
                         f"Received: {cfg.placement.memory_limit_mb}")
    if cfg.training.seed < 0:
        raise UsageError(f"Expected `training.seed` to be >= 0. Received: {cfg.training.seed}")
    if cfg.data.split_seed < 0:
        raise UsageError(f"Expected `data.split_seed` to be >= 0. Received: {cfg.data.split_seed}")


def _check_aggregation(cfg: Config) -> None:
    """`aggregation`: greedy rounds, stacking folds, fixed weights."""
    _positive("aggregation.greedy_rounds", cfg.aggregation.greedy_rounds)
    if cfg.aggregation.stacking_folds < 2:
        raise UsageError("Expected `aggregation.stacking_folds` >= 2. "
                         f"Received: {cfg.aggregation.stacking_folds}")
    agg = cfg.aggregation
    if agg.weights and (len(agg.weights) != cfg.members.count or min(agg.weights) < 0
                        or sum(agg.weights) <= 0):
        raise UsageError(f"Expected `aggregation.weights` to be {cfg.members.count} non-negative "
                         f"numbers (one per member) with a positive sum, or empty (fitted). "
                         f"Received: {list(agg.weights)}")


def _check_members(cfg: Config) -> None:
    """`members`: l2, dropout, activation."""
    if cfg.members.l2 < 0:
        raise UsageError(f"Expected `members.l2` to be >= 0. Received: {cfg.members.l2}")
    if not 0.0 <= cfg.members.dropout < 1.0:
        raise UsageError(f"Expected `members.dropout` in [0, 1). Received: {cfg.members.dropout}")
    if cfg.members.activation not in ACTIVATIONS:
        raise UsageError(
            f"Expected `members.activation` to be one of {', '.join(ACTIVATIONS)}. "
            f"Received: {cfg.members.activation!r}"
        )


def _check_data(cfg: Config) -> None:
    """`data`: split fractions, categories, images, imputation."""
    for key in ("test_size", "validation_size"):
        value = getattr(cfg.data, key)
        if not 0.0 < value < 1.0:
            raise UsageError(f"Expected `data.{key}` in (0, 1). Received: {value}")
    if cfg.data.test_size + cfg.data.validation_size >= 0.9:
        raise UsageError("Expected `data.test_size + data.validation_size` below 0.9.")
    if cfg.data.max_categories < 0 or cfg.data.max_categories == 1:
        raise UsageError("Expected `data.max_categories` to be 0 (no limit) or at least 2. "
                         f"Received: {cfg.data.max_categories}")
    for key, low in (("embed_above", 0), ("min_frequency", 1)):
        value = getattr(cfg.data, key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 10**9:
            raise UsageError(f"Expected `data.{key}` to be an integer in {low}..1000000000. "
                             f"Received: {value!r}")
    if cfg.data.color_mode not in ("auto", "grayscale", "rgb"):
        raise UsageError("Expected `data.color_mode` to be \"auto\", \"grayscale\" or \"rgb\". "
                         f"Received: {cfg.data.color_mode!r}")
    if cfg.data.image_size and (len(cfg.data.image_size) != 2
                                or not all(0 < d <= 65536 for d in cfg.data.image_size)):
        raise UsageError("Expected `data.image_size` to be [height, width] in pixels, each 1..65536 "
                         "(or []). "
                         f"Received: {list(cfg.data.image_size)}")
    if cfg.data.impute not in IMPUTE:
        raise UsageError(f"Expected `data.impute` to be one of {', '.join(IMPUTE)}. "
                         f"Received: {cfg.data.impute!r}")
    if cfg.data.target in cfg.data.drop:
        raise UsageError(f"Cannot drop the target column {cfg.data.target!r} (--drop / data.drop "
                         "names feature columns to leave out); expected --target to name the "
                         "label column and --drop other columns")
    if not isinstance(cfg.data.categorical, str) and cfg.data.target in cfg.data.categorical:
        raise UsageError(f"Cannot one-hot encode the target column {cfg.data.target!r} "
                         "(--categorical / data.categorical names feature columns; a label "
                         "column is read as classes by --task); expected --categorical to "
                         "name other columns")
    if isinstance(cfg.data.categorical, str) and cfg.data.categorical not in CATEGORICAL:
        raise UsageError(f"Expected `data.categorical` to be \"auto\", \"none\" or a list of "
                         f"column names. Received: {cfg.data.categorical!r}")


def check_class_weight(value) -> None:
    """Check `training.class_weight`: `"none"`, `"balanced"` or a table of class label -> a
    finite weight >= 0 (Keras's and scikit-learn's dict; a class it leaves out weighs 1), not
    every weight 0.

    Raises:
        UsageError: another value, a weight that is not a finite number >= 0, or every
            weight 0 (names the key and the value).
    """
    if isinstance(value, dict):
        bad = {k: v for k, v in value.items() if isinstance(v, bool)
               or not isinstance(v, (int, float)) or not 0 <= v < float("inf")}
        if bad or (value and not any(value.values())):
            raise UsageError("Expected `training.class_weight` to map class labels to "
                             "finite weights >= 0, not all 0. Received: "
                             f"{bad or value!r}")
    elif value not in ("none", "balanced"):
        raise UsageError("Expected `training.class_weight` to be \"none\", \"balanced\" or a "
                         f"table of class label -> weight. Received: {value!r}")


def _check_names(cfg: Config) -> None:
    """Task, loss and aggregator names: the task registry's (`ensemble.tasks`)."""
    if cfg.data.task not in ("auto", *TASKS) and ":" not in cfg.data.task:
        names = ", ".join(_quoted(("auto", *TASKS)))
        raise UsageError(f"Expected `data.task` to be {names} or a task spec "
                         f"(\"module:Class\", \"file.py:Class\"). Received: {cfg.data.task!r}")
    check_class_weight(cfg.training.class_weight)
    if cfg.training.target_transform not in ("none", "log1p", "log"):
        raise UsageError("Expected `training.target_transform` to be \"none\", \"log1p\" or "
                         f"\"log\". Received: {cfg.training.target_transform!r}")
    threshold.parse(cfg.training.threshold)
    if cfg.training.loss not in LOSSES:
        raise UsageError(f"Expected `training.loss` to be {_either(LOSSES)}. "
                         f"Received: {cfg.training.loss!r}")
    bad = [a for a in cfg.aggregation.aggregators if a not in AGGREGATOR_NAMES]
    if bad or not cfg.aggregation.aggregators:
        raise UsageError(
            f"Expected `aggregation.aggregators` from {', '.join(AGGREGATOR_NAMES)}. "
            f"Received: {list(cfg.aggregation.aggregators)}"
        )


def _quoted(names) -> list[str]:
    return [f'"{n}"' for n in names]


def _either(names) -> str:
    """`"a", "b" or "c"`."""
    quoted = _quoted(names)
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]
