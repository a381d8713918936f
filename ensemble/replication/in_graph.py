"""In-graph replication: ONE graph holds every member, each pinned to its own device, plus the
ops that aggregate the members' predictions, driven by one client.

`InGraphEnsemble` is a `group.MemberGroup` of all the members whose prediction graph also
aggregates them on the client's device. A test reads the traced graph to prove the placement.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from ensemble.replication.group import CLIENT_DEVICE, MemberGroup

__all__ = ["CLIENT_DEVICE", "InGraphEnsemble"]


class InGraphEnsemble(MemberGroup):
    """Every member in one graph, member `k` on `devices[k]`, aggregated in the graph.

    Args:
        models: the members' Keras models, built (or loaded) under their device.
        devices: `[n_members]` device names, e.g. from `RoundRobinPlacement.assign`.
        aggregators: aggregator names computed in the graph (the task's `aggregators`).
        params: fitted aggregators' parameters `{name: params}` (`aggregators.json`).
        indices: the members' indices in the run (default `0..n_members-1`).
        kwargs: `MemberGroup`'s `client_device` (where the aggregation ops run) and `task`.
    """

    def __init__(self, models: Sequence, devices: Sequence[str], aggregators: Sequence[str],
                 indices: Sequence[int] | None = None, params: dict | None = None, **kwargs):
        self.aggregators = tuple(aggregators)
        self.params = dict(params or {})
        super().__init__(models, devices, indices, **kwargs)

    @classmethod
    def build(cls, cfg, input_shape, n_classes: int, devices: Sequence[str],
              indices: Sequence[int] | None = None, **kwargs):
        """Build fresh members on `devices` (`MemberGroup.build`: `kwargs` `n_train`, `pre`,
        `task`, `client_device`, `params`); `aggregators` (a keyword too) defaults to the
        config's."""
        if kwargs.get("aggregators") is None:
            kwargs["aggregators"] = cfg.aggregation.aggregators
        return super().build(cfg, input_shape, n_classes, devices, indices, **kwargs)

    def _predict_graph(self, x):
        stacked = self._member_probs(x)
        with tf.device(self.client_device):  # the task's TF twins (`Task.aggregate_tf`)
            return stacked, {a: self.task.aggregate_tf(stacked, a, self.params.get(a))
                             for a in self.aggregators}
