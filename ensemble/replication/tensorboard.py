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


class EnsembleScalars(Callback):
    """Per epoch, the ensemble's validation metrics under `RUN/tensorboard/ensemble/`.

    The aggregators that need no fitting are applied to the members' validation outputs after
    every epoch (the task's `epoch_scalars`, numpy twins of the graph's); the fitted ones are
    fitted on validation after training only, so they have no per-epoch curve.

    Args:
        predict_val: returns the validation outputs `[n_members, n_val, k]` of the members not
            diverged (none: no scalars) (e.g.
            `InGraphEnsemble.predict(x_val)[0]`).
        y_val: `[n_val]` validation targets.
        aggregators: aggregator names of the run.
        task: the run's task (`ensemble.tasks.Task`).
    """

    def __init__(self, run_dir: str | Path, predict_val: Callable[[], np.ndarray],
                 y_val: np.ndarray, aggregators: Sequence[str], task):
        self.root, self.predict_val, self.y_val = log_dir(run_dir), predict_val, y_val
        self.aggregators, self.task, self.writer = list(aggregators), task, None

    def on_epoch_end(self, epoch: int, records: list[dict]) -> None:
        import tensorflow as tf

        if self.writer is None:
            self.writer = tf.summary.create_file_writer(str(self.root / "ensemble"))
        outputs = np.asarray(self.predict_val())
        if not len(outputs):  # every member diverged: no ensemble
            return
        _write(self.writer, self.task.epoch_scalars(self.y_val, outputs, self.aggregators),
               epoch)


def write_ensemble_metrics(run_dir: str | Path, metrics_rows: list[dict], step: int) -> None:
    """After aggregation (between-graph): the ensemble rows of the run's validation metrics
    (`metrics_tables.metrics_table` rows) as scalars at `step` (the last epoch)."""
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
