"""`DeepEnsembleClassifier`: a deep ensemble as a scikit-learn classifier.

    from ensemble.sklearn import DeepEnsembleClassifier
    clf = DeepEnsembleClassifier(n_members=4, epochs=20, random_state=0).fit(X, y)
    clf.predict_proba(X_new)            # [n_rows, n_classes]: the aggregator's probabilities
    clf.save("runs/clf"); DeepEnsembleClassifier.load("runs/clf")   # a run directory

Its parameters mirror the config (`n_members` is `members.count`, `random_state` is
`training.seed`, ...) and it trains through the CLI's blocks: the same standardisation
(`preprocessing.Preprocessing`), seeds, placement, per-member step and aggregators (the
TensorFlow twins in the prediction graph, fitted ones fitted on `validation_data` only).
`mode="in-graph"` (default) trains in this process, re-using the traced graphs of earlier fits
of the same architecture (`ensemble.replication.graph_cache`); `mode="between-graph"` writes a run directory
and trains every member in a client process (`ensemble.runs.between`, imported only then: process
launching is composition, which lives in `pipelines/`; this module is otherwise a block).

Fitted state is plain numpy (weights, scaler, classes, aggregator parameters), so pickling works
and stores exactly that; `save(path)` writes a run directory that `load`, `ensemble.load_run`
and `ensemble predict --run` read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ensemble.runs import fit_arrays
from ensemble.runs import estimator_rows, estimator_tables
from ensemble.tasks.classification import threshold
from ensemble.tasks.classification.aggregators import AGGREGATORS, FITTED
from ensemble.tasks.classification.task import Classification
from ensemble.runs.estimator_base import Carved, DeepEnsembleBase
from ensemble.config.checks import check_class_weight
from ensemble.core.errors import UsageError


def _check_label_types(y) -> None:
    """Raises ValueError when the labels `y` `[n_rows]` mix text and numbers (`1`, `2`,
    `"high"`: no order, so no class list), naming how many rows of each and an example."""
    y = np.asarray(y, dtype=object) if np.asarray(y).dtype == object else None
    if y is None:
        return
    text = np.fromiter((isinstance(v, (str, bytes)) for v in y), bool, len(y))
    known = np.fromiter((v is not None and v == v for v in y), bool, len(y))  # not NaN
    numbers = known & ~text
    if text.any() and numbers.any():
        raise ValueError(f"y mixes text and numbers: {int(numbers.sum())} rows hold numbers "
                         f"(such as {y[numbers][0]!r}), {int(text.sum())} hold text (such "
                         f"as {y[text][0]!r}); expected labels of one type (all text, "
                         "e.g. y.astype(str), or all numbers)")


class DeepEnsembleClassifier(ClassifierMixin, DeepEnsembleBase):
    """A deep ensemble (Lakshminarayanan et al. 2017) of any Keras model as a scikit-learn
    classifier; defaults are those of the config (`configs/digits.toml`).

    Args:
        model: the members' builder (`model.builder`): `"mlp"` (default), `"cnn"`, an import
            string (`"package.module:function"`, `"path/file.py:function"`) or the function
            itself, `build(input_shape, n_outputs, *, seed, **params) -> keras.Model` of
            logits. `mode="between-graph"` needs a module-level (importable) function.
        **model__<name>: keyword argument `<name>` of the builder (routed as SciKeras does),
            so `GridSearchCV(clf, {"model__width": [8, 16]})` searches it.
        n_members: ensemble members (`members.count`).
        hidden, activation, dropout: the built-in MLP's parameters (used with `model="mlp"`).
        hidden: hidden layer widths of every member (`members.hidden`).
        activation: `relu`, `tanh`, `gelu`, `elu`, `sigmoid` or `swish`.
        dropout: dropout rate in [0, 1) after every hidden layer.
        epochs, batch_size, learning_rate: Adam training of every member; `"auto"` epochs and
            batch size follow the training rows (`ensemble.config.auto`: with
            `validation_data` at least 2,000 steps within [30, 200] epochs, else 30). With
            `validation_data`, each member stops early on its validation loss and keeps its
            best epoch (patience `min(20, max(5, epochs // 5))`, improvements above 0.001).
        random_state: run seed: an int >= 0 (`--seed`), a `RandomState` or None (a fresh seed
            drawn per fit). Member `k`'s initialisation and batch order depend only on
            (seed, k).
        mode: `in-graph` (one graph, this process) or `between-graph` (a client process per
            device, through a run directory).
        devices: `auto`, `cpu:N` or device names such as `/GPU:0,/GPU:1` (`--devices`).
        aggregator: how `predict_proba` combines the members: `mean` (soft voting), `vote`,
            `geometric`, or a fitted one (`weighted`, `greedy`, `stacking`, `temperature`),
            fitted on the validation rows (`validation_fraction` or `validation_data`).
        run_dir: keep the run directory of each fit here (replaced by the next fit); None:
            in-graph fits write none, between-graph fits use a temporary one.
        categorical, impute: a pandas DataFrame `X` is prepared as `ensemble train` prepares
            a table (`ensemble.runs.estimator_tables`): `categorical` is `[data] categorical`
            (`"auto"`: text, boolean and category columns one-hot encoded; identifier-like
            text columns left out), `impute` is `[data] impute` (`"error"` refuses missing
            values; `"median"`, `"most_frequent"` fill them from the training rows).
        validation_fraction: without `validation_data`, the share of `fit`'s rows held out
            (stratified for a classifier, seeded by `random_state`) as validation rows: the
            members stop early on them and fitted aggregators fit on them, as
            `MLPClassifier(early_stopping=True, validation_fraction=0.1)` does; 0 trains on
            every row without early stopping. `validation_data` given takes precedence.
        class_weight: None (every row weighs 1), `"balanced"` (`training.class_weight`:
            each training row weighs `n / (n_classes * n_c)` for its class `c`) or a dict of
            class label -> weight (a class it leaves out weighs 1): scikit-learn's and Keras's
            meanings, checked at `fit`.
        threshold: a binary classifier's decision threshold (`training.threshold`,
            `ensemble.tasks.classification.threshold`): None (`predict` is the most probable
            class), a number `t` in (0, 1), or `"auto:f1"`, `"auto:balanced_accuracy"`,
            `"auto:mcc"`, `"auto:accuracy"` (the `t` maximising that metric on the
            validation rows); `predict` is then the positive class (`classes_[1]`) where
            `predict_proba(X)[:, 1] >= t`, `t` in `aggregators_["params"][aggregator]`.
            Checked at `fit`; it needs validation rows (`validation_fraction > 0` or
            `validation_data`), on which the run records it, as `ensemble train` does.

    Attributes:
        classes_: `[n_classes]` labels. n_features_in_, feature_names_in_: the input columns
            (n-d rows `[*row_shape]`: `n_features_in_` is `row_shape[0]`, as scikit-learn's).
        member_weights_: `[n_members]` lists of each member's weight arrays.
        preprocessing_: the fitted `Preprocessing` (mean and scale of every column).
        aggregators_: `aggregators.json` content of a fitted aggregator, else None.
        history_: pandas DataFrame, one row per member and epoch (loss, val_loss, ...; val_*
            NaN without `validation_data`).
        config_: the resolved `Config`. seed_: the run seed used. devices_: member devices.
        aggregator_: the aggregator `predict_proba` applies. n_rows_: rows per split
            (`train`, and `validation` with `validation_data`).

    Like `ensemble train` (`training.deterministic`), fitting turns on TensorFlow's op
    determinism for the whole process, so equal seeds give equal members.
    """

    run_task = Classification  # the task of the runs `load` opens
    _aggregators = AGGREGATORS

    def __init__(self, n_members=4, hidden=(256, 128), activation="relu", dropout=0.1,
                 epochs="auto", batch_size="auto", learning_rate=1e-3, random_state=None,
                 mode="in-graph", devices="auto", aggregator="mean", run_dir=None,
                 model="mlp", categorical="auto", impute="error", validation_fraction=0.1,
                 class_weight=None, threshold=None, **kwargs):
        super().__init__(n_members=n_members, hidden=hidden, activation=activation,
                         dropout=dropout, epochs=epochs, batch_size=batch_size,
                         learning_rate=learning_rate, random_state=random_state, mode=mode,
                         devices=devices, aggregator=aggregator, run_dir=run_dir, model=model,
                         categorical=categorical, impute=impute,
                         validation_fraction=validation_fraction, **kwargs)
        self.class_weight = class_weight
        self.threshold = threshold

    def _config(self, seed: int):
        """The base's `Config` with `training.class_weight` and `training.threshold` from
        `class_weight` and `threshold`."""
        import dataclasses

        weight = self.class_weight
        if isinstance(weight, dict):  # labels of any type: the config keys them as text
            # ({}: every class weighs 1, as in scikit-learn)
            weight = {str(k): float(v) if isinstance(v, (int, float, np.number))
                      and not isinstance(v, bool) else v for k, v in weight.items()}
        elif weight not in (None, "balanced"):
            raise ValueError("Expected `class_weight` to be None, 'balanced' or a dict of "
                             f"class label -> weight. Received: class_weight={weight!r}")
        try:
            check_class_weight(weight or "none")
            decision = threshold.parse(self.threshold, "threshold")
        except UsageError as exc:
            raise ValueError(str(exc).replace(" (--threshold)", "").replace(
                "`training.class_weight`", "`class_weight`")) from None
        cfg = super()._config(seed)
        return dataclasses.replace(cfg, training=dataclasses.replace(
            cfg.training, class_weight=weight or "none",
            threshold="none" if decision is None else self.threshold))

    def fit(self, X, y, validation_data=None):
        """Train the members on every row of `X` `[n_rows, n_features]` (or, for a builder
        of n-d rows such as `cnn`, `[n_rows, *row_shape]`), labels `y` `[n_rows]`.

        Args:
            validation_data: optional `(X_val, y_val)`: per-epoch `val_loss` and
                `val_accuracy` in `history_`, and the rows a fitted aggregator is fitted on.

        Returns:
            self.

        Raises:
            ValueError: bad parameters, data or labels (fewer than 2 classes; validation
                labels unseen in `y`; a fitted aggregator without `validation_data`).
        """
        table = estimator_tables.wants_table(self, X)
        if table:
            X, y = estimator_tables.check_input(self, X, y)
        else:
            X, y = validate_data(self, X, y, dtype=[np.float64, np.float32], allow_nd=True)
        _check_label_types(y)
        check_classification_targets(y)
        classes = np.unique(y)
        if len(classes) < 2:
            raise ValueError(f"DeepEnsembleClassifier needs at least 2 classes in y; "
                             f"received 1 class: {classes[0]!r}")
        X, y, validation_data = self._carve(X, y, validation_data, stratify=True)
        classes, y_idx = np.unique(y, return_inverse=True)
        cfg = self._config(self._seed())
        if isinstance(cfg.training.class_weight, dict):
            unknown = sorted(set(cfg.training.class_weight) - {str(c) for c in classes})
            if unknown:
                raise ValueError(f"Expected `class_weight` to name classes of y "
                                 f"({', '.join(map(str, classes[:10]))}"
                                 f"{', ...' * (len(classes) > 10)}). Received: "
                                 f"{', '.join(unknown)}")
        if cfg.training.threshold != "none":
            if len(classes) != 2:
                raise ValueError(f"Expected 2 classes for a decision threshold "
                                 f"(threshold={self.threshold!r}). Received: {len(classes)} "
                                 f"classes in y: {classes.tolist()[:10]}")
            if validation_data is None:
                raise ValueError(f"threshold={self.threshold!r} is recorded on validation "
                                 "rows: keep validation_fraction > 0 (enough rows for 2 per "
                                 "class in each part) or pass validation_data")
        val = None
        if validation_data is not None:
            val = self._validation(validation_data, classes, table, X.shape[1:])
        elif self.aggregator in FITTED:
            raise ValueError(f"aggregator={self.aggregator!r} is fitted on validation data: "
                             "pass fit(X, y, validation_data=(X_val, y_val)), or keep "
                             "validation_fraction > 0")
        self._fit_members(cfg, X, (y_idx, classes), y_idx, val, table)
        self.classes_ = classes
        if self.run_dir is not None and self._mode().trains_in_memory:
            self.save(self.run_dir, overwrite=True)
        return self

    def _validation(self, validation_data, classes, table: bool = False, rows=()):
        """`(X_val, y_val class indices)`; `rows`: the shape of X's rows, X_val's too."""
        try:
            x_val, y_val = validation_data
        except (TypeError, ValueError):
            raise ValueError("Expected `validation_data` to be a pair (X_val, y_val). "
                             f"Received: {type(validation_data).__name__}") from None
        if table:  # prepared as the training table (`ensemble.runs.estimator_tables`)
            x_val, _ = estimator_tables.check_input(self, x_val, reset=False)
        elif isinstance(validation_data, Carved):  # rows of X, checked with it
            pass
        else:
            estimator_rows.refuse_other_rows("X_val", estimator_rows.shape_of(x_val),
                                             tuple(rows), "X has")
            x_val = validate_data(self, x_val, reset=False, dtype=[np.float64, np.float32],
                                  allow_nd=True)
        y_val = np.asarray(y_val)
        if y_val.ndim != 1 or len(y_val) != len(x_val):
            raise ValueError(f"Expected y_val of shape ({len(x_val)},). Received: "
                             f"shape {y_val.shape}")
        unknown = sorted(set(y_val.tolist()) - set(classes.tolist()), key=str)
        if unknown:
            raise ValueError(f"validation_data labels {unknown[:5]} are not in y's classes "
                             f"{classes.tolist()[:10]}")
        return x_val, np.searchsorted(classes, y_val).astype(np.int32)

    def predict_proba(self, X) -> np.ndarray:
        """The aggregator's class probabilities `[n_rows, n_classes]` (float64, rows sum to
        1; for `vote` the share of member votes), columns in the order of `classes_`, of `X`
        `[n_rows, *row_shape]` (rows of the fitted shape; `ensemble.runs.estimator_rows`)."""
        p = self._aggregated(X).astype(np.float64)
        return p / p.sum(axis=1, keepdims=True)

    def _aggregated(self, X) -> np.ndarray:
        """The aggregator's rows `[n_rows, n_classes]` (float32) as the prediction graph
        returns them: the probabilities a decision threshold was picked on."""
        x = estimator_tables.scaled(self, X)
        self._attach_builder()
        return fit_arrays.predict(self, x)

    def predict_members(self, X) -> np.ndarray:
        """Every member's probabilities `[n_members, n_rows, n_classes]` (float32)."""
        x = estimator_tables.scaled(self, X)
        self._attach_builder()
        return fit_arrays.predict(self, x, members=True)

    def predict(self, X) -> np.ndarray:
        """Labels `[n_rows]` from `classes_`: the most probable class (ties to the first), or
        for a binary run trained with a decision threshold (`training.threshold`, loaded
        with `load`) the positive class where its probability (float32, as the graph returns
        it and the threshold was picked on) reaches it."""
        proba = self._aggregated(X)  # first: it checks that the estimator is fitted
        params = ((self.aggregators_ or {}).get("params") or {}).get(self.aggregator_)
        return self.classes_[threshold.labels(proba, threshold.of(params))]

    def ood_detection(self, X_in, X_out):
        """AUROC and AUPR of telling `X_in` (in distribution) from `X_out` (OOD, the positive
        class) for every member and the aggregator, by each uncertainty score of
        `ensemble.tasks.ood` (max probability, entropy, mutual information): `run.evaluate_ood`'s
        table as a pandas DataFrame."""
        from ensemble.runs.api import to_pandas
        from ensemble.tasks.ood import estimator_table

        return to_pandas(estimator_table(self, X_in, X_out, regression=False))

    def save(self, path, overwrite: bool = False) -> Path:
        """Write the fitted ensemble as a run directory (manifest, `members/member-<i>.keras`,
        `preprocessing.json`, `aggregators.json` when fitted, `history.parquet`).

        Raises:
            ValueError (UsageError): `path` holds a run and not `overwrite`, or is a file.
        """
        check_is_fitted(self)
        return fit_arrays.save(self, Path(path).expanduser(), overwrite)

    @classmethod
    def load(cls, path) -> "DeepEnsembleClassifier":
        """A fitted estimator from a run directory written by `save` or by `ensemble train`
        (its parameters are the run's config; a run with categorical, identifier or imputed
        columns predicts DataFrames with those columns, prepared as the run's table; an array
        run (`.npz`, image folder, n-d `fit`) `X` `[n_rows, *dataset.input_shape]`, raw values).

        Raises:
            ValueError (UsageError): not a completed run, a damaged artifact, or a regression
                run (`DeepEnsembleRegressor.load` loads those).
        """
        est = fit_arrays.load(cls, Path(path).expanduser())
        setting = est.config_.training.threshold
        est.threshold = None if setting == "none" else setting
        return est


__all__ = ["DeepEnsembleBase", "DeepEnsembleClassifier"]


DeepEnsembleClassifier.__module__ = "ensemble.sklearn"  # pickles name the public path, not this module
