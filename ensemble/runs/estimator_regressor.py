"""`DeepEnsembleRegressor`: a regression deep ensemble as a scikit-learn regressor.

    from ensemble.sklearn import DeepEnsembleRegressor
    reg = DeepEnsembleRegressor(n_members=5, epochs=40, random_state=0).fit(X, y)
    mean, std = reg.predict(X_new, return_std=True)   # as GaussianProcessRegressor
    reg.save("runs/reg"); DeepEnsembleRegressor.load("runs/reg")

Gaussian members (Lakshminarayanan et al. 2017): each predicts a mean and a variance and
trains on the Gaussian NLL of the target standardised on the training rows (`loss="mse"`:
point members); `predict` returns the mixture's mean, `return_std` its standard deviation,
both in the target's units; `target_transform="log1p"` (or `"log"`) fits the members'
Gaussians on `z = log(y + shift)` as `ensemble train --target-transform` does, and predicts
their log-normals on the target's scale (`ensemble.tasks.regression.transform`). The parameters, modes, builders (`model=`, `model__<name>`) and
the persistence are those of `DeepEnsembleClassifier` (both are `DeepEnsembleBase`); the
training itself runs through the same blocks (`ensemble.runs.fit_arrays`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from ensemble.tasks.regression.aggregators import AGGREGATORS, FITTED
from ensemble.tasks.regression import transform
from ensemble.tasks.regression.task import Regression
from ensemble.runs import fit_arrays
from ensemble.runs import estimator_tables
from ensemble.runs.estimator_base import Carved, DeepEnsembleBase


class DeepEnsembleRegressor(RegressorMixin, DeepEnsembleBase):
    """A deep ensemble of Gaussian members as a scikit-learn regressor.

    `model`, `model__<name>`, `n_members`, `hidden`, `activation`, `dropout`, `epochs`,
    `batch_size`, `learning_rate`, `random_state`, `mode`, `devices`, `run_dir` and
    `validation_fraction` (rows held out for early stopping unless `validation_data` is
    given; not stratified) are those of `DeepEnsembleClassifier`.

    Args:
        aggregator: `mean` (the moment-matched mixture), or fitted on the validation rows:
            `weighted`, `greedy`, `std-scaling`.
        loss: `gaussian_nll` (members predict a variance) or `mse` (point members: the
            ensemble's std is then the members' spread alone).
        categorical, impute: how a DataFrame with text or missing values is prepared, as
            `DeepEnsembleClassifier`'s (`ensemble.runs.estimator_tables`).
        target_transform: None, `"log1p"` or `"log"` (`training.target_transform`, as
            scikit-learn's `TransformedTargetRegressor(func=np.log1p)`): each member fits a
            Gaussian on `z = log(y + shift)` (shift 1 for `log1p`, 0 for `log`) standardised
            on the training rows, and its head returns that log-normal's mean and variance
            on the target's scale; `predict`'s mean and std are the mixture's on the
            target's scale, as `ensemble predict`'s `y_pred` and `std`. Checked at `fit`
            (every target `> -1` for `log1p`, `> 0` for `log`).

    Attributes:
        target_loc_, target_scale_: the training target's mean and std (of `z` under a
            target transform; members train on the standardised target; predictions are in
            the target's units).
        others: `n_features_in_`, `member_weights_`, `preprocessing_`, `aggregators_`,
            `history_` (`val_loss`, `val_rmse`), `config_`, `seed_`, `devices_`,
            `aggregator_`, `n_rows_`: as the classifier's.
    """

    run_task = Regression  # the task of the runs `load` opens
    _aggregators = AGGREGATORS

    def __init__(self, n_members=4, hidden=(256, 128), activation="relu", dropout=0.1,
                 epochs="auto", batch_size="auto", learning_rate=1e-3, random_state=None,
                 mode="in-graph", devices="auto", aggregator="mean", run_dir=None,
                 model="mlp", loss="gaussian_nll", categorical="auto", impute="error",
                 validation_fraction=0.1, target_transform=None, **kwargs):
        super().__init__(n_members=n_members, hidden=hidden, activation=activation,
                         dropout=dropout, epochs=epochs, batch_size=batch_size,
                         learning_rate=learning_rate, random_state=random_state, mode=mode,
                         devices=devices, aggregator=aggregator, run_dir=run_dir, model=model,
                         categorical=categorical, impute=impute,
                         validation_fraction=validation_fraction, **kwargs)
        self.loss = loss
        self.target_transform = target_transform

    def _config(self, seed: int):
        import dataclasses

        if self.loss not in ("gaussian_nll", "mse"):
            raise ValueError("Expected `loss` to be 'gaussian_nll' or 'mse'. "
                             f"Received: loss={self.loss!r}")
        if self.target_transform not in (None, "log1p", "log"):
            raise ValueError("Expected `target_transform` to be None, 'log1p' or 'log'. "
                             f"Received: target_transform={self.target_transform!r}")
        cfg = super()._config(seed)
        return dataclasses.replace(cfg, training=dataclasses.replace(
            cfg.training, loss=self.loss, target_transform=self.target_transform or "none"))

    def _transform(self):
        """The fitted or requested `TargetTransform` (`transform.get`), None without one."""
        return transform.get(self.target_transform)

    def fit(self, X, y, validation_data=None):
        """Train the members on every row of `X` `[n_rows, n_features]`, targets `y`
        `[n_rows]` (numbers).

        Args:
            validation_data: optional `(X_val, y_val)`: per-epoch `val_loss` / `val_rmse`
                in `history_`, and the rows a fitted aggregator is fitted on.

        Returns:
            self.

        Raises:
            ValueError: bad parameters or data, or a fitted aggregator without
                `validation_data`.
        """
        table = estimator_tables.wants_table(self, X)
        if table:
            X, y = estimator_tables.check_input(self, X, y)
        else:
            X, y = validate_data(self, X, y, dtype=[np.float64, np.float32], y_numeric=True)
        try:
            y = np.asarray(y, np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"Expected y to hold numbers. Received: {y[:3]!r} ...") from None
        # NaN and inf refused, `None` of an object y too (a NaN only once made float)
        y = check_array(y, ensure_2d=False, dtype=np.float64, input_name="y", estimator=self)
        X, y, validation_data = self._carve(X, y, validation_data, stratify=False)
        cfg = self._config(self._seed())
        t = self._transform()
        if t is None:  # members on the standardised y; else the task's head takes y itself
            loc, scale = float(y.mean()), float(y.std()) or 1.0
        else:
            loc, scale = 0.0, 1.0
            t.check(y, "y")
        val = None
        if validation_data is not None:
            try:
                x_val, y_val = validation_data
            except (TypeError, ValueError):
                raise ValueError("Expected `validation_data` to be a pair (X_val, y_val).") \
                    from None
            if table:
                x_val, _ = estimator_tables.check_input(self, x_val, reset=False)
            elif isinstance(validation_data, Carved):  # rows of X, checked with it
                pass
            else:
                x_val = validate_data(self, x_val, reset=False, dtype=[np.float64, np.float32])
            y_val = check_array(y_val, ensure_2d=False, dtype=np.float64, input_name="y_val",
                                estimator=self)  # NaN, inf refused (as y's)
            if y_val.shape != (len(x_val),):
                raise ValueError(f"Expected y_val of shape ({len(x_val)},). Received: "
                                 f"shape {y_val.shape}")
            if t is not None:
                t.check(y_val, "y_val")
            val = (x_val, (y_val - loc) / scale)
        elif self.aggregator in FITTED:
            raise ValueError(f"aggregator={self.aggregator!r} is fitted on validation data: "
                             "pass fit(X, y, validation_data=(X_val, y_val)), or keep "
                             "validation_fraction > 0")
        self._fit_members(cfg, X, (None, np.zeros(0)), (y - loc) / scale, val, table)
        if t is not None:  # z's standardisation, the head's (`fit_arrays.weighted_task`)
            loc, scale = (fit_arrays.weighted_task(cfg, y, self.preprocessing_)[1][k]
                          for k in ("target_loc", "target_scale"))
        self.target_loc_, self.target_scale_ = loc, scale
        for col in ("val_loss", "val_rmse") if t is None else ():  # back to target units
            if col in self.history_:
                self.history_[col] = self.history_[col] * (scale if col == "val_rmse" else 1.0) \
                    + (np.log(scale) if col == "val_loss" and self.loss != "mse" else 0.0)
        if self.run_dir is not None and self._mode().trains_in_memory:
            self.save(self.run_dir, overwrite=True)
        return self

    def predict(self, X, return_std: bool = False):
        """The mixture's mean `[n_rows]` (float64, target units); with `return_std`, also its
        standard deviation `[n_rows]` (`GaussianProcessRegressor.predict`'s convention).
        Under a target transform, the mean and std of the mixture of the members'
        log-normals (`ensemble predict`'s `y_pred` and `std`)."""
        x = estimator_tables.scaled(self, X)
        self._attach_builder()
        e = np.asarray(fit_arrays.predict(self, x), np.float64)
        if self.config_.training.target_transform != "none":  # the head's: target units
            loc, scale = 0.0, 1.0
        else:
            loc, scale = self.target_loc_, self.target_scale_
        mean = loc + scale * e[:, 0]
        if not return_std:
            return mean
        return mean, scale * np.sqrt(e[:, 1] + e[:, 2])

    def predict_members(self, X) -> np.ndarray:
        """Every member's `[n_members, n_rows, 2]` (mean, variance), target units."""
        x = estimator_tables.scaled(self, X)
        self._attach_builder()
        out = np.asarray(fit_arrays.predict(self, x, members=True), np.float64)
        if self.config_.training.target_transform != "none":  # the log-normals' moments
            return out
        s = self.target_scale_
        return np.stack([self.target_loc_ + s * out[..., 0], s * s * out[..., 1]], axis=2)

    def ood_detection(self, X_in, X_out):
        """AUROC and AUPR of telling `X_in` (in distribution) from `X_out` (OOD, the positive
        class) for every member and the aggregator, by each uncertainty score of
        `ensemble.tasks.ood` (predictive std, epistemic std): `run.evaluate_ood`'s table as a
        pandas DataFrame."""
        from ensemble.runs.api import to_pandas
        from ensemble.tasks.ood import estimator_table

        return to_pandas(estimator_table(self, X_in, X_out, regression=True))

    def save(self, path, overwrite: bool = False) -> Path:
        """Write the fitted ensemble as a run directory (see `DeepEnsembleClassifier.save`);
        its members predict in the target's units."""
        check_is_fitted(self)
        return fit_arrays.save(self, Path(path).expanduser(), overwrite)

    @classmethod
    def load(cls, path) -> "DeepEnsembleRegressor":
        """A fitted regressor from a regression run directory (`save` or `ensemble train`).

        Raises:
            ValueError (UsageError): not a completed run, a damaged artifact, or a
                classification run (`DeepEnsembleClassifier.load` loads those).
        """
        est = fit_arrays.load(cls, Path(path).expanduser())
        est.loss = est.config_.training.loss if est.config_.training.loss != "auto" \
            else "gaussian_nll"
        setting = est.config_.training.target_transform
        est.target_transform = None if setting == "none" else setting
        return est


__all__ = ["DeepEnsembleRegressor"]


DeepEnsembleRegressor.__module__ = "ensemble.sklearn"  # pickles name the public path, not this module
