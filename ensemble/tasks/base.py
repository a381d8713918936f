"""The Task base: what a run's task decides, and its aggregators as a registry of objects.

A task (`ensemble.tasks.classification.task.Classification`,
`ensemble.tasks.regression.task.Regression`, or a class of the user's named by a spec)
subclasses `Task`. Code outside `ensemble/tasks/` never asks which task a run has: it calls
these methods. A builder returns logits `[batch, n_outputs]`; the task puts its head on them,
gives the training loss and the validation scores, and owns aggregation: every `Aggregator`
holds its numpy function, the name of its TensorFlow twin (imported only when a graph needs
it, so `ensemble aggregate` runs without TensorFlow) and, for a fitted one, its fit on the
validation split.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ensemble.core.errors import UsageError


def _resolve(ref: str | Callable) -> Callable:
    """The function named `module:function` (imported on first use), or `ref` itself when it
    is a function (a task of the user's defines its aggregators' functions beside it)."""
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Aggregator:
    """One aggregator of a task.

    Args:
        name: its name in configs, `aggregators.json` and the `aggregator` column.
        apply: numpy function `(outputs [n_members, n_rows, k], params | None) -> [n_rows, j]`.
        twin: its TensorFlow twin, same arguments and result (tensors): a function, or its
            `module:function` (imported only when a graph needs it).
        fit: its fit `(outputs, y [n_rows], settings) -> params` on the validation split
            (JSON-able; a function or its `module:function`), or None when nothing is fitted.
        probabilities: its rows are probabilities (False for `vote`'s vote shares).
        selects: its fitted parameters select members with repeats: `order` (the picks, in
            order) and `weights` `[n_members]` (pick counts over the picks), which the size
            curve and the `weight` column of `members.parquet` show (Caruana et al. 2004).
    """

    name: str
    apply: Callable[[np.ndarray, Any], np.ndarray]
    twin: str | Callable
    fit: str | Callable | None = None
    probabilities: bool = True
    selects: bool = False

    @property
    def fitted(self) -> bool:
        return self.fit is not None

    def __call__(self, outputs: np.ndarray, params: dict | None = None) -> np.ndarray:
        """The numpy ensemble rows of `outputs`.

        Raises:
            UsageError: a fitted aggregator without its parameters.
        """
        if self.fitted and not params:
            raise UsageError(f"Aggregator {self.name!r} is fitted on the validation split; "
                             "its parameters are missing (run `ensemble aggregate`).")
        return self.apply(outputs, params)

    def apply_tf(self, outputs, params: dict | None = None):
        """The TensorFlow twin's rows (imports TensorFlow).

        Raises:
            ValueError: a fitted aggregator without its parameters.
        """
        if self.fitted and not params:
            raise ValueError(f"Aggregator {self.name!r} needs its fitted parameters "
                             "(aggregators.json).")
        return _resolve(self.twin)(outputs, params)

    def fit_on(self, outputs: np.ndarray, y: np.ndarray, settings: dict) -> dict:
        """Its parameters fitted on validation `outputs` and targets `y` (`settings`: the
        config's `[aggregation]` table)."""
        return _resolve(self.fit)(outputs, y, settings)


def registry(*aggregators: Aggregator) -> dict[str, Aggregator]:
    """`{name: aggregator}` in declaration order."""
    return {a.name: a for a in aggregators}


def check_weights(weights: Any, n_members: int) -> np.ndarray:
    """Member weights as a float64 vector `[n_members]` summing to 1.

    Raises:
        UsageError: not `n_members` non-negative numbers with a positive sum.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n_members,) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise UsageError(f"Expected {n_members} non-negative member weights with a positive sum. "
                         f"Received: weights={np.asarray(weights).tolist()}")
    return w / w.sum()


def fit_member_weights(fit_weights: Callable, outputs: np.ndarray, y: np.ndarray,
                       settings: dict) -> dict[str, Any]:
    """`weighted`: the config's `aggregation.weights` (normalised) when given, else the weights
    `fit_weights(outputs, y)` fits on validation; `source` says which."""
    if settings.get("weights"):
        return {"weights": check_weights(settings["weights"], len(outputs)).tolist(),
                "source": "config"}
    return {**fit_weights(outputs, y), "source": "fitted"}


# the scores an evaluation asks of the task: what they are, the flag that asks for them
_EVALUATIONS = {"ood_scores": ("out-of-distribution scores", "--ood"),
                "shift_scores": ("dataset-shift metrics", "--shift")}


class Task(ABC):
    """What a run's task decides. Subclasses set the class attributes and implement the
    abstract methods; aggregation is shared here over `aggregators`."""

    name: str
    spec: str  # how the manifest and `get` name it: a built-in name or `module:Class`
    gaussian: bool  # outputs are per-row Gaussians (mean, variance), else probabilities
    target_dtype: Any  # numpy dtype of the encoded targets
    stratified: bool  # its train/validation/test split is stratified by class
    transforms_target: bool = False  # takes `training.target_transform` (`with_transform`)
    losses: tuple[str, ...]  # `training.loss` values the task trains with (besides `auto`)
    score_names: tuple[str, ...]  # history columns of `validation_scores`
    member_score_names: tuple[str, ...]  # members.parquet columns of `member_scores`
    aggregators: dict[str, Aggregator]  # the task's registry, in the order names are listed
    default_aggregators: tuple[str, ...]  # applied when the config keeps the default list
    fit_entries: dict[str, str] = {}  # extra entries of its `aggregators.json`
    tf_module: str  # the module of its TensorFlow side (twins, `serving_outputs`)
    score_units: tuple[str, str] = ("", "")  # progress lines: after the loss, after the score
    output_dtype: Any = np.float64  # numpy dtype of a member's outputs read from a table
    uncertainty_column: str | None = None  # an ensemble row's per-row uncertainty column
    confidence: str | None = None  # what ranks rows in evaluate's confidence block, or None
    shift_metrics: tuple[str, ...] = ("nll",)  # the metrics `evaluate --shift` prints, plots
    threshold: float | str | None = None  # `with_threshold`: a number, a metric name or None
    transform: Any = None  # a `TargetTransform` (`Regression.with_transform`): log(y + shift)

    @abstractmethod
    def n_outputs(self, n_classes: int) -> int:
        """Outputs the builder returns (`[batch, n_outputs]` logits)."""

    @abstractmethod
    def head(self, logits, name: str = ...):
        """The Keras layers on the builder's logits: the member's outputs."""

    @abstractmethod
    def loss(self, y, outputs):
        """The scalar float32 training loss of a batch (TensorFlow)."""

    @abstractmethod
    def validation_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """`val_loss` and the task's other scores of one member, each epoch."""

    @abstractmethod
    def member_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float | None]:
        """`members.parquet`'s scores of a trained member on validation."""

    def with_class_weight(self, mode: str | dict, y_train: np.ndarray, classes: Sequence
                          ) -> tuple["Task", dict]:
        """The task whose loss weights each class (`training.class_weight = mode`; `classes`:
        the run's class labels), and the manifest `dataset` entries it adds
        (`Classification`'s); itself and `{}` for `"none"`.

        Raises:
            UsageError: another mode for a task without classes.
        """
        if mode == "none":
            return self, {}
        raise UsageError(f"Expected `training.class_weight = \"none\"` for a {self.name} "
                         f"task (class weights need classes). Received: {mode!r}")

    def with_threshold(self, setting: Any, n_classes: int, target: str | None = None
                       ) -> "Task":
        """The task whose ensembles set `y_pred` by a decision threshold (`training.threshold
        = setting`, `ensemble.tasks.classification.threshold`; `Classification`'s).

        Raises:
            UsageError: a threshold for a task without two classes.
        """
        from ensemble.tasks.classification import threshold

        threshold.check_task(threshold.parse(setting), n_classes, self.name, target)
        return self

    @abstractmethod
    def fit_target(self, y_train: np.ndarray) -> tuple["Task", dict[str, float]]:
        """The task fitted to the training targets, and the manifest `dataset` entries it adds."""

    @abstractmethod
    def with_target(self, loc: float, scale: float) -> "Task":
        """The task for members trained on targets standardised by `loc`, `scale`."""

    @abstractmethod
    def target_entries(self) -> dict[str, float]:
        """The manifest's `dataset` entries of the task."""

    @abstractmethod
    def format_table(self, metrics_table, fit: dict | None = None, extra=()) -> str:
        """The `ensemble evaluate` table (`extra` lines before its closing sentence)."""

    @abstractmethod
    def write_plots(self, folder, preds, metrics_table, run_dir) -> list:
        """`ensemble evaluate --plots`: writes PNGs of `preds`, a predictions file's arrays
        (`ensemble.tasks.model_arrays.read`), returns their paths."""

    @abstractmethod
    def member_losses(self, y: np.ndarray, outputs: np.ndarray) -> list[float]:
        """Per member of `outputs` `[n_members, n_rows, k]`, the validation loss that picks
        the best member (lowest)."""

    @abstractmethod
    def ensemble_nll(self, y: np.ndarray, rows: np.ndarray, name: str) -> float | None:
        """The validation NLL of aggregator `name`'s rows (None where it has none)."""

    @abstractmethod
    def epoch_scalars(self, y: np.ndarray, outputs: np.ndarray,
                      names: Sequence[str]) -> dict[str, float]:
        """The ensemble's validation scalars after an epoch (TensorBoard tags -> values) of
        member `outputs` `[n_members, n_rows, k]`, for the run's aggregators `names`."""

    @abstractmethod
    def refusal(self, name: str, names: Sequence[str]) -> str:
        """The one-line message refusing aggregator `name` (not this task's) in `names`."""

    # -- the task's tables (docs/reference/run-directory.md) -------------------------------
    @abstractmethod
    def output_columns(self, classes) -> list[str]:
        """The columns of a predictions table that hold a model's outputs, in order (what
        `outputs_of` and `ensemble evaluate` read); `classes`: the run's class labels."""

    def outputs_of(self, table, classes) -> np.ndarray:
        """A member's outputs `[n_rows, k]` (`output_dtype`) from its rows of a predictions
        table (`table`: a pyarrow table or record batch): its `output_columns` stacked."""
        cols = [table.column(c).to_numpy(zero_copy_only=False)
                for c in self.output_columns(classes)]
        return np.column_stack(cols).astype(self.output_dtype, copy=False).reshape(
            table.num_rows, len(cols))

    @abstractmethod
    def prediction_chunks(self, split: str, pred, classes, aggregators: Sequence[str],
                          params: dict | None, chunk_rows: int):
        """The rows of `predictions.parquet` of one split as pyarrow tables of at most
        `chunk_rows` rows, model by model (members in index order, then `aggregators`):
        the key columns of `ensemble.tasks.table_parts.key_columns`, the task's value
        columns (`y_true`, ...), then `source_row`.

        Args:
            pred: the split's `ensemble.tasks.predicted.SplitPredictions`; its `ensembles`
                are computed from its members by `aggregate` when None.
            params: the fitted aggregators' parameters (`aggregators.json`'s `params`).
        """

    def predictions_metadata(self, classes, params: dict | None, aggregators: Sequence[str],
                             n_members: int) -> dict[bytes, bytes]:
        """The key-value metadata of the task's predictions tables: `classes` (the run's
        class list) and `task` (its spec, what a reader of the file alone resolves)."""
        import json

        return {b"classes": json.dumps(np.asarray(classes).tolist()).encode(),
                b"task": self.spec.encode()}

    @abstractmethod
    def metrics_of(self, splits: dict, aggregators: Sequence[str], params: dict | None,
                   best_member: int | None, classes, prior, meta: dict | None):
        """`metrics.parquet` (a pyarrow table, one row per model and labelled split) from
        the arrays a run predicted: `splits` split -> `SplitPredictions` with its
        `ensembles`; `prior`: the task's `prior` (or None); `meta`: the predictions file's
        key-value metadata."""

    def metrics_table(self, arrays, best_member: int | None = None):
        """`metrics_of` of a predictions file's arrays (`ensemble.tasks.model_arrays.read`:
        each model's rows of `output_columns`), its prior and aggregators from the file."""
        from ensemble.tasks.predicted import SplitPredictions
        from ensemble.tasks.table_parts import prior_of

        splits, aggregators = {}, []
        for split in arrays.splits:
            models = [a.by_row() for a in arrays.of_split(split)]
            if not models:
                continue
            members = {a.member: a.values for a in models if a.member is not None}
            ensembles = {a.aggregator: a.values for a in models if a.aggregator is not None}
            aggregators += [a for a in ensembles if a not in aggregators]
            splits[split] = SplitPredictions(members, ensembles, models[0].row, models[0].y)
        return self.metrics_of(splits, aggregators, None, best_member, arrays.classes,
                               prior_of(arrays.metadata), arrays.metadata)

    def prior(self, classes, y_train: np.ndarray | None):
        """The baseline of the metrics tables' `prior` row (JSON-able) from the training
        targets `y_train` `[n_train]`, or None when the task has none."""
        return None

    @property
    def selection(self) -> Aggregator | None:
        """The task's first aggregator that selects members (`Aggregator.selects`), or None."""
        return next((a for a in self.aggregators.values() if a.selects), None)

    def selected(self, fit: dict | None) -> dict | None:
        """The fitted parameters (`order`, `weights`) of the selecting aggregator in `fit`
        (an `aggregators.json`), or None when the task has none or `fit` lacks it."""
        sel = self.selection
        return None if sel is None else (fit or {}).get("params", {}).get(sel.name)

    def ood_scores(self, outputs: np.ndarray, aggregators: Sequence[str], params: dict | None,
                   members: Sequence[int]) -> list[dict]:
        """Per-row out-of-distribution scores (higher = more uncertain) of every member and
        aggregator of member `outputs` `[n_members, n_rows, k]`
        (`ensemble.tasks.ood.uncertainty_scores`' rows).

        Raises:
            UsageError: the task defines no OOD scores (the default).
        """
        self.require("ood_scores")

    def shift_scores(self, y: np.ndarray, outputs: np.ndarray, aggregator: str | None
                     ) -> dict[str, float | None]:
        """The `shift.parquet` metrics (`accuracy`, `nll`, `brier`, `ece`, `rmse`,
        `coverage_90`; those the task lacks left out) of one model's `outputs` `[n_rows, k]`
        (a member's, or aggregator `aggregator`'s ensemble rows) on targets `y` `[n_rows]`.

        Raises:
            UsageError: the task defines no shift metrics (the default).
        """
        self.require("shift_scores")

    def require(self, scores: str) -> None:
        """Refuse an evaluation the task defines no scores for, before anything is read.

        Args:
            scores: `"ood_scores"` (`ensemble evaluate --ood`) or `"shift_scores"`
                (`--shift`).

        Raises:
            UsageError: the task keeps this base class's `scores`, which defines none.
        """
        if getattr(type(self), scores) is getattr(Task, scores):
            what, flag = _EVALUATIONS[scores]
            raise UsageError(f"Expected a task with {what} for `ensemble evaluate {flag}`. "
                             f"Received: task {self.spec!r}, which defines none "
                             f"(Task.{scores}).")

    def graph_constants(self) -> list:
        """The JSON-able constants the task's traced head and loss capture beyond its `spec`
        (`ensemble.replication.graph_cache` reuses a traced graph only for equal ones):
        none by default."""
        return []

    def size_table(self, member_outputs: dict, y: dict, greedy_order: Sequence[int] | None):
        """`ensemble_size.parquet` (metrics of the ensemble of the first k members) of
        `member_outputs` split -> `[n_members, n_rows, k]` and targets `y` split ->
        `[n_rows]`, or None when the task has no size curve."""
        return None

    def prediction_notices(self, splits: dict, classes, aggregators: Sequence[str],
                           prior, meta: dict | None) -> None:
        """The notices the task prints on a run's predicted `splits` (`SplitPredictions`
        with their `ensembles`) as they are written: none by default."""

    def loss_delta(self, min_delta: float) -> float:
        """`training.min_delta` in the units of this task's validation loss (`val_loss`,
        which early stopping compares): as given for the NLL losses (nats per row, the same
        on any scale of the target)."""
        return min_delta

    def mistakes(self, outputs: np.ndarray, y: np.ndarray) -> int | None:
        """How many rows of `outputs` `[n_members, n_rows, k]` the plain mean gets wrong
        (classification), or None where the task counts none. With 0 an NLL cannot price a
        sharper fitted aggregator (`ensemble.tasks.crossfit`)."""
        return None

    def target_type(self):
        """The Arrow type of the `y_true` column of a member's prediction file."""
        import pyarrow as pa

        return pa.from_numpy_dtype(np.dtype(self.target_dtype))

    def applied_aggregators(self, names: Sequence[str]) -> list[str]:
        """The aggregators a run of this task applies: the config's `names`, or the task's
        `default_aggregators` when the config keeps the default list (`mean`, `vote`)."""
        from ensemble.tasks.aggregation_config import DEFAULT_AGGREGATORS

        if tuple(names) == tuple(DEFAULT_AGGREGATORS):
            return list(self.default_aggregators)
        return list(names)

    def check_aggregators(self, names: Sequence[str]) -> None:
        """Raises UsageError (one line) on an aggregator of `names` the task does not have."""
        bad = [a for a in names if a not in self.aggregators]
        if bad:
            raise UsageError(self.refusal(bad[0], names))

    def fitted_names(self, names: Sequence[str]) -> list[str]:
        """The fitted aggregators among `names`."""
        return [a for a in names if a in self.aggregators and self.aggregators[a].fitted]

    def epoch_aggregators(self, names: Sequence[str]) -> list[str]:
        """The aggregators of `names` applied after every epoch: those not fitted."""
        return [a for a in names if a in self.aggregators and not self.aggregators[a].fitted]

    def aggregate(self, outputs: np.ndarray, name: str, params: dict | None = None):
        """The numpy ensemble rows of aggregator `name` over `outputs` `[n_members, n_rows, k]`.

        Raises:
            UsageError: an aggregator of another task, or a fitted one without parameters.
        """
        self.check_aggregators([name])
        return self.aggregators[name](outputs, params)

    def aggregate_tf(self, outputs, name: str, params: dict | None = None):
        """The TensorFlow twin of `aggregate` (tensors in, a tensor out)."""
        if name not in self.aggregators:
            raise ValueError(self.refusal(name, [name]))
        return self.aggregators[name].apply_tf(outputs, params)

    def serving_outputs(self, stacked, name: str, params: dict | None, classes) -> dict:
        """An exported signature's outputs (TensorFlow) of aggregator `name` over the members'
        `stacked` outputs `[n_members, batch, k]`; `classes`: the module's class variable.
        The `serving_outputs` of the task's `tf_module`."""
        return _resolve(f"{self.tf_module}:serving_outputs")(stacked, name, params, classes)

    def aggregator_nll(self, outputs: np.ndarray, y: np.ndarray, name: str,
                       params: dict | None = None, chunk_rows: int = 65536) -> float | None:
        """`ensemble_nll` of aggregator `name` over `outputs` `[n_members, n_rows, k]` (an
        array or a memory map) and `y` `[n_rows]`, a mean summed `chunk_rows` rows at a
        time (the aggregators are row by row); None when a chunk's is."""
        total = 0.0
        for lo in range(0, len(y), chunk_rows):
            part = np.asarray(outputs[:, lo:lo + chunk_rows])
            nll = self.ensemble_nll(y[lo:lo + chunk_rows], self.aggregate(part, name, params),
                                    name)
            if nll is None:
                return None
            total += nll * part.shape[1]
        return total / len(y)

    def fit_aggregators(self, outputs: np.ndarray, y: np.ndarray, names: Sequence[str],
                        members: Sequence[int], settings: dict | None = None) -> dict[str, Any]:
        """Fit every fitted aggregator of `names` on validation `outputs` `[n_members, n_rows,
        k]` and targets `y` `[n_rows]`, members in the order of `members` (their indices in
        the run); `settings`: the config's `[aggregation]` table (defaults when None).

        Returns:
            The content of `aggregators.json`: `fitted_on`, the task's `fit_entries`, `n_rows`,
            `members`, `aggregators`, `best_member` (lowest `member_losses`), `params`
            `{name: params}` (fitted on every row), `validation_nll` `{name: NLL or None}`
            (in-sample for a fitted aggregator), `out_of_fold_nll` `{name: NLL or None}` and
            `out_of_fold` `{"folds", "rows", "mistakes"}` (`ensemble.tasks.crossfit`: each
            fitted one scored on rows it was not fitted on; what `ensemble.tasks.choice`
            ranks). With one name there is nothing to choose: its validation NLL, 0 folds.
        """
        from ensemble.tasks import crossfit
        from ensemble.tasks.aggregation_config import AggregationConfig

        self.check_aggregators(names)
        cfg = dict(AggregationConfig().__dict__, **(settings or {}))
        best = int(np.argmin(self.member_losses(y, outputs)))  # checks the shapes first
        params = {a: self.aggregators[a].fit_on(outputs, y, cfg) for a in self.fitted_names(names)}
        nll = {a: self.aggregator_nll(outputs, y, a, params.get(a)) for a in names}
        if len(names) > 1:
            oof, how = crossfit.out_of_fold_nll(self, outputs, y, names, cfg, params)
        else:  # nothing to choose between (an estimator's one aggregator): no cross-fitting
            oof, how = dict(nll), {"folds": 0, "rows": 0, "mistakes": None}
        return {"fitted_on": "validation", **self.fit_entries, "n_rows": int(len(y)),
                "members": list(members), "aggregators": list(names),
                "best_member": int(list(members)[best]), "params": params,
                "validation_nll": nll, "out_of_fold_nll": oof, "out_of_fold": how}


def all_aggregator_names(tasks: Sequence[Task]) -> tuple[str, ...]:
    """Every aggregator name of `tasks`, each once, in declaration order."""
    return tuple(dict.fromkeys(a for t in tasks for a in t.aggregators))
