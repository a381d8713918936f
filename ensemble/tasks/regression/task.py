"""The regression task: a Gaussian per row (mean, variance; target units) from the builder.

2 outputs (mean, raw variance; 1 for point members trained with `mse`), the Gaussian head of
`ensemble.tasks.regression.tf_ops` (members output (mean, variance) in the target's units),
Gaussian NLL as the loss on the standardised target, NLL and RMSE on validation; its
aggregators are the mixtures of `ensemble.tasks.regression.aggregators.REGISTRY`, `mean` and
`std-scaling` by default. Under a target transform (`training.target_transform`, `transform`:
`ensemble.tasks.regression.transform`) the members fit Gaussians on `z = log(y + shift)`
and report their log-normals' moments on the target's scale; NLLs are the log-normal's.
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np

from ensemble.tasks.base import Task
from ensemble.tasks.regression import aggregators as R


class Regression(Task):
    """A Gaussian per row (mean, variance; target units) from the builder's outputs.

    Args:
        loc, scale: the training target's mean and standard deviation (the standardisation
            the losses apply and the head undoes).
        loss: `"gaussian_nll"` (default) or `"mse"` (point members: variance 0).
    """

    name = spec = "regression"
    gaussian = True  # outputs are per-row Gaussians: (mean, variance), target units
    target_dtype = np.float64  # fed as such: float32 steps by 64 near 1e9
    tf_module = "ensemble.tasks.regression.tf_ops"
    stratified = False  # its splits are stratified by class
    losses = ("gaussian_nll", "mse")
    transforms_target = True  # `with_transform`: members fit Gaussians on log(y + shift)
    score_names = ("val_loss", "val_rmse")
    member_score_names = ("val_nll", "val_rmse")
    aggregators = R.REGISTRY
    default_aggregators = R.REGRESSION_DEFAULT
    fit_entries = {"task": "regression"}
    score_units = (" (standardised target)", " (target units)")
    uncertainty_column = "epistemic_std"
    confidence = "predictive std"
    shift_metrics = ("rmse", "nll")

    def __init__(self, loc: float = 0.0, scale: float = 1.0, loss: str = "gaussian_nll"):
        self.loc, self.scale = float(loc), float(scale) if scale > 0 else 1.0
        self.loss_name = "gaussian_nll" if loss in ("auto", None) else loss
        if self.loss_name not in self.losses:
            raise ValueError(f"Expected a regression loss, gaussian_nll or mse. "
                             f"Received: {loss!r}")

    def with_transform(self, name: str | None) -> "Regression":
        """The task whose members fit Gaussians on the transformed target (`"log1p"`,
        `"log"`; `"none"` or None: the target itself), a copy.

        Raises:
            UsageError: another name.
        """
        from ensemble.tasks.regression import transform

        task = copy.copy(self)
        task.transform = transform.get(name)
        return task

    def fit_aggregators(self, outputs, y, names, members, settings=None):
        """`Task.fit_aggregators`, the fits told the run's target transform (`settings`'
        `target_transform`): under one they minimise the log-normal NLL the run reports."""
        if self.transform is not None:
            settings = {**(settings or {}), "target_transform": self.transform.name}
        return super().fit_aggregators(outputs, y, names, members, settings)

    @property
    def shift(self) -> float | None:
        """The transform's shift (`log(y + shift)`), None without a transform."""
        return None if self.transform is None else self.transform.shift

    def nll_of(self, y: np.ndarray, mean: np.ndarray, var: np.ndarray) -> float | None:
        """Mean NLL (target units) of `y` under per-row predictive `mean`, `var` `[n_rows]`:
        Gaussian, or the log-normal with those moments under a transform (with the
        Jacobian); None when a variance is 0."""
        from ensemble.tasks.regression import metrics as RM

        if self.transform is None:
            return RM.nll(y, mean, np.sqrt(var))
        mu, s2 = self.transform.to_gaussian(mean, var)
        return self.transform.nll(y, mu, np.sqrt(s2))

    @property
    def point(self) -> bool:
        return self.loss_name == "mse"

    def loss_delta(self, min_delta: float) -> float:
        """`min_delta` for the validation loss: nats per row for `gaussian_nll`; for point
        members (`mse`, squared target units) `min_delta x scale^2`, the same drop on the
        standardised target whatever the target's units (0.001 of a 1e-2-sized target's
        variance, not 0.001 squared units, which no epoch of it beats)."""
        return min_delta * self.scale ** 2 if self.point else min_delta

    def n_outputs(self, n_classes: int = 0) -> int:
        """Outputs the builder must return: mean and raw variance (1 for point members)."""
        return 1 if self.point else 2

    def head(self, logits, name: str = "gaussian"):
        """`ensemble.tasks.regression.tf_ops.GaussianHead`: `[batch, n_outputs]` -> `[batch,
        2]` (mean, variance), target units."""
        from ensemble.tasks.regression.tf_ops import GaussianHead

        return GaussianHead(self.loc, self.scale, self.point, self.shift, name=name)(logits)

    def loss(self, y, outputs):
        """Mean Gaussian NLL (or MSE) of `y` `[batch]` float64 targets under `outputs`
        `[batch, 2]`, on the standardised target (`ensemble.tasks.regression.tf_ops`)."""
        from ensemble.tasks.regression import tf_ops as RT

        fn = RT.mse if self.point else RT.gaussian_nll
        return fn(y, outputs, self.loc, self.scale, self.shift)

    def validation_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """`{"val_loss": Gaussian NLL (target units; MSE for point members), "val_rmse"}` of
        one member's `[n_rows, 2]` outputs against `y` `[n_rows]`."""
        from ensemble.tasks.regression import metrics as RM

        y, out = np.asarray(y, np.float64), np.asarray(outputs, np.float64)
        rmse = RM.rmse(y, out[:, 0])
        if self.point and self.transform is not None:  # the training loss: MSE of z
            loss = RM.rmse(self.transform.forward(y), np.log(out[:, 0] + self.shift)) ** 2
        else:
            loss = rmse ** 2 if self.point else self.nll_of(y, out[:, 0], out[:, 1])
        return {"val_loss": float("inf") if loss is None else loss, "val_rmse": rmse}

    def fit_target(self, y_train: np.ndarray) -> tuple["Regression", dict[str, float]]:
        """The task on targets standardised by the training split's mean and std (`y_train`
        `[n_train]`, target units; of `z` under a transform), and the manifest's `dataset`
        entries `target_loc`, `target_scale`."""
        z = y_train if self.transform is None else self.transform.forward(y_train)
        loc = float(np.mean(z))
        scale = float(np.std(z)) or 1.0
        task = self.with_target(loc, scale)
        return task, task.target_entries()

    def with_target(self, loc: float, scale: float) -> "Regression":
        """The task for members trained on targets standardised by `loc`, `scale` (a copy:
        a subclass of the user's, named by a spec, stays itself)."""
        task = copy.copy(self)
        task.loc, task.scale = float(loc), float(scale) if scale > 0 else 1.0
        return task

    def target_entries(self) -> dict[str, float]:
        """The manifest's `dataset` entries: the target's standardisation."""
        return {"target_loc": self.loc, "target_scale": self.scale}

    def member_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float | None]:
        """`members.parquet`'s scores of a trained member on validation: Gaussian NLL (target
        units; None for a point member) and RMSE of its `[n_rows, 2]` (mean, variance)."""
        from ensemble.tasks.regression import metrics as RM

        y, out = np.asarray(y, np.float64), np.asarray(outputs, np.float64)
        return {"val_nll": None if self.point else self.nll_of(y, out[:, 0], out[:, 1]),
                "val_rmse": RM.rmse(y, out[:, 0])}

    def format_table(self, metrics_table, fit: dict | None = None, extra=()) -> str:
        """The `ensemble evaluate` table of a regression run's `metrics.parquet` table;
        `extra` lines go before its closing sentence."""
        from ensemble.tasks.regression import evaluation

        return evaluation.format_table(metrics_table, fit, extra)

    def write_plots(self, folder, preds, metrics_table, run_dir) -> list:
        """`evaluate --plots`: PIT histogram, interval coverage, error against predicted std
        (PNG paths)."""
        from ensemble.tasks.regression import plots

        return plots.write_plots(folder, preds, metrics_table, run_dir)

    def member_losses(self, y: np.ndarray, outputs: np.ndarray) -> list[float]:
        """Each member's validation Gaussian NLL (RMSE when no member has one)."""
        from ensemble.tasks.regression import fitted

        if self.transform is None:
            return fitted.member_losses(outputs, y)
        out = np.asarray(outputs, np.float64)
        nll = [self.nll_of(y, o[:, 0], o[:, 1]) for o in out]
        return [np.inf if v is None else v for v in nll]

    def ensemble_nll(self, y: np.ndarray, rows: np.ndarray, name: str) -> float | None:
        """The NLL (target units; `nll_of`) of a mixture's `[n_rows, 3]` rows."""
        return self.nll_of(y, rows[:, 0], rows[:, 1] + rows[:, 2])

    def target_type(self):
        """Targets are float64 in a member's prediction file."""
        import pyarrow as pa

        return pa.float64()

    def epoch_scalars(self, y: np.ndarray, outputs: np.ndarray,
                      names: Sequence[str]) -> dict[str, float]:
        """The `mean` mixture's RMSE and Gaussian NLL (target units) and the members' spread,
        from `outputs` `[n_members, n_rows, 2]` (mean, variance) and targets `y` `[n_rows]`."""
        from ensemble.tasks.regression import metrics as RM

        mix = R.aggregate(outputs, "mean")
        std = R.std_of(mix)[0]
        return {"mean/val_rmse": RM.rmse(y, mix[:, 0]),
                "mean/val_nll": self.nll_of(y, mix[:, 0], std ** 2),
                "val_disagreement": R.disagreement(outputs)}

    def refusal(self, name: str, names: Sequence[str]) -> str:
        """A classification aggregator in a regression run."""
        return R.unknown(name, names)

    def output_columns(self, classes=()) -> list[str]:
        """`y_pred` (the predictive mean) and `std` (target units)."""
        return ["y_pred", "std"]

    def outputs_of(self, table, classes=()) -> np.ndarray:
        """A member's `[n_rows, 2]` (mean, variance) from its rows' `y_pred` and `std`."""
        from ensemble.tasks.regression import tables

        return tables.outputs(table)

    def prediction_chunks(self, split, pred, classes, aggregators, params, chunk_rows):
        """`ensemble.tasks.regression.tables.prediction_chunks`: mean, std and its parts."""
        from ensemble.tasks.regression import tables

        return tables.prediction_chunks(split, pred, aggregators, params, chunk_rows)

    def predictions_metadata(self, classes, params, aggregators, n_members):
        """`ensemble.tasks.regression.tables.metadata` (the mixtures' weights and scales)
        with the task's spec and its target transform."""
        from ensemble.tasks.regression import tables

        return {**tables.metadata(params, aggregators, n_members),
                b"task": self.spec.encode(), **tables.transform_metadata(self)}

    def metrics_of(self, splits, aggregators, params, best_member, classes, prior, meta):
        """`ensemble.tasks.regression.tables.metrics_of` of each split's members and
        mixtures (the exact mixtures' weights and scales from `params`)."""
        import json

        from ensemble.tasks.regression import tables

        n_members = len(next(iter(splits.values())).members) if splits else 0
        mix = json.loads(tables.metadata(params, aggregators, n_members)[b"mixture"])
        outputs = {s: tables.split_outputs(p.members, p.y, aggregators, p.ensembles)
                   for s, p in splits.items()}
        return tables.metrics_of(outputs, mix, best_member, prior,
                                 transform=tables.transform_of(meta))

    def metrics_table(self, arrays, best_member=None):
        """`ensemble.tasks.regression.tables.metrics_table` of a predictions file's arrays (or
        of a long predictions table, read as this task's)."""
        from ensemble.tasks import model_arrays
        from ensemble.tasks.regression import tables

        return tables.metrics_table(model_arrays.of(arrays, self), best_member)

    def prior(self, classes, y_train):
        """The training targets' `{"mean", "std"}` (population std, target units); None for
        a constant target (a Gaussian of std 0 has no NLL)."""
        if y_train is None or len(y_train) == 0:
            return None
        y = np.asarray(y_train, np.float64)
        std = float(np.std(y))
        return {"mean": float(np.mean(y)), "std": std} if std > 0 else None

    def shift_scores(self, y, outputs, aggregator):
        """RMSE, NLL (`nll_of`: the log-normal's under a target transform) and 90% coverage
        of `[n_rows, 2 | 3]` outputs (mean, variance, and for an ensemble its epistemic
        variance; target units), the interval the Gaussian's or, under a transform, the
        log-normal's 5% and 95% quantiles (its coverage is the Gaussian's on the transformed
        targets, the transform being increasing, as in `TargetTransform.all_metrics`)."""
        from ensemble.tasks.regression import metrics as RM

        mean = outputs[:, 0]
        var = outputs[:, 1] + (outputs[:, 2] if outputs.shape[1] == 3 else 0)
        if self.transform is None:
            coverage = RM.coverage(y, mean, np.sqrt(var), 0.9)[0]
        else:
            mu, s2 = self.transform.to_gaussian(mean, var)
            coverage = RM.coverage(self.transform.forward(y), mu, np.sqrt(s2), 0.9)[0]
        return {"rmse": RM.rmse(y, mean), "nll": self.nll_of(y, mean, var),
                "coverage_90": coverage}

    def graph_constants(self):
        """The loss, and under a target transform its shift and the standardisation of
        `log(y + shift)` (constants of the traced loss)."""
        shift = self.shift
        return [self.loss_name, *([shift, self.loc, self.scale] if shift is not None else [])]

    def ood_scores(self, outputs, aggregators, params, members):
        """`ensemble.tasks.ood.uncertainty_scores` of `[n_members, n_rows, 2]` outputs: the
        predictive std and its epistemic part (target units)."""
        from ensemble.tasks import ood

        return ood.uncertainty_scores(outputs, aggregators, params, True, members)

    def size_table(self, member_outputs, y, greedy_order):
        """`ensemble.tasks.regression.tables.ensemble_size_table` (mixture of the first k)."""
        from ensemble.tasks.regression import tables

        return tables.ensemble_size_table(member_outputs, y, greedy_order)

    def prediction_notices(self, splits, classes, aggregators, prior, meta) -> None:
        """`eval_writer.negative_notice` when the run has no target transform."""
        from ensemble.tasks import eval_writer

        if self.transform is None and b"target_transform" not in (meta or {}):
            eval_writer.negative_notice(splits, aggregators)
