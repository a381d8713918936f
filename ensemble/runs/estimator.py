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

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ensemble.config import auto, bounds
from ensemble.config.checks import CATEGORICAL, IMPUTE
from ensemble.models import builders
from ensemble.config import schema
from ensemble.runs import fit_arrays
from ensemble.runs import estimator_rows, estimator_tables
from ensemble.tasks.classification.aggregators import AGGREGATORS, FITTED
from ensemble.tasks.classification.task import Classification
from ensemble.replication import devices as device_specs, modes
from ensemble.runs import operations  # noqa: F401 (the built-in modes' operations)
from ensemble.core.errors import UsageError

# estimator parameter -> config key (messages of config validation name the parameter)
PARAMS = {"n_members": "members.count", "hidden": "members.hidden",
          "activation": "members.activation", "dropout": "members.dropout",
          "epochs": "training.epochs", "batch_size": "training.batch_size",
          "learning_rate": "training.learning_rate", "random_state": "training.seed",
          "devices": "placement.devices", "aggregator": "aggregation.aggregators",
          "model": "model.builder", "model__": "model.params."}
ROUTED = "model__"  # `model__<name>=value`: keyword argument <name> of the builder (SciKeras)


def _plain_dict(params: dict) -> dict:
    return {k: _plain(v) for k, v in params.items()}


def _plain(value):
    """numpy scalars (from parameter grids) as Python values, tuples as lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list, np.ndarray)):
        return [_plain(v) for v in value]
    return value


class DeepEnsembleBase(BaseEstimator):
    """What `DeepEnsembleClassifier` and `DeepEnsembleRegressor` share: the parameters
    (documented on each), the builder, the seed and the run's `Config`.

    Builder parameters are routed as SciKeras does: `model__<name>=value` is keyword argument
    `<name>` of the estimator's builder. Unexpected keywords are refused by `fit`, not by
    `__init__` or `set_params` (scikit-learn: no validation there)."""

    run_task = None  # each estimator's: the `Task` class of the runs its `load` opens
    _aggregators: tuple = ()  # each estimator's: the `aggregator` names its task has

    def __init__(self, n_members=4, hidden=(256, 128), activation="relu", dropout=0.1,
                 epochs=30, batch_size="auto", learning_rate=1e-3, random_state=None,
                 mode="in-graph", devices="auto", aggregator="mean", run_dir=None,
                 model="mlp", categorical="auto", impute="error", **kwargs):
        self.model = model
        self.categorical = categorical
        self.impute = impute
        self._take_routed(kwargs)
        self.n_members = n_members
        self.hidden = hidden
        self.activation = activation
        self.dropout = dropout
        self.epochs = epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.random_state = random_state
        self.mode = mode
        self.devices = devices
        self.aggregator = aggregator
        self.run_dir = run_dir

    def _mode(self) -> modes.Mode:
        """The estimator's replication mode (`ensemble.replication.modes`); raises ValueError
        naming the parameter for an unknown mode or one without array training."""
        try:
            mode = modes.get(self.mode) if isinstance(self.mode, str) else None
        except UsageError:
            mode = None
        if mode is None or not mode.trains_arrays():
            known = [n for n in modes.names() if modes.get(n).trains_arrays()]
            raise ValueError(f"Expected `mode` to be one of {', '.join(known)}. "
                             f"Received: mode={self.mode!r}")
        return mode

    def _builder(self) -> str:
        if getattr(self, "_unexpected", None):
            raise ValueError(f"{type(self).__name__} got an unexpected keyword argument "
                             f"{self._unexpected[0]!r}; builder parameters are passed as "
                             "model__<name>.")
        try:
            spec = builders.spec_of(self.model)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
        if self._mode().member_processes and not builders.importable(spec):
            raise ValueError(f"mode={self.mode!r} trains in client processes, which import "
                             f"the builder by name; model={self.model!r} is not importable "
                             "(define it at module level in an importable module or file, or "
                             "pass 'package.module:function').")
        return spec

    def _attach_builder(self) -> None:
        """A fitted (or unpickled) estimator's process-local builder, found again under the
        name its config records (`builders.register`)."""
        spec = self.config_.model.builder
        if callable(self.model) and not builders.importable(spec):
            builders.register(spec, self.model)

    def _config(self, seed: int) -> schema.Config:
        """The run's `Config`; raises ValueError naming the estimator parameter."""
        self._mode()
        builder = self._builder()
        if not isinstance(self.aggregator, str):
            raise ValueError(f"Expected `aggregator` to be one aggregator name. "
                             f"Received: aggregator={self.aggregator!r}")
        if self.aggregator not in self._aggregators:
            raise ValueError(f"Expected `aggregator` from {', '.join(self._aggregators)}. "
                             f"Received: aggregator={self.aggregator!r}")
        try:
            device_specs.parse(bounds.check_devices(self.devices, "devices"), "devices")
        except UsageError as exc:
            raise ValueError(str(exc)) from None
        self._check_table_params()
        hidden = self.hidden if isinstance(self.hidden, (tuple, list, np.ndarray)) \
            else [self.hidden]
        table = {"members": {"count": _plain(self.n_members), "hidden": _plain(hidden),
                             "activation": self.activation, "dropout": _plain(self.dropout)},
                 "training": {"epochs": _plain(self.epochs), "batch_size": _plain(self.batch_size),
                              "learning_rate": _plain(self.learning_rate), "seed": seed},
                 "placement": {"devices": self.devices},
                 "aggregation": {"aggregators": [self.aggregator]},
                 "model": {"builder": builder, "params": _plain_dict(self._routed())}}
        try:
            return schema.from_dict(table)
        except UsageError as exc:
            text = str(exc)
            for param, key in PARAMS.items():  # `training.epochs`, members.hidden[0]=, ...
                ends = "" if key.endswith(".") else r"(?=[`=\[])"
                text = re.sub(re.escape(key) + ends, param, text)
            raise ValueError(text) from None

    def _check_table_params(self) -> None:
        """`impute` and `categorical` take the values of `[data] impute` / `categorical`
        (checked at every fit: an array without missing values never reaches the imputer)."""
        if not isinstance(self.impute, str) or self.impute not in IMPUTE:
            raise ValueError(f"Expected `impute` to be one of {', '.join(map(repr, IMPUTE))}. "
                             f"Received: impute={self.impute!r}")
        cat = self.categorical  # "auto", "none", or any list-like of names (a pandas Index)
        if isinstance(cat, str) and cat not in CATEGORICAL or isinstance(cat, (dict, bytes)) \
                or not isinstance(cat, (str, Iterable)):
            raise ValueError(f"Expected `categorical` to be {' or '.join(map(repr, CATEGORICAL))}"
                             f" or a list of column names. Received: categorical={cat!r}")

    def _fit_members(self, cfg, X, labels, y_train, val, table: bool) -> None:
        """Prepare `X` as `ensemble train` prepares its input (a DataFrame as a table,
        `ensemble.runs.estimator_tables`; arrays standardised), the validation rows `val`
        (`(X_val, y_val)` or None) the same way, train the members in `self.mode` on `y_train`
        `[n_rows]` and set the fitted attributes both estimators share.

        Args:
            labels: `(y_idx, classes)` for the preprocessing (`(None, [])` for regression).
        """
        if table:
            pre, x = estimator_tables.fit(self, X, *labels)
            if val is not None:
                self.preprocessing_ = pre
                val = (estimator_tables.transform(self, val[0]), val[1])
        else:
            names = list(getattr(self, "feature_names_in_",
                                 [f"x{i}" for i in range(X.shape[1])]))
            pre = fit_arrays.fit_preprocessing(X, *labels, names)
            x = pre.transform(fit_arrays.dataset(X, names))
            if val is not None:
                val = (pre.transform(fit_arrays.dataset(val[0], names)), val[1])
        cfg = auto.resolve(cfg, len(x), 0 if val is None else len(val[0]))[0]
        fitted = self._mode().train_arrays(cfg, x, y_train, val, pre, self.run_dir)
        self.table_input_ = table
        self.preprocessing_, self.config_ = pre, cfg
        self.seed_, self.aggregator_ = cfg.training.seed, self.aggregator
        self.n_rows_ = {"train": len(x), **({"validation": len(val[0])} if val else {})}
        self.devices_ = fitted["devices"]
        self.member_weights_ = fitted["weights"]
        self.aggregators_ = fitted["aggregators"]
        self.history_ = fitted["history"]

    def _seed(self) -> int:
        rs = self.random_state
        if isinstance(rs, (int, np.integer)) and not isinstance(rs, bool):
            return int(rs)  # negative: refused by the config check, naming random_state
        return int(check_random_state(rs).randint(np.iinfo(np.int32).max))

    def _take_routed(self, kwargs: dict) -> None:
        """Keep the `model__<name>` entries of `kwargs` as attributes (in `__init__`)."""
        self._unexpected = [k for k in kwargs if not k.startswith(ROUTED) or k == ROUTED]
        for key, value in kwargs.items():
            if key not in self._unexpected:
                setattr(self, key, value)

    def _routed(self) -> dict:
        """The builder parameters `{name: value}` given as `model__<name>`."""
        return {k[len(ROUTED):]: v for k, v in vars(self).items()
                if k.startswith(ROUTED) and not k.endswith("_")}

    def get_params(self, deep=True):
        """The estimator's parameters, the routed `model__<name>` ones included."""
        params = super().get_params(deep=deep)
        params.update({ROUTED + k: v for k, v in self._routed().items()})
        return params

    def set_params(self, **params):
        """Set parameters; any `model__<name>` is accepted (a builder parameter)."""
        for key in [k for k in params if k.startswith(ROUTED) and k != ROUTED]:
            setattr(self, key, params.pop(key))
        known = set(super().get_params(deep=True))
        unexpected = [k for k in params if k not in known and "__" not in k]
        self._unexpected = [*getattr(self, "_unexpected", []), *unexpected]  # never applied
        return super().set_params(**{k: v for k, v in params.items() if k not in unexpected})

    def __sklearn_clone__(self):
        """scikit-learn's `clone`, keeping the unexpected keywords `fit` refuses: a misspelt
        parameter is not dropped silently by cross-validation or a grid search."""
        new = super().__sklearn_clone__()
        new._unexpected = list(getattr(self, "_unexpected", []))
        return new


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
        epochs, batch_size, learning_rate: Adam training of every member; `batch_size="auto"`
            follows the training rows (`ensemble.config.auto`). With `validation_data`, each
            member stops early on its validation loss and keeps its best epoch (patience
            `max(5, epochs // 5)`).
        random_state: run seed: an int >= 0 (`--seed`), a `RandomState` or None (a fresh seed
            drawn per fit). Member `k`'s initialisation and batch order depend only on
            (seed, k).
        mode: `in-graph` (one graph, this process) or `between-graph` (a client process per
            device, through a run directory).
        devices: `auto`, `cpu:N` or device names such as `/GPU:0,/GPU:1` (`--devices`).
        aggregator: how `predict_proba` combines the members: `mean` (soft voting), `vote`,
            `geometric`, or a fitted one (`weighted`, `greedy`, `stacking`, `temperature`),
            which needs `fit(..., validation_data=...)`.
        run_dir: keep the run directory of each fit here (replaced by the next fit); None:
            in-graph fits write none, between-graph fits use a temporary one.
        categorical, impute: a pandas DataFrame `X` is prepared as `ensemble train` prepares
            a table (`ensemble.runs.estimator_tables`): `categorical` is `[data] categorical`
            (`"auto"`: text, boolean and category columns one-hot encoded; identifier-like
            text columns left out), `impute` is `[data] impute` (`"error"` refuses missing
            values; `"median"`, `"most_frequent"` fill them from the training rows).

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
        check_classification_targets(y)
        classes, y_idx = np.unique(y, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(f"DeepEnsembleClassifier needs at least 2 classes in y; "
                             f"received 1 class: {classes[0]!r}")
        cfg = self._config(self._seed())
        val = None
        if validation_data is not None:
            val = self._validation(validation_data, classes, table, X.shape[1:])
        elif self.aggregator in FITTED:
            raise ValueError(f"aggregator={self.aggregator!r} is fitted on validation data: "
                             "pass fit(X, y, validation_data=(X_val, y_val))")
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
        x = estimator_tables.scaled(self, X)
        self._attach_builder()
        p = fit_arrays.predict(self, x).astype(np.float64)
        return p / p.sum(axis=1, keepdims=True)

    def predict_members(self, X) -> np.ndarray:
        """Every member's probabilities `[n_members, n_rows, n_classes]` (float32)."""
        x = estimator_tables.scaled(self, X)
        self._attach_builder()
        return fit_arrays.predict(self, x, members=True)

    def predict(self, X) -> np.ndarray:
        """Labels `[n_rows]` from `classes_`: the most probable class (ties to the first)."""
        proba = self.predict_proba(X)  # first: it checks that the estimator is fitted
        return self.classes_[np.argmax(proba, axis=1)]

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
        return fit_arrays.load(cls, Path(path).expanduser())


__all__ = ["DeepEnsembleBase", "DeepEnsembleClassifier"]


DeepEnsembleClassifier.__module__ = "ensemble.sklearn"  # pickles name the public path, not this module
