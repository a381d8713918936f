"""`DeepEnsembleBase`: what the scikit-learn estimators share (`DeepEnsembleClassifier`,
`DeepEnsembleRegressor`): the parameters and their checks, the builder, the seed, the run's
`Config` and the members' training through the CLI's blocks (`ensemble.runs.estimator`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state

from ensemble.config import auto, bounds
from ensemble.config.checks import CATEGORICAL, IMPUTE
from ensemble.models import builders
from ensemble.config import schema
from ensemble.runs import fit_arrays
from ensemble.runs import estimator_tables
from ensemble.replication import devices as device_specs, modes
from ensemble.runs import builtin_modes
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


class Carved(tuple):
    """`(X_val, y_val)` that `fit` carved from its own rows (`validation_fraction`), already
    validated as `X`: checked again as new input, an array carved from a DataFrame would
    warn that it lacks the feature names `X` had."""


class DeepEnsembleBase(BaseEstimator):
    """What `DeepEnsembleClassifier` and `DeepEnsembleRegressor` share: the parameters
    (documented on each), the builder, the seed and the run's `Config`.

    Builder parameters are routed as SciKeras does: `model__<name>=value` is keyword argument
    `<name>` of the estimator's builder. Unexpected keywords are refused by `fit`, not by
    `__init__` or `set_params` (scikit-learn: no validation there)."""

    run_task = None  # each estimator's: the `Task` class of the runs its `load` opens
    _aggregators: tuple = ()  # each estimator's: the `aggregator` names its task has

    def __init__(self, n_members=4, hidden=(256, 128), activation="relu", dropout=0.1,
                 epochs="auto", batch_size="auto", learning_rate=1e-3, random_state=None,
                 mode="in-graph", devices="auto", aggregator="mean", run_dir=None,
                 model="mlp", categorical="auto", impute="error", validation_fraction=0.1,
                 **kwargs):
        self.model = model
        self.validation_fraction = validation_fraction
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

    def _carve(self, X, y, validation_data, stratify: bool):
        """`(X, y, validation_data)` for `fit`: `validation_data` given wins; else a share
        `validation_fraction` of the rows (stratified by `y` when `stratify`; scikit-learn's
        `train_test_split`, seeded by `random_state`) is held out for early stopping and the
        fitted aggregators, as `MLPClassifier(early_stopping=True)` does. Too few rows for
        both parts (fewer than 2 per class, or per part) keep every row for training.

        Raises:
            ValueError: `validation_fraction` outside [0, 1).
        """
        f = self.validation_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f < 1:
            raise ValueError("Expected `validation_fraction` in [0, 1). "
                             f"Received: validation_fraction={f!r}")
        if validation_data is not None or not f:
            return X, y, validation_data
        from sklearn.model_selection import train_test_split

        labels = np.asarray(y)
        n = len(labels)
        n_val = int(np.ceil(n * f))
        need = 2
        if stratify:
            try:
                _, counts = np.unique(labels, return_counts=True)
            except TypeError:  # labels of mixed types: refused by the caller's checks
                return X, y, validation_data
            need = max(2, len(counts))
            if counts.min() < 2:
                return X, y, validation_data
        if n_val < need or n - n_val < need:
            return X, y, validation_data
        x_tr, x_val, y_tr, y_val = train_test_split(
            X, y, test_size=n_val, random_state=self._seed(),
            stratify=labels if stratify else None)
        return x_tr, y_tr, Carved((x_val, y_val))

    def _mode(self) -> modes.Mode:
        """The estimator's replication mode (a `modes.Mode` object, or a built-in mode's
        name); raises ValueError naming the parameter for an unknown mode or one without
        array training."""
        try:
            mode = builtin_modes.get(self.mode)
        except UsageError:
            mode = None
        if mode is None or not mode.trains_arrays():
            known = [n for n in builtin_modes.names() if builtin_modes.get(n).trains_arrays()]
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
                 "data": {"task": self.run_task.spec},  # the estimator's task
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
                                 estimator_tables.array_names(X.shape[1])))
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
