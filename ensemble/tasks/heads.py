"""Tasks: what a member's logits mean (the head), the training loss and the validation scores.

A builder returns logits `[batch, n_outputs]`; the task says how many outputs a data set
needs, puts its head on them (the member's saved model ends with it), gives the per-batch
training loss and scores a member on the validation split each epoch. Replication, placement,
checkpoints and the CLI never look inside: they call these methods.

Classification: `n_classes` logits, a softmax head (members output probabilities), mean
sparse categorical cross-entropy (natural log) as the loss, NLL and accuracy on validation.
Regression: 2 outputs (mean, raw variance; 1 for point members trained with `mse`), the
Gaussian head of `ensemble.tasks.regression.tf_ops` (members output (mean, variance) in the target's
units), Gaussian NLL as the loss on the standardised target, NLL and RMSE on validation.

`resolve` picks the task of a data set's target under `[data] task = "auto"`.

`Task` is the protocol every task implements. A task of the user's is named by a spec
(`[data] task = "package.module:Class"` or `"path/to/file.py:Class"`, as builders are): `get`
imports it in every process of the run (a between-graph client too), and the manifest records
the spec. Such a task inherits what it does not change from `Classification` or `Regression`.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ensemble.core import specs

from ensemble.tasks.classification import evaluation as classification_evaluation
from ensemble.tasks.classification import metrics
from ensemble.tasks.classification import plots as classification_plots
from ensemble.tasks.regression import evaluation as regression_evaluation
from ensemble.tasks.regression import plots as regression_plots

TASKS = ("classification", "regression")
LOSSES = ("auto", "cross_entropy", "gaussian_nll", "mse")
BUILTIN_TASKS = {"diabetes": "regression"}  # built-in sources whose task `auto` knows
MANY_VALUES = 10  # `auto`: integer targets with more distinct values may be regression
MIN_CLASS_ROWS = 3  # rows a class needs to appear in each of the stratified train/val/test
RARE_SHARE = 0.1  # `auto`: more than this share of distinct whole numbers that rare: regression


class Task(Protocol):
    """What a run's task decides (implemented by `Classification`, `Regression`, or a class of
    the user's named by a spec)."""

    name: str
    spec: str  # how the manifest and `get` name it: a built-in name or `module:Class`
    gaussian: bool  # outputs are per-row Gaussians (mean, variance), else probabilities
    target_dtype: Any  # numpy dtype of the encoded targets
    score_names: tuple[str, ...]  # history columns of `validation_scores`
    member_score_names: tuple[str, ...]  # members.parquet columns of `member_scores`

    def n_outputs(self, n_classes: int) -> int:
        """Outputs the builder returns (`[batch, n_outputs]` logits)."""

    def head(self, logits, name: str = ...):
        """The Keras layers on the builder's logits: the member's outputs."""

    def loss(self, y, outputs):
        """The scalar float32 training loss of a batch (TensorFlow)."""

    def validation_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """`val_loss` and the task's other scores of one member, each epoch."""

    def member_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float | None]:
        """`members.parquet`'s scores of a trained member on validation."""

    def format_table(self, metrics_table, fit: dict | None = None, extra=()) -> str:
        """The `ensemble evaluate` table (`extra` lines before its closing sentence)."""

    def write_plots(self, folder, preds, metrics_table, run_dir) -> list:
        """`ensemble evaluate --plots`: writes PNGs, returns their paths."""


class Classification:
    """Probabilities over `n_classes` classes from the builder's logits."""

    name = spec = "classification"  # `spec`: how the manifest names the task
    gaussian = False  # outputs are probabilities, not per-row Gaussians
    target_dtype = np.int32  # class indices

    def n_outputs(self, n_classes: int) -> int:
        """Logits the builder must return: one per class."""
        return n_classes

    def head(self, logits, name: str = "probabilities"):
        """Softmax over the last axis: `[batch, n_classes]` logits -> probabilities."""
        import keras

        return keras.layers.Softmax(name=name)(logits)

    def loss(self, y, outputs):
        """Mean sparse categorical cross-entropy (natural log) of `outputs` `[batch,
        n_classes]` probabilities against `y` `[batch]` int32 class indices (a scalar
        float32 tensor)."""
        import keras
        import tensorflow as tf

        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, outputs))

    def validation_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """`{"val_loss": NLL, "val_accuracy": accuracy}` of one member's `[n_rows, n_classes]`
        probabilities against `y` `[n_rows]` class indices."""
        return {"val_loss": metrics.nll(y, outputs), "val_accuracy": metrics.accuracy(y, outputs)}

    member_score_names = ("val_nll", "val_accuracy")

    def fit_target(self, y_train: np.ndarray) -> tuple["Classification", dict[str, float]]:
        """The task fitted to the training targets, and the manifest's `dataset` entries it
        adds: nothing to fit for class indices."""
        return self, {}

    def with_target(self, loc: float, scale: float) -> "Classification":
        """The task for members trained on targets standardised by `loc`, `scale`: itself."""
        return self

    def target_entries(self) -> dict[str, float]:
        """The manifest's `dataset` entries of the task: none."""
        return {}

    def member_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float | None]:
        """`members.parquet`'s scores of a trained member on validation: NLL and accuracy of
        its `[n_rows, n_classes]` probabilities against `y` `[n_rows]` class indices."""
        return {"val_nll": metrics.nll(y, outputs), "val_accuracy": metrics.accuracy(y, outputs)}

    def format_table(self, metrics_table, fit: dict | None = None, extra=()) -> str:
        """The `ensemble evaluate` table of a classification run's `metrics.parquet` table;
        `extra` lines go before its closing sentence."""
        return classification_evaluation.format_table(metrics_table, fit, extra)

    def write_plots(self, folder, preds, metrics_table, run_dir) -> list:
        """`evaluate --plots`: reliability diagram, ensemble-size curve, members (PNG paths)."""
        return classification_plots.write_plots(folder, preds, metrics_table, run_dir)

    @property
    def score_names(self) -> tuple[str, ...]:
        """The keys of `validation_scores`, in order."""
        return ("val_loss", "val_accuracy")


class Regression:
    """A Gaussian per row (mean, variance; target units) from the builder's outputs.

    Args:
        loc, scale: the training target's mean and standard deviation (the standardisation
            the losses apply and the head undoes).
        loss: `"gaussian_nll"` (default) or `"mse"` (point members: variance 0).
    """

    name = spec = "regression"
    gaussian = True  # outputs are per-row Gaussians: (mean, variance), target units
    target_dtype = np.float32

    def __init__(self, loc: float = 0.0, scale: float = 1.0, loss: str = "gaussian_nll"):
        self.loc, self.scale = float(loc), float(scale) if scale > 0 else 1.0
        self.loss_name = "gaussian_nll" if loss in ("auto", None) else loss
        if self.loss_name not in ("gaussian_nll", "mse"):
            raise ValueError(f"Expected a regression loss, gaussian_nll or mse. "
                             f"Received: {loss!r}")

    @property
    def point(self) -> bool:
        return self.loss_name == "mse"

    def n_outputs(self, n_classes: int = 0) -> int:
        """Outputs the builder must return: mean and raw variance (1 for point members)."""
        return 1 if self.point else 2

    def head(self, logits, name: str = "gaussian"):
        """`ensemble.tasks.regression.tf_ops.GaussianHead`: `[batch, n_outputs]` -> `[batch, 2]` (mean,
        variance), target units."""
        from ensemble.tasks.regression.tf_ops import GaussianHead

        return GaussianHead(self.loc, self.scale, self.point, name=name)(logits)

    def loss(self, y, outputs):
        """Mean Gaussian NLL (or MSE) of `y` `[batch]` float32 targets under `outputs`
        `[batch, 2]`, on the standardised target (`ensemble.tasks.regression.tf_ops`)."""
        from ensemble.tasks.regression import tf_ops as RT

        fn = RT.mse if self.point else RT.gaussian_nll
        return fn(y, outputs, self.loc, self.scale)

    def validation_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """`{"val_loss": Gaussian NLL (target units; MSE for point members), "val_rmse"}` of
        one member's `[n_rows, 2]` outputs against `y` `[n_rows]`."""
        from ensemble.tasks.regression import metrics as RM

        y, out = np.asarray(y, np.float64), np.asarray(outputs, np.float64)
        rmse = RM.rmse(y, out[:, 0])
        loss = rmse ** 2 if self.point else RM.nll(y, out[:, 0], np.sqrt(out[:, 1]))
        return {"val_loss": float("inf") if loss is None else loss, "val_rmse": rmse}

    @property
    def score_names(self) -> tuple[str, ...]:
        return ("val_loss", "val_rmse")

    member_score_names = ("val_nll", "val_rmse")

    def fit_target(self, y_train: np.ndarray) -> tuple["Regression", dict[str, float]]:
        """The task on targets standardised by the training split's mean and std (`y_train`
        `[n_train]`, target units), and the manifest's `dataset` entries `target_loc`,
        `target_scale`."""
        loc = float(np.mean(y_train))
        scale = float(np.std(y_train)) or 1.0
        task = self.with_target(loc, scale)
        return task, task.target_entries()

    def with_target(self, loc: float, scale: float) -> "Regression":
        """The task for members trained on targets standardised by `loc`, `scale`."""
        return Regression(loc, scale, self.loss_name)

    def target_entries(self) -> dict[str, float]:
        """The manifest's `dataset` entries: the target's standardisation."""
        return {"target_loc": self.loc, "target_scale": self.scale}

    def member_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float | None]:
        """`members.parquet`'s scores of a trained member on validation: Gaussian NLL (target
        units; None for a point member) and RMSE of its `[n_rows, 2]` (mean, variance)."""
        from ensemble.tasks.regression import metrics as RM

        y, out = np.asarray(y, np.float64), np.asarray(outputs, np.float64)
        return {"val_nll": None if self.point else RM.nll(y, out[:, 0], np.sqrt(out[:, 1])),
                "val_rmse": RM.rmse(y, out[:, 0])}

    def format_table(self, metrics_table, fit: dict | None = None, extra=()) -> str:
        """The `ensemble evaluate` table of a regression run's `metrics.parquet` table;
        `extra` lines go before its closing sentence."""
        return regression_evaluation.format_table(metrics_table, fit, extra)

    def write_plots(self, folder, preds, metrics_table, run_dir) -> list:
        """`evaluate --plots`: PIT histogram, interval coverage, error against predicted std
        (PNG paths)."""
        return regression_plots.write_plots(folder, preds, metrics_table, run_dir)


def resolve(y: np.ndarray | None, requested: str = "auto", source: str = "") -> str:
    """The task of a target `y` `[n_rows]` under `[data] task = requested`.

    `auto`: text labels and integer labels with few distinct values are classification;
    non-integer numbers are regression; whole numbers with more than `MANY_VALUES` distinct
    values of which more than `RARE_SHARE` occur on fewer than `MIN_CLASS_ROWS` rows (too
    rare for a stratified split: prices, counts) are regression, with a notice naming
    `--task classification`. Built-in sources of `BUILTIN_TASKS` have their known task.

    Raises:
        UsageError: a text target asked to be regression, or a non-integer one asked to be
            classification.
    """
    from ensemble.core.errors import UsageError

    if specs.is_spec(requested):
        get(requested)  # importable, and a task
        return requested
    if requested not in ("auto", *TASKS):
        raise UsageError(f"Expected `data.task` to be auto, classification, regression or a "
                         f"task spec (module:Class). Received: {requested!r}")
    if y is None:
        return "classification" if requested == "auto" else requested
    y = np.asarray(y)
    text = y.dtype.kind in "USOb"
    whole = not text and bool(np.all(np.isfinite(y)) and np.all(y == np.round(y)))
    if requested == "regression":
        if text:
            raise UsageError(f"Target of {source or 'the data'} holds text labels; "
                             "--task regression needs numbers.")
        return requested
    if requested == "classification":
        if not text and not whole:
            raise UsageError(f"Target of {source or 'the data'} holds non-integer numbers; "
                             "--task classification needs class labels (or use --task "
                             "regression).")
        return requested
    if source in BUILTIN_TASKS:
        return BUILTIN_TASKS[source]
    if text:
        return "classification"
    if not whole:
        return "regression"
    _, counts = np.unique(y, return_counts=True)
    rare = float(np.mean(counts < MIN_CLASS_ROWS))
    if len(counts) > MANY_VALUES and rare > RARE_SHARE:
        from ensemble.core.notices import notice

        notice(f"the target of {source or 'the data'} holds {len(counts):,} distinct whole "
               f"numbers, {rare:.0%} of them on fewer than {MIN_CLASS_ROWS} rows: trained as "
               "regression (--task classification to take them as classes)", once=True)
        return "regression"
    return "classification"


def get(name: str = "classification", **options) -> Classification | Regression:
    """The task object of `name`; `options` go to `Regression` (`loc`, `scale`, `loss`).

    Raises:
        ValueError: an unknown task name.
    """
    if name == "regression":
        return Regression(**options)
    if specs.is_spec(name):
        task = specs.load(name, "task")
        task = task() if isinstance(task, type) else task
        missing = [m for m in ("n_outputs", "head", "loss", "validation_scores", "member_scores",
                               "format_table", "write_plots") if not callable(getattr(task, m, None))]
        if missing:
            from ensemble.core.errors import UsageError

            raise UsageError(f"Task {name!r} lacks {', '.join(missing)}; subclass "
                             "ensemble.tasks.heads.Classification or Regression.")
        task.spec = name
        return task
    if name != "classification":
        raise ValueError(f"Expected a task in {', '.join(TASKS)}. Received: {name!r}")
    return Classification()


def for_run(manifest: dict) -> Classification | Regression:
    """The task of a run from its manifest (`task`, the target's standardisation in
    `dataset.target_loc` / `target_scale`, `config.training.loss`)."""
    name = manifest.get("task", "classification")
    if name != "regression":
        return get(name)
    d = manifest["dataset"]
    loss = manifest.get("config", {}).get("training", {}).get("loss", "auto")
    return Regression(d.get("target_loc", 0.0), d.get("target_scale", 1.0), loss)


def of_model(model) -> Classification | Regression:
    """The task of a built or loaded member: regression when its last layer is the Gaussian
    head (`ensemble.tasks.regression.tf_ops.GaussianHead`), else classification."""
    last = model.layers[-1] if getattr(model, "layers", None) else None
    if type(last).__name__ == "GaussianHead":
        return Regression(last.loc, last.scale, "mse" if last.point else "gaussian_nll")
    return Classification()


def for_target(y: np.ndarray | None, requested: str = "auto", source: str = "",
               loss: str = "auto", aggregators=("mean",)) -> Classification | Regression:
    """The task of a run's targets `y` `[n_rows]` under `[data] task = requested` (`resolve`),
    checked against the run's `training.loss` and `aggregation.aggregators`.

    Raises:
        UsageError: an ambiguous target, a single class, an aggregator or loss of another task
            (one line).
    """
    from ensemble.core.errors import UsageError
    from ensemble.tasks.regression import aggregators as regression

    name = resolve(y, requested, source)
    regressing = name == "regression"
    if not regressing and y is not None and len(np.unique(y)) < 2:
        raise UsageError(f"Data {source} has fewer than two classes; expected at least two.")
    regression.check_aggregators(regression.task_aggregators(aggregators, name), name)
    if regressing == (loss == "cross_entropy") and loss != "auto":
        raise UsageError(f"`training.loss = \"{loss}\"` does not fit a {name} run; expected "
                         + ("gaussian_nll or mse." if regressing else
                            "cross_entropy (or auto)."))
    return get(name, loss=loss) if regressing else get(name)


def for_classes(classes, loss: str = "auto") -> Classification | Regression:
    """The task of a run with `classes` (an empty class list: regression, trained with
    `loss`)."""
    return get("regression", loss=loss) if is_regression(classes) else get()


def of_metrics(metrics_table) -> Classification | Regression:
    """The task whose metrics `metrics_table` (a `metrics.parquet` table) holds: regression
    when it has an `rmse` column."""
    return Regression() if "rmse" in metrics_table.column_names else Classification()


def format_table(metrics_table, fit: dict | None = None, extra=()) -> str:
    """The `ensemble evaluate` table of `metrics_table` by its task; `fit` is the run's
    `aggregators.json` content (or None); `extra` lines go before the closing sentence.

    Raises:
        UsageError: the metrics hold no row.
    """
    return of_metrics(metrics_table).format_table(metrics_table, fit, extra)


def is_regression(classes) -> bool:
    """A run's class list is empty exactly when its task is regression."""
    return classes is not None and len(classes) == 0
