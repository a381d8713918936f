"""The classification task: probabilities over `n_classes` classes from the builder's logits.

`n_classes` logits, a softmax head (members output probabilities), mean sparse categorical
cross-entropy (natural log) as the loss, NLL and accuracy on validation; its aggregators are
`ensemble.tasks.classification.aggregators.REGISTRY`.
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.tasks.base import Task
from ensemble.tasks.classification import aggregators as A
from ensemble.tasks.classification import metrics
from ensemble.tasks.aggregation_config import DEFAULT_AGGREGATORS


class Classification(Task):
    """Probabilities over `n_classes` classes from the builder's logits."""

    name = spec = "classification"  # `spec`: how the manifest names the task
    gaussian = False  # outputs are probabilities, not per-row Gaussians
    target_dtype = np.int32  # class indices
    tf_module = "ensemble.tasks.classification.aggregators_tf"
    stratified = True  # its splits are stratified by class
    losses = ("cross_entropy",)
    score_names = ("val_loss", "val_accuracy")
    member_score_names = ("val_nll", "val_accuracy")
    aggregators = A.REGISTRY
    default_aggregators = tuple(DEFAULT_AGGREGATORS)
    output_dtype = np.float32  # probabilities
    uncertainty_column = "mutual_information"
    confidence = "top probability"
    shift_metrics = ("accuracy", "nll", "ece")

    class_weight: tuple[float, ...] | None = None  # per class index (`with_class_weight`)

    def with_class_weight(self, mode, y_train, classes):
        """The task whose loss weights class `c` by `n / (n_classes * n_c)` (`mode =
        "balanced"`: scikit-learn's `compute_class_weight("balanced")`, over the training
        class indices `y_train` `[n_train]`; a class without training rows: weight 1) or by
        `mode[label]` (a table of class label -> weight, the labels of `classes` as text;
        a class it leaves out: weight 1, as in scikit-learn), and `{"class_weight":
        [n_classes] weights}` for the manifest's `dataset`.

        Raises:
            UsageError: a table naming a label that is not one of `classes`.
        """
        if mode == "none":
            return self, {}
        n_classes = len(classes)
        if isinstance(mode, dict):
            names = [str(c) for c in classes]
            unknown = sorted(set(map(str, mode)) - set(names))
            if unknown:
                raise UsageError(f"Expected `training.class_weight` to name classes of the "
                                 f"run ({', '.join(names[:10])}{', ...' * (n_classes > 10)}). "
                                 f"Received: {', '.join(unknown)}")
            given = {str(k): float(v) for k, v in mode.items()}
            weight = np.asarray([given.get(c, 1.0) for c in names])
        else:
            counts = np.bincount(np.asarray(y_train, np.int64), minlength=n_classes)
            weight = np.where(counts > 0,
                              len(y_train) / (n_classes * np.maximum(counts, 1)), 1.0)
        task = copy.copy(self)  # (a user's subclass keeps its own state)
        task.class_weight = tuple(weight.tolist())
        return task, {"class_weight": weight.tolist()}

    def with_threshold(self, setting, n_classes: int, target: str | None = None
                       ) -> "Classification":
        """The task whose ensembles' `y_pred` is the positive class where its probability
        reaches the decision threshold `setting` (`training.threshold`: `"none"`, a number in
        (0, 1) or `"auto:<metric>"`, `ensemble.tasks.classification.threshold`), a copy.

        Raises:
            UsageError: a bad setting, or a threshold with other than 2 classes.
        """
        from ensemble.tasks.classification import threshold

        parsed = threshold.parse(setting)
        threshold.check_task(parsed, n_classes, self.name, target)
        if parsed is None:
            return self
        task = copy.copy(self)
        task.threshold = parsed
        return task

    def fit_aggregators(self, outputs, y, names, members, settings=None):
        """`Task.fit_aggregators`, then with a decision threshold each probability
        aggregator's `threshold` (and `threshold_metric`) in its `params`, picked on the same
        validation rows (`threshold.fit`) from its positive-class probabilities."""
        from ensemble.tasks.classification import threshold

        fit = super().fit_aggregators(outputs, y, names, members, settings)
        if self.threshold is None:
            return fit
        for name in names:
            if not self.aggregators[name].probabilities:
                continue  # vote shares: the majority label
            p = np.concatenate([self.aggregate(np.asarray(outputs[:, s]), name,
                                               fit["params"].get(name))[:, 1]
                                for s in _spans(len(y))]) if len(y) else np.zeros(0)
            fit["params"][name] = {**(fit["params"].get(name) or {}),
                                   **threshold.fit(self.threshold, y, p)}
        return fit

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
        float32 tensor), each row's weighted by its class's `class_weight` when set (Keras's
        `fit(class_weight=)`: the batch mean of `w[y] * cost`). Traced on CPU it is computed from the softmax head's logits by
        TensorFlow's fused kernel (`_fused_logits` says why); elsewhere by Keras.

        Raises:
            tensorflow.errors.InvalidArgumentError: at run time, on CPU, a class index
                outside `[0, n_classes)` (Keras's path gives a NaN loss instead).
        """
        import keras
        import tensorflow as tf

        logits = _fused_logits(outputs)
        if logits is None:
            cost = keras.losses.sparse_categorical_crossentropy(y, outputs)
        else:
            cost, _ = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
                features=logits, labels=tf.cast(y, tf.int32))  # no op for int32 targets
        if self.class_weight is not None:  # Keras's class_weight: mean of w[y] * cost
            weight = tf.gather(tf.constant(self.class_weight, cost.dtype), tf.cast(y, tf.int32))
            cost = cost * weight
        return tf.reduce_mean(cost)

    def validation_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """`{"val_loss": NLL, "val_accuracy": accuracy}` of one member's `[n_rows, n_classes]`
        probabilities against `y` `[n_rows]` class indices."""
        return {"val_loss": metrics.nll(y, outputs), "val_accuracy": metrics.accuracy(y, outputs)}

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
        from ensemble.tasks.classification import running

        scores = running.metrics(y, outputs, rank=False)  # chunked: `outputs` may be a map
        return {"val_nll": scores["nll"], "val_accuracy": scores["accuracy"]}

    def format_table(self, metrics_table, fit: dict | None = None, extra=()) -> str:
        """The `ensemble evaluate` table of a classification run's `metrics.parquet` table;
        `extra` lines go before its closing sentence."""
        from ensemble.tasks.classification import evaluation

        return evaluation.format_table(metrics_table, fit, extra)

    def write_plots(self, folder, preds, metrics_table, run_dir) -> list:
        """`evaluate --plots`: reliability diagram, ensemble-size curve, members (PNG paths)."""
        from ensemble.tasks.classification import plots

        return plots.write_plots(folder, preds, metrics_table, run_dir)

    def member_losses(self, y: np.ndarray, outputs: np.ndarray) -> list[float]:
        """Each member's validation NLL (`[n_members, n_rows, n_classes]` probabilities)."""
        from ensemble.tasks.classification import fitted

        return fitted.member_losses(outputs, y)

    def mistakes(self, outputs: np.ndarray, y: np.ndarray) -> int:
        """Rows whose most probable class under the mean of `[n_members, n_rows, n_classes]`
        probabilities is not `y` `[n_rows]`."""
        return int(np.sum(np.argmax(np.mean(outputs, axis=0), axis=1) != np.asarray(y)))

    def ensemble_nll(self, y: np.ndarray, rows: np.ndarray, name: str) -> float | None:
        """The NLL of an aggregator's `[n_rows, n_classes]` probabilities; None for vote
        shares."""
        return metrics.nll(y, rows) if self.aggregators[name].probabilities else None

    def epoch_scalars(self, y: np.ndarray, outputs: np.ndarray,
                      names: Sequence[str]) -> dict[str, float]:
        """`val_disagreement` and, per aggregator of `names` that needs no fitting,
        `<name>/val_accuracy` and (for probabilities) `val_nll`, `val_brier`, `val_ece` of
        `[n_members, n_rows, n_classes]` probabilities against class indices `y`."""
        out = {"val_disagreement": A.disagreement(outputs)}
        for name in self.epoch_aggregators(names):
            p = self.aggregate(outputs, name)
            out[f"{name}/val_accuracy"] = metrics.accuracy(y, p)
            if self.aggregators[name].probabilities:
                for m in ("nll", "brier", "ece"):
                    out[f"{name}/val_{m}"] = getattr(metrics, m)(y, p)
        return out

    def refusal(self, name: str, names: Sequence[str]) -> str:
        """`std-scaling` is regression's; other names are unknown."""
        return A.unknown(name)

    def output_columns(self, classes) -> list[str]:
        """`p_<class>` of each class label, in the class list's order."""
        return [f"p_{c}" for c in np.asarray(classes).tolist()]

    def prediction_chunks(self, split, pred, classes, aggregators, params, chunk_rows):
        """`ensemble.tasks.tables.prediction_chunks`: labels, `p_<class>`, entropies."""
        from ensemble.tasks import tables

        return tables.prediction_chunks(split, pred, classes, aggregators, params, chunk_rows)

    def predictions_metadata(self, classes, params, aggregators, n_members):
        """`classes`, `task` and a binary run's decision thresholds (`threshold.metadata`)."""
        from ensemble.tasks.classification import threshold

        return {**super().predictions_metadata(classes, params, aggregators, n_members),
                **threshold.metadata(params)}

    def metrics_of(self, splits, aggregators, params, best_member, classes, prior, meta):
        """`ensemble.tasks.metrics_tables.metrics_of` of each split's members and ensembles."""
        from ensemble.tasks import metrics_tables as MT

        return MT.metrics_of({s: MT.split_outputs(p.members, p.y, aggregators, p.ensembles,
                                                  params) for s, p in splits.items()},
                             best_member, np.asarray(classes).tolist(), prior)

    def metrics_table(self, arrays, best_member=None):
        """`ensemble.tasks.metrics_tables.metrics_table` of a predictions file's arrays (or of
        a long predictions table, read as this task's)."""
        from ensemble.tasks import metrics_tables as MT
        from ensemble.tasks import model_arrays

        return MT.metrics_table(model_arrays.of(arrays, self), best_member)

    def prior(self, classes, y_train):
        """The training split's class shares `[n_classes]` (from class indices `y_train`)."""
        if y_train is None or len(y_train) == 0:
            return None
        counts = np.bincount(np.asarray(y_train, np.int64), minlength=len(classes))
        return (counts[:len(classes)] / counts.sum()).tolist()

    def ood_scores(self, outputs, aggregators, params, members):
        """`ensemble.tasks.ood.uncertainty_scores` of `[n_members, n_rows, n_classes]`
        probabilities: 1 - max probability, entropy, mutual information."""
        from ensemble.tasks import ood

        return ood.uncertainty_scores(outputs, aggregators, params, False, members)

    def shift_scores(self, y, outputs, aggregator):
        """`ensemble.tasks.classification.metrics.all_metrics` (accuracy, NLL, Brier, ECE);
        an aggregator of vote shares (not probabilities) has accuracy only."""
        m = metrics.all_metrics(y, outputs)
        if aggregator is not None and not self.aggregators[aggregator].probabilities:
            m.update(nll=None, brier=None, ece=None)
        return m

    def graph_constants(self):
        """The loss's class weights (`with_class_weight`), when set."""
        return [] if self.class_weight is None else [list(self.class_weight)]

    def size_table(self, member_outputs, y, greedy_order):
        """`ensemble.tasks.metrics_tables.ensemble_size_table` (mean of the first k)."""
        from ensemble.tasks import metrics_tables as MT

        return MT.ensemble_size_table(member_outputs, y, greedy_order)

    def prediction_notices(self, splits, classes, aggregators, prior, meta) -> None:
        """`eval_writer.imbalance_notice` of the training split's class shares `prior`."""
        from ensemble.tasks import eval_writer

        if prior is not None:
            eval_writer.imbalance_notice(classes, prior)


def _spans(n: int, chunk_rows: int = 65536) -> list[slice]:
    """The slices of `n` rows, `chunk_rows` at a time."""
    return [slice(lo, min(n, lo + chunk_rows)) for lo in range(0, n, chunk_rows)]


def _fused_logits(outputs):
    """The logits of the softmax head when `outputs` `[batch, n_classes]` is its traced output
    and runs on CPU, else None.

    Keras's sparse cross-entropy finds the same logits and calls TensorFlow's fused kernel
    (`SparseSoftmaxCrossEntropyWithLogits`), but with op determinism on (the default,
    `training.deterministic`) TensorFlow's Python API swaps that kernel for a log-softmax, a
    batched gather and a NaN mask on every device, because the GPU kernel is not
    deterministic. The CPU kernel is (each row's sum runs in one thread), so on CPU the fused
    kernel gives the same numbers as Keras without op determinism, in fewer ops per step. A
    process that sees a GPU keeps Keras's path unless the head is pinned to a CPU device, so
    that both modes of one machine take the same path (member parity).
    """
    import tensorflow as tf

    if (tf.executing_eagerly() or not hasattr(outputs, "op") or outputs.op.type != "Softmax"
            or outputs.shape.rank != 2):
        return None
    on_cpu = tf.DeviceSpec.from_string(outputs.op.device or "").device_type == "CPU"
    if not on_cpu and tf.config.list_logical_devices("GPU"):
        return None
    return outputs.op.inputs[0]
