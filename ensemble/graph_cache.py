"""Traced training and prediction graphs reused across fits of the same architecture, for
`ensemble.sklearn.DeepEnsembleClassifier`.

Tracing the many-steps training call (`training.make_steps_fn`) of a few tiny members costs
0.3-1 s on 2 cores, far more than training them on a few hundred rows, and scikit-learn fits
many times (cross-validation, grid search, its estimator checks). A `TracedEnsemble` keeps one
architecture's members, optimisers, traced training call and prediction graphs. Each fit
first `reset`s it to the exact state of a fresh build for its seed (the variables of freshly
built members and optimisers, dropout seed states included, are copied in) and `feed`s its
rows into device-resident variables: the numbers are those of a fresh `InGraphEnsemble.build`
while the graph is traced once. A fitted estimator keeps its weights as numpy arrays and
loads them into the shared models only for the length of a `predict` (under `lock`).

Own code: Keras and TensorFlow offer no way to reset a traced function's state or swap the
constants it captured; this module is that reset and nothing more.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

from ensemble.config import Config

MAX_ENTRIES = 8  # architectures kept (tiny graphs; an LRU bounds the memory)
MAX_PREDICTORS = 4  # prediction graphs per architecture (one per aggregator and parameters)

_cache: OrderedDict[str, "TracedEnsemble"] = OrderedDict()
_cache_lock = threading.Lock()


def _key(cfg: Config, n_features: int, n_classes: int, devices: Sequence[str]) -> str:
    """What the traced graphs depend on: shapes, the members' hyperparameters (seeds
    excluded: `reset` sets them) and their devices."""
    members = cfg.to_dict()["members"]
    return json.dumps([n_features, n_classes, list(devices), members,
                       cfg.training.learning_rate], sort_keys=True)


def get(cfg: Config, n_features: int, n_classes: int, devices: Sequence[str]) -> "TracedEnsemble":
    """The `TracedEnsemble` of this architecture, built (not yet traced) when new."""
    key = _key(cfg, n_features, n_classes, devices)
    with _cache_lock:
        entry = _cache.pop(key, None) or TracedEnsemble(cfg, n_features, n_classes, devices)
        _cache[key] = entry
        while len(_cache) > MAX_ENTRIES:
            _cache.popitem(last=False)
        return entry


class TracedEnsemble:
    """One architecture's in-graph members with their traced calls, reset for every fit.

    Attributes:
        group: the `InGraphEnsemble` whose models and optimisers every fit trains.
        lock: held while a fit or a predict uses the shared models.
    """

    def __init__(self, cfg: Config, n_features: int, n_classes: int, devices: Sequence[str]):
        import tensorflow as tf

        from ensemble.group import CLIENT_DEVICE
        from ensemble.in_graph import InGraphEnsemble
        from ensemble.training import make_steps_fn

        self.cfg, self.shape = cfg, (n_features, n_classes)
        self.devices = list(devices)
        self.group = InGraphEnsemble.build(cfg, n_features, n_classes, self.devices,
                                           aggregators=())
        self.lock = threading.RLock()
        self.data = {}
        for device in dict.fromkeys(self.devices):
            with tf.device(device):
                self.data[device] = (
                    tf.Variable(tf.zeros([0, n_features]), shape=[None, n_features],
                                trainable=False),
                    tf.Variable(tf.zeros([0], tf.int32), shape=[None], trainable=False))
        self.run_steps = make_steps_fn(self.group.models, self.group.optimizers, self.devices,
                                       None, None, CLIENT_DEVICE, on_device=self.data)
        self._predictors: OrderedDict[str, object] = OrderedDict()

    def reset(self, seed: int) -> None:
        """Set members and optimisers to a fresh build's state for run seed `seed`
        (`members.member_seed(seed, k)` for member `k`)."""
        import dataclasses

        from ensemble.in_graph import InGraphEnsemble

        cfg = dataclasses.replace(self.cfg, training=dataclasses.replace(self.cfg.training,
                                                                         seed=seed))
        fresh = InGraphEnsemble.build(cfg, *self.shape, self.devices, aggregators=())
        for old, new in zip(self.group.models, fresh.models):
            for a, b in zip(old.variables, new.variables, strict=True):
                a.assign(b)
        for opt in self.group.optimizers:
            for var in (opt.iterations, *opt.m, *opt.v):
                var.assign(np.zeros(var.shape, var.dtype.as_numpy_dtype))

    def feed(self, x: np.ndarray, y: np.ndarray) -> None:
        """Training rows `x` `[n_train, n_features]` float32, `y` `[n_train]` class indices,
        copied onto every member's device."""
        for xv, yv in self.data.values():
            xv.assign(np.asarray(x, np.float32))
            yv.assign(np.asarray(y, np.int32))

    def steps(self, idx: np.ndarray, total: np.ndarray) -> np.ndarray:
        """`training.make_steps_fn`'s call, numpy in and out (for `training.train_loop`)."""
        import tensorflow as tf

        return self.run_steps(tf.constant(idx), tf.constant(total)).numpy()

    def weights(self) -> list[list[np.ndarray]]:
        """`[n_members]` lists of the members' weights (`keras.Model.get_weights`)."""
        return [m.get_weights() for m in self.group.models]

    def load(self, weights: Sequence[Sequence[np.ndarray]]) -> None:
        """Put a fitted ensemble's weights (as from `weights`) into the shared models."""
        for model, w in zip(self.group.models, weights, strict=True):
            model.set_weights(w)

    def predictor(self, aggregator: str, params: dict | None):
        """The `InGraphEnsemble` prediction graph of the shared models with `aggregator`
        (and its fitted `params`), traced on first use and kept."""
        from ensemble.in_graph import InGraphEnsemble

        key = json.dumps([aggregator, params or {}], sort_keys=True)
        graph = self._predictors.pop(key, None)
        if graph is None:
            graph = InGraphEnsemble(self.group.models, self.devices, (aggregator,),
                                    params=params or {})
        self._predictors[key] = graph
        while len(self._predictors) > MAX_PREDICTORS:
            self._predictors.popitem(last=False)
        return graph
