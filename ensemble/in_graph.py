"""In-graph replication: ONE graph holds every member, each pinned to its own device, plus the
ops that aggregate the members' predictions, driven by one client.

`InGraphEnsemble` is a `group.MemberGroup` of all the members whose prediction graph also
aggregates them on the client's device. A test reads the traced graph to prove the placement.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from ensemble.group import CLIENT_DEVICE, MemberGroup

__all__ = ["CLIENT_DEVICE", "InGraphEnsemble", "aggregate_tf"]


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


class InGraphEnsemble(MemberGroup):
    """Every member in one graph, member `k` on `devices[k]`, aggregated in the graph.

    Args:
        models: the members' Keras models, built (or loaded) under their device.
        devices: `[n_members]` device names, e.g. from `RoundRobinPlacement.assign`.
        aggregators: aggregator names computed in the graph (`mean`, `vote`).
        indices: the members' indices in the run (default `0..n_members-1`).
        client_device: where the aggregation ops run.
    """

    def __init__(self, models: Sequence, devices: Sequence[str], aggregators: Sequence[str],
                 indices: Sequence[int] | None = None, client_device: str = CLIENT_DEVICE):
        self.aggregators = tuple(aggregators)
        super().__init__(models, devices, indices, client_device)

    @classmethod
    def build(cls, cfg, n_features: int, n_classes: int, devices: Sequence[str],
              indices: Sequence[int] | None = None, client_device: str = CLIENT_DEVICE,
              aggregators: Sequence[str] | None = None):
        """Build fresh members on `devices`; `aggregators` defaults to the config's."""
        aggs = cfg.aggregation.aggregators if aggregators is None else aggregators
        return super().build(cfg, n_features, n_classes, devices, indices, client_device,
                             aggregators=aggs)

    def _predict_graph(self, x):
        stacked = self._member_probs(x)
        with tf.device(self.client_device):
            return stacked, {a: aggregate_tf(stacked, a) for a in self.aggregators}
