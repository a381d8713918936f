"""TensorBoard logs of a run: `tf.summary` scalars per member and for the ensemble.

Layout (one TensorBoard "run" per folder, so the members overlay in its charts):

- `RUN/tensorboard/member-<i>/`: `loss` (training, mean over the epoch), `val_loss` (NLL)
  and `val_accuracy` of member `i`, step = epoch (0-based, as in `history.parquet`).
- `RUN/tensorboard/ensemble/`: `<aggregator>/val_accuracy`, and for probability aggregators
  `<aggregator>/val_nll`, `val_brier`, `val_ece`: per epoch when the members train together
  in-graph (`EnsembleScalars`: the aggregators that need no fitting), once at the last epoch
  after aggregation otherwise (`write_ensemble_metrics`: every aggregator of the run), plus
  `val_disagreement`.

Written with TensorFlow's own `tf.summary` file writers (readable by TensorBoard and by
`tf.compat.v1.train.summary_iterator`); hooked into training as `training.Callback`s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ensemble.tasks.classification import metrics as M
from ensemble.tasks.classification.aggregators import disagreement
from ensemble.replication.training import Callback

SUBDIR = "tensorboard"


def log_dir(run_dir: str | Path) -> Path:
    """`RUN/tensorboard`."""
    return Path(run_dir) / SUBDIR


def _scalar_metadata() -> bytes:
    """`SummaryMetadata` of TensorBoard's scalars plugin (what `tf.summary.scalar` attaches)."""
    from tensorflow.core.framework import summary_pb2

    meta = summary_pb2.SummaryMetadata()
    meta.plugin_data.plugin_name = "scalars"
    return meta.SerializeToString()


def _write(writer, scalars: dict[str, float], step: int) -> None:
    """Write scalars with TensorFlow's core `tf.summary.write` plus the scalars plugin's
    metadata: exactly what `tf.summary.scalar` writes, without needing the `tensorboard`
    package installed to *write* (it is needed only to view)."""
    import tensorflow as tf

    meta = _scalar_metadata()
    with tf.device("/device:CPU:0"), writer.as_default(step=step):
        for tag, value in scalars.items():
            if value is not None and np.isfinite(value):
                tf.summary.write(tag, tf.constant(float(value), tf.float32), metadata=meta)
    writer.flush()


class MemberScalars(Callback):
    """Per epoch, each member's `loss` and validation scores (`val_loss`, and `val_accuracy`
    or, for regression, `val_rmse`) under `RUN/tensorboard/member-<i>/`."""

    def __init__(self, run_dir: str | Path):
        self.root = log_dir(run_dir)
        self.writers: dict[int, object] = {}

    def writer(self, member: int):
        import tensorflow as tf

        if member not in self.writers:
            self.writers[member] = tf.summary.create_file_writer(
                str(self.root / f"member-{member}"))
        return self.writers[member]

    def on_epoch_end(self, epoch: int, records: list[dict]) -> None:
        for r in records:
            _write(self.writer(r["member"]), {k: v for k, v in r.items()
                                              if k not in ("member", "epoch", "seconds")}, epoch)


def ensemble_scalars(y: np.ndarray, member_probs: np.ndarray,
                     ensemble_probs: dict[str, np.ndarray]) -> dict[str, float]:
    """The ensemble's validation scalars.

    Args:
        y: `[n_rows]` class indices.
        member_probs: `[n_members, n_rows, n_classes]` probabilities.
        ensemble_probs: aggregator name -> `[n_rows, n_classes]` (vote shares for `vote`, whose
            NLL, Brier and ECE are not defined and therefore not written).
    """
    out = {"val_disagreement": disagreement(member_probs)}
    for name, p in ensemble_probs.items():
        out[f"{name}/val_accuracy"] = M.accuracy(y, p)
        if name != "vote":
            for m in ("nll", "brier", "ece"):
                out[f"{name}/val_{m}"] = getattr(M, m)(y, p)
    return out


class EnsembleScalars(Callback):
    """Per epoch, the ensemble's validation metrics under `RUN/tensorboard/ensemble/`.

    The aggregators that need no fitting (`mean`, `vote`, `geometric`) are applied to the
    members' validation probabilities after every epoch (`aggregate.aggregate`, the numpy
    twins of the graph's); the fitted ones are fitted on validation after training only, so
    they have no per-epoch curve.

    Args:
        predict_val: returns the members' validation probabilities
            `[n_members, n_val, n_classes]` (e.g. `InGraphEnsemble.predict(x_val)[0]`).
        y_val: `[n_val]` validation class indices.
        aggregators: aggregator names of the run.
        gaussian: the task's outputs are per-row Gaussians `[n_members, n_val, 2]` (mean,
            variance; `tasks.heads.Task.gaussian`): the `mean` mixture's RMSE and NLL instead.
    """

    def __init__(self, run_dir: str | Path, predict_val: Callable[[], np.ndarray],
                 y_val: np.ndarray, aggregators: Sequence[str], gaussian: bool = False):
        from ensemble.tasks.classification.aggregators import FITTED

        self.root, self.predict_val, self.y_val = log_dir(run_dir), predict_val, y_val
        self.aggregators = [a for a in aggregators if a not in FITTED
                            and a not in ("weighted", "greedy", "std-scaling")]
        self.gaussian, self.writer = gaussian, None

    def on_epoch_end(self, epoch: int, records: list[dict]) -> None:
        import tensorflow as tf

        from ensemble.tasks.classification.aggregators import aggregate

        if self.writer is None:
            self.writer = tf.summary.create_file_writer(str(self.root / "ensemble"))
        member_p = np.asarray(self.predict_val())
        if self.gaussian:  # the task's outputs are per-row Gaussians (`tasks.heads.Task`)
            _write(self.writer, regression_scalars(self.y_val, member_p), epoch)
            return
        ens_p = {a: aggregate(member_p, a) for a in self.aggregators}
        _write(self.writer, ensemble_scalars(self.y_val, member_p, ens_p), epoch)


def regression_scalars(y: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
    """The regression ensemble's validation scalars: the `mean` mixture's RMSE and Gaussian
    NLL (target units) and the members' spread, from `outputs` `[n_members, n_rows, 2]`
    (mean, variance) and targets `y` `[n_rows]`."""
    from ensemble.tasks.regression import aggregators as regression
    from ensemble.tasks.regression import metrics as R

    mix = regression.aggregate(outputs, "mean")
    std = regression.std_of(mix)[0]
    return {"mean/val_rmse": R.rmse(y, mix[:, 0]), "mean/val_nll": R.nll(y, mix[:, 0], std),
            "val_disagreement": regression.disagreement(outputs)}


def write_ensemble_metrics(run_dir: str | Path, metrics_rows: list[dict], step: int) -> None:
    """After aggregation (between-graph): the ensemble rows of the run's validation metrics
    (`tables.metrics_table` rows) as scalars at `step` (the last epoch)."""
    import tensorflow as tf

    scalars: dict[str, float] = {}
    for r in metrics_rows:
        if r["split"] != "validation" or r["aggregator"] is None:
            continue
        name = r["aggregator"]
        for m in ("accuracy", "nll", "brier", "ece", "rmse", "mae", "crps"):
            if r.get(m) is not None:  # vote: no NLL, Brier, ECE; regression: its own
                scalars[f"{name}/val_{m}"] = r[m]
        if r.get("disagreement") is not None:
            scalars["val_disagreement"] = r["disagreement"]
    writer = tf.summary.create_file_writer(str(log_dir(run_dir) / "ensemble"))
    _write(writer, scalars, step)
    writer.close()
