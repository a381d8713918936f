"""In-graph replication: ONE graph holds every member, each pinned to its own device, plus the
ops that aggregate the members' predictions, driven by one client.

Each member's layers are both *built* and *called* under `tf.device` of its device (building
alone would place its variables, not its computation); the aggregation ops run on the client's
device. A test reads the traced graph to prove the placement.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from ensemble.config import Config
from ensemble.members import build_member, build_optimizer, member_seed, train_loop, train_step

CLIENT_DEVICE = "/device:CPU:0"


def aggregate_tf(member_probs: tf.Tensor, name: str) -> tf.Tensor:
    """TensorFlow twin of `ensemble.aggregate.aggregate`.

    Args:
        member_probs: `[n_members, n_rows, n_classes]` float32 probabilities.
        name: `mean` (soft voting) or `vote` (hard voting: share of member votes per class).

    Returns:
        `[n_rows, n_classes]` float32.

    Raises:
        ValueError: unknown aggregator.
    """
    if name == "mean":
        return tf.reduce_mean(member_probs, axis=0)
    if name == "vote":
        n_members, n_classes = tf.shape(member_probs)[0], tf.shape(member_probs)[2]
        votes = tf.one_hot(tf.argmax(member_probs, axis=2), n_classes, dtype=tf.float32)
        return tf.reduce_sum(votes, axis=0) / tf.cast(n_members, tf.float32)
    raise ValueError(f"Expected an aggregator from mean, vote. Received: aggregator={name!r}")


class InGraphEnsemble:
    """Every member in one graph, member `k` on `devices[k]`.

    Args:
        models: the members' Keras models, built (or loaded) under their device.
        devices: `[n_members]` device names, e.g. from `RoundRobinPlacement.assign`.
        aggregators: aggregator names computed in the graph (`mean`, `vote`).
        indices: the members' indices in the run (default `0..n_members-1`).
        client_device: where the aggregation ops run.
    """

    def __init__(self, models: Sequence, devices: Sequence[str], aggregators: Sequence[str],
                 indices: Sequence[int] | None = None, client_device: str = CLIENT_DEVICE):
        self.models, self.devices = list(models), list(devices)
        self.aggregators = tuple(aggregators)
        self.indices = list(indices) if indices is not None else list(range(len(models)))
        self.client_device = client_device
        self.optimizers: list = []
        n_features = self.models[0].input_shape[-1]
        self.predict_fn = tf.function(
            self._predict_graph,
            input_signature=[tf.TensorSpec([None, n_features], tf.float32)])

    @classmethod
    def build(cls, cfg: Config, n_features: int, n_classes: int, devices: Sequence[str],
              indices: Sequence[int] | None = None, client_device: str = CLIENT_DEVICE,
              aggregators: Sequence[str] | None = None):
        """Build fresh members (and their Adam optimisers) on `devices`; `aggregators`
        defaults to the config's."""
        indices = list(indices) if indices is not None else list(range(len(devices)))
        models, optimizers = [], []
        for i, device in zip(indices, devices):
            with tf.device(device):
                model = build_member(cfg.members, n_features, n_classes,
                                     member_seed(cfg.training.seed, i), name=f"member_{i}")
                optimizers.append(build_optimizer(model, cfg.training.learning_rate))
            models.append(model)
        aggs = cfg.aggregation.aggregators if aggregators is None else aggregators
        ens = cls(models, devices, aggs, indices, client_device)
        ens.optimizers = optimizers
        return ens

    def _predict_graph(self, x):
        probs = []
        for model, device in zip(self.models, self.devices):
            with tf.device(device):
                probs.append(model(x, training=False))
        with tf.device(self.client_device):
            stacked = tf.stack(probs)
            return stacked, {a: aggregate_tf(stacked, a) for a in self.aggregators}

    def predict(self, x: np.ndarray, batch_size: int = 16384):
        """Member and ensemble probabilities of `x` `[n_rows, n_features]`, in batches.

        Returns:
            (`[n_members, n_rows, n_classes]` float32, `{aggregator: [n_rows, n_classes]}`).
        """
        members, ens = [], {a: [] for a in self.aggregators}
        for lo in range(0, len(x), batch_size):
            m, e = self.predict_fn(tf.constant(x[lo:lo + batch_size], tf.float32))
            members.append(m.numpy())
            for a in self.aggregators:
                ens[a].append(e[a].numpy())
        return (np.concatenate(members, axis=1),
                {a: np.concatenate(v, axis=0) for a, v in ens.items()})

    def make_train_step(self, x_train: np.ndarray, y_train: np.ndarray):
        """The traced training step of all members: `step(idx [n_members, batch] int32) ->
        [n_members] losses`. The training data is copied once onto each member's device."""
        on_device = {}
        for device in dict.fromkeys(self.devices):
            with tf.device(device):
                on_device[device] = (tf.identity(tf.constant(x_train, tf.float32)),
                                     tf.identity(tf.constant(y_train, tf.int32)))

        @tf.function(input_signature=[tf.TensorSpec([len(self.models), None], tf.int32)],
                     autograph=False)
        def step(idx):
            losses = []
            for k, (model, opt, device) in enumerate(zip(self.models, self.optimizers,
                                                           self.devices)):
                with tf.device(device):
                    x, y = on_device[device]
                    losses.append(train_step(model, opt, x, y, idx[k]))
            with tf.device(self.client_device):
                return tf.stack(losses)

        return step

    def fit(self, x_train, y_train, x_val, y_val, run_seed: int, epochs: int,
            batch_size: int, checkpoint_dir=None) -> list[dict]:
        """Train every member with one traced step per batch; returns the history records
        of `members.train_loop`. With `checkpoint_dir`, resume from its newest checkpoint and
        save one after every epoch."""
        from ensemble.checkpoints import EpochCheckpoints

        step = self.make_train_step(x_train, y_train)
        x_val = np.asarray(x_val, np.float32)
        ckpt = (EpochCheckpoints(checkpoint_dir, self.models, self.optimizers)
                if checkpoint_dir is not None else None)
        return train_loop(lambda idx: step(tf.constant(idx)).numpy(),
                          lambda: self.predict(x_val)[0], self.indices, run_seed, epochs,
                          len(x_train), batch_size, y_val, ckpt)
