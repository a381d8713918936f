"""A group of members trained and run by one client: every member of an in-graph run, or the
member a between-graph client is working on.

Member `k` lives on `devices[k]`: its layers are both *built* and *called* under `tf.device` of
that device (building alone would place its variables, not its computation). Training runs the
traced many-steps call of `ensemble.replication.training`; prediction one traced call per row batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from ensemble.config.schema import Config, member_hparams
from ensemble.models.members import build_member, member_seed
from ensemble.models.optimizer import build_optimizer
from ensemble.replication.steps import StepsCall, make_steps_fn
from ensemble.replication.early_stopping import EarlyStopping
from ensemble.replication.training import Schedule, train_loop

CLIENT_DEVICE = "/device:CPU:0"
PREDICT_ROWS = 16384  # rows per prediction call, at most
PREDICT_BYTES = 8 << 20  # float32 input bytes per prediction call, at most


def predict_rows(row_shape) -> int:
    """Rows per prediction call for rows of `row_shape`: `PREDICT_ROWS`, fewer for wide rows so
    that a call's input stays within `PREDICT_BYTES` (a convolution's activations are a
    multiple of its input: 3,000 64x64x3 images in one call held 2.6 GB)."""
    row_bytes = 4 * int(np.prod(row_shape, dtype=np.int64))
    return int(max(1, min(PREDICT_ROWS, PREDICT_BYTES // max(1, row_bytes))))


class MemberGroup:
    """Members in one graph, member `k` on `devices[k]`.

    Args:
        models: the members' Keras models, built (or loaded) under their device.
        devices: `[n_members]` device names, e.g. from `RoundRobinPlacement.assign`.
        indices: the members' indices in the run (default `0..n_members-1`).
        client_device: where the ops that combine the members' outputs run.
        task: the run's task (`ensemble.tasks.for_run`): its loss, scores and aggregators.
    """

    def __init__(self, models: Sequence, devices: Sequence[str],
                 indices: Sequence[int] | None = None, client_device: str = CLIENT_DEVICE,
                 *, task):
        self.models, self.devices = list(models), list(devices)
        self.indices = list(indices) if indices is not None else list(range(len(models)))
        self.client_device = client_device
        self.task = task
        self.optimizers: list = []
        self._best: list | None = None  # early stopping's copies of the best weights
        # member position -> [(model copy, device)] of its replicas (`set_replicas`)
        self.replicas: dict[int, list] = {}
        # training's data parallelism: `[n_members]` lists of replica devices, replica 0
        # `devices[k]` (`steps.replicated_train_step`); None: one device per member
        self.train_replicas: list[list[str]] | None = None
        self.adversarial_epsilon = 0.0  # `training.adversarial_epsilon` (`build` sets it)
        # members whose loss or outputs turned non-finite in `fit` (`divergence.Divergence`)
        self.divergence = None
        # `[n_members, n_val, k]` validation outputs of the members' current weights: those
        # of `fit`'s last validated epoch, None once the weights change (`restore_best`)
        self.validation_outputs: np.ndarray | None = None
        self.input_shape = tuple(self.models[0].input_shape[1:])
        self.predict_fn = tf.function(  # plain Python control flow: no AutoGraph conversion
            self._predict_graph, autograph=False,
            input_signature=[tf.TensorSpec([None, *self.input_shape], tf.float32)])

    @classmethod
    def build(cls, cfg: Config, input_shape: int | Sequence[int], n_classes: int,
              devices: Sequence[str], indices: Sequence[int] | None = None, **kwargs):
        """Build fresh members (builder and params of `config.member_hparams`, the task's
        head) and their optimisers on `devices`.

        Args:
            input_shape: a row's shape (an int: `n_features`).
            n_classes: the run's classes (0 for regression): the head's size follows
                (`Task.n_outputs`).
            indices: the members' indices in the run (default `0..len(devices)-1`).
            kwargs: `n_train`: training rows (the length of a cosine learning-rate schedule;
                needed with `training.lr_schedule = "cosine"`); `pre`: the run's
                preprocessing, whose `scaling_layer()` (array inputs) starts every member;
                `task` (required): the run's task, whose head and `n_outputs` the members
                get; the others go to the constructor (`client_device`, a subclass's own).
        """
        indices = list(indices) if indices is not None else list(range(len(devices)))
        shape = (input_shape,) if isinstance(input_shape, int) else tuple(input_shape)
        if kwargs.get("task") is None:
            raise TypeError("MemberGroup.build() needs `task=`: the run's task "
                            "(ensemble.tasks.for_run, or the estimator's).")
        task = kwargs.pop("task")
        pre, n_train = kwargs.pop("pre", None), kwargs.pop("n_train", None)
        t = cfg.training
        total = None if n_train is None else Schedule.of(t).steps_per_epoch(n_train) * t.epochs
        models, optimizers = [], []
        for i, device in zip(indices, devices):
            h = member_hparams(cfg, i)  # [[members.override]] applied
            with tf.device(device):
                model = build_member(h["builder"], h["params"], shape,
                                     task.n_outputs(n_classes),
                                     member_seed(t.seed, i), f"member_{i}", task,
                                     pre.scaling_layer() if pre is not None else None,
                                     t.precision)
                optimizers.append(build_optimizer(model, h["learning_rate"], t.optimizer,
                                                  t.optimizer_params, t.lr_schedule, total,
                                                  t.precision))
            models.append(model)
        group = cls(models, devices, indices=indices, task=task, **kwargs)
        group.optimizers = optimizers
        group.adversarial_epsilon = float(getattr(t, "adversarial_epsilon", 0.0))
        if t.early_stopping:
            group.keep_best_weights()
        return group

    def keep_best_weights(self) -> None:
        """Create, on each member's device, the copies of its weights that early stopping
        saves and restores (checkpointed with the member)."""
        self._best = []
        for model, device in zip(self.models, self.devices):
            with tf.device(device):
                self._best.append([tf.Variable(v, trainable=False) for v in model.weights])

    def save_best(self, k: int) -> None:
        """Copy member position `k`'s weights aside (its best epoch so far)."""
        for b, v in zip(self._best[k], self.models[k].weights):
            b.assign(v)

    def restore_best(self, k: int) -> None:
        """Give member position `k` its best epoch's weights back."""
        self.validation_outputs = None  # predicted with other weights
        for b, v in zip(self._best[k], self.models[k].weights):
            v.assign(b)

    def set_replicas(self, replicas: dict[int, list]) -> None:
        """Data parallelism in prediction: member at position `k` runs as the replicas
        `replicas[k]` `[(model, device), ...]` (copies of its weights, one per device); each
        batch's rows are split evenly across them and the outputs concatenated in row order
        (`make_parallel`: split, run on each device, concatenate). Members not named run
        whole on their device. Call before the first prediction (the graph is traced then)."""
        self.replicas = {k: list(v) for k, v in replicas.items() if len(v) > 1}

    def _member_probs(self, x):
        probs = []
        for k, (model, device) in enumerate(zip(self.models, self.devices)):
            copies = self.replicas.get(k)
            if not copies:
                with tf.device(device):
                    probs.append(model(x, training=False))
                continue
            n, parts = tf.shape(x)[0], []
            for j, (copy, replica_device) in enumerate(copies):
                lo, hi = n * j // len(copies), n * (j + 1) // len(copies)
                with tf.name_scope(f"replica_{k}_{j}"), tf.device(replica_device):
                    parts.append(copy(x[lo:hi], training=False))
            with tf.device(self.client_device):
                probs.append(tf.concat(parts, axis=0))
        with tf.device(self.client_device):
            return tf.stack(probs)

    def _predict_graph(self, x):
        return self._member_probs(x), {}

    def predict(self, x: np.ndarray, batch_size: int | None = None, allocate=None):
        """Member (and, for subclasses, ensemble) probabilities of `x` `[n_rows, *input_shape]`,
        in batches of `batch_size` rows (None: `predict_rows`, bounded by bytes).

        Args:
            allocate: `(shape, dtype) -> array` the members' outputs are written into (a
                memory map of `eval_writer.OutputFiles.new`); None: a new array in memory.

        Returns:
            (`[n_members, n_rows, n_classes]` float32, `{aggregator: [n_rows, n_classes]}`).
        """
        members, ens = None, {}
        allocate = allocate or np.empty
        batch_size = batch_size or predict_rows(x.shape[1:])
        for lo in range(0, max(len(x), 1), batch_size):  # (no row: one empty call, its shapes)
            m, e = self.predict_fn(tf.constant(x[lo:lo + batch_size], tf.float32))
            m = m.numpy()
            if members is None:  # filled batch by batch: no list of batches joined at the end
                members = allocate((m.shape[0], len(x), *m.shape[2:]), m.dtype)
            members[:, lo:lo + m.shape[1]] = m
            for a, v in e.items():
                v = v.numpy()
                if a not in ens:
                    ens[a] = np.empty((len(x), *v.shape[1:]), v.dtype)
                ens[a][lo:lo + len(v)] = v
        return members, ens

    def make_train_steps(self, x_train: np.ndarray, y_train: np.ndarray | None = None,
                         masked: bool = False):
        """The traced many-steps training call of these members (`steps.make_steps_fn`):
        `run_steps(xb [n_members, steps, batch, *input_shape], yb [n_members, steps, batch],
        total [n_members] float32, active [n_members] bool) -> [n_members]` running loss
        sums. `x_train` `[n_train, *input_shape]` gives the rows' dtype (uint8 images stay
        uint8) and the adversarial step's range; `masked` makes it skip the steps of
        inactive members (one loop per member instead of one per device)."""
        adversarial = None
        if self.adversarial_epsilon > 0:
            from ensemble.replication.adversarial import input_step

            adversarial = [input_step(m, x_train, self.adversarial_epsilon)
                           for m in self.models]
        x_dtype = tf.uint8 if x_train.dtype == np.uint8 else tf.float32
        return make_steps_fn(self.models, self.optimizers, self.devices, self.task,
                             x_train.shape[1:], x_dtype, self.client_device, masked=masked,
                             replicas=self.train_replicas, adversarial=adversarial)

    def early_stopping(self, schedule: Schedule) -> EarlyStopping | None:
        """The `EarlyStopping` of this group under `schedule` (None when it is off)."""
        if not schedule.patience:
            return None
        if self._best is None:
            self.keep_best_weights()
        return EarlyStopping(schedule.patience, len(self.models), self.save_best,
                             self.restore_best, self.task.loss_delta(schedule.min_delta))

    def fit(self, x_train, y_train, validation, schedule: Schedule, checkpoint_dir=None,
            callbacks=(), allocate=None) -> list[dict]:
        """Train every member; returns the history records of `training.train_loop`.

        Args:
            x_train: `[n_train, *input_shape]`; y_train: `[n_train]` targets.
            validation: `(x_val, y_val)`, the validation split (as Keras's
                `validation_data`: scores per epoch; early stopping's losses).
            checkpoint_dir: resume from its newest checkpoint and save one every
                `schedule.checkpoint_every` epochs (and after the last).
            callbacks: `training.Callback`s.
            allocate: `(shape, dtype) -> array` for the epochs' validation outputs (a memory
                map of `eval_writer.OutputFiles.new`: one, overwritten every epoch, so the
                outputs take no memory that grows with the rows); None: in memory.

        The last epoch's validation outputs stay in `validation_outputs` while the weights
        are that epoch's (early stopping's restore drops them), so the evaluation that
        follows need not predict the validation split again (the same calls of `predict`:
        the same values).
        """
        from ensemble.replication.checkpoints import EpochCheckpoints
        from ensemble.replication.divergence import Divergence
        from ensemble.replication.feed import Gather

        stopping = self.early_stopping(schedule)
        # masked (a member stopped or diverged): traced the first time it is needed
        run_steps = StepsCall(lambda masked: self.make_train_steps(x_train, masked=masked))
        self.divergence = Divergence(self.indices)
        gather = Gather(x_train, y_train, self.task.target_dtype)
        max_steps = gather.plan_calls(len(self.models), schedule.batch_size,
                                     schedule.steps_per_epoch(len(x_train)))

        ckpt = (EpochCheckpoints(checkpoint_dir, self.models, self.optimizers, self._best)
                if checkpoint_dir is not None else None)
        x_val, y_val = validation

        kept: list[np.ndarray] = []

        def into_kept(shape, dtype):  # every epoch's outputs into the first epoch's buffer
            if not kept:
                kept.append(allocate(shape, dtype))
            return kept[0]

        def predict_val():
            self.validation_outputs = None  # one copy alive at a time
            self.validation_outputs = self.predict(
                x_val, allocate=into_kept if allocate is not None else None)[0]
            return self.validation_outputs

        self.validation_outputs = None
        return train_loop(run_steps, self.indices, schedule, len(x_train), self.task,
                          predict_val, y_val, checkpoints=ckpt,
                          callbacks=callbacks, stopping=stopping, divergence=self.divergence,
                          gather=gather, max_steps=max_steps, prepare=run_steps.prepare)
