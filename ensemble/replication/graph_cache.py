"""Traced training and prediction graphs reused across fits of the same architecture, for
`ensemble.sklearn.DeepEnsembleClassifier`.

Tracing the many-steps training call (`steps.make_steps_fn`) of a few tiny members costs
0.3-1 s on 2 cores, far more than training them on a few hundred rows, and scikit-learn fits
many times (cross-validation, grid search, its estimator checks). A `TracedEnsemble` keeps one
architecture's members, optimisers, traced training call and prediction graphs. Each fit
first `reset`s it to the exact state of a fresh build for its seed (the variables of freshly
built members and optimisers, dropout seed states included, are copied in) and `feed`s it
the rows its batches are gathered from (`feed.Gather`): the numbers are those of a fresh
`InGraphEnsemble.build` while the graph is traced once. A fitted estimator keeps its weights as numpy arrays and
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

from ensemble.config.schema import Config

MAX_ENTRIES = 8  # architectures kept (tiny graphs; an LRU bounds the memory)
MAX_PREDICTORS = 4  # prediction graphs per architecture (one per aggregator and parameters)

_cache: OrderedDict[str, "TracedEnsemble"] = OrderedDict()
_cache_lock = threading.Lock()


def _key(cfg: Config, input_shape, n_classes: int, devices: Sequence[str],
         n_train: int, task) -> str:
    """What the traced graphs depend on: the task (`Task.graph_constants`), shapes, the members' builders and hyperparameters,
    the optimiser (seeds excluded: `reset` sets them), their devices, and for a cosine
    schedule its length. Not early stopping: both forms of the training call
    (`steps.StepsCall`) are traced on demand, and its copies of the best weights are made by
    the first fit that needs them (`MemberGroup.early_stopping`)."""
    d = cfg.to_dict()
    training = {k: d["training"][k] for k in ("learning_rate", "optimizer", "optimizer_params",
                                              "lr_schedule", "batch_size", "precision")}
    if cfg.training.lr_schedule == "cosine":
        training["n_train"], training["epochs"] = n_train, cfg.training.epochs
    return json.dumps([task.spec, task.graph_constants(), list(input_shape), n_classes,
                       list(devices), d["model"], d["members"], training], sort_keys=True)


def get(cfg: Config, input_shape, n_classes: int, devices: Sequence[str],
        n_train: int = 0, *, task) -> "TracedEnsemble":
    """The `TracedEnsemble` of this architecture (`input_shape`: a row's shape) for the
    estimator's `task` (its head and loss, a classification loss's class weights
    included: `training.class_weight`), built (not yet traced) when new; `n_train` sets a
    cosine schedule's length."""
    input_shape = (input_shape,) if isinstance(input_shape, int) else tuple(input_shape)
    key = _key(cfg, input_shape, n_classes, devices, n_train, task)
    with _cache_lock:
        entry = _cache.pop(key, None) or TracedEnsemble(cfg, input_shape, n_classes, devices,
                                                        n_train, task=task)
        _cache[key] = entry
        while len(_cache) > MAX_ENTRIES:
            _cache.popitem(last=False)
        return entry


class TracedEnsemble:
    """One architecture's in-graph members with their traced calls, reset for every fit.

    Attributes:
        group: the `InGraphEnsemble` whose models and optimisers every fit trains.
        lock: held while a fit or a predict uses the shared models.
        run_steps: the traced training call (`steps.StepsCall`: numpy in and out), for
            `training.train_loop`.
    """

    def __init__(self, cfg: Config, input_shape: tuple, n_classes: int,
                 devices: Sequence[str], n_train: int = 0, *, task):
        import tensorflow as tf

        from ensemble.replication.group import CLIENT_DEVICE
        from ensemble.replication.in_graph import InGraphEnsemble
        from ensemble.replication.steps import StepsCall, make_steps_fn

        self.cfg, self.input_shape, self.n_classes = cfg, tuple(input_shape), n_classes
        self.devices, self.n_train = list(devices), n_train
        self.group = InGraphEnsemble.build(cfg, self.input_shape, n_classes, self.devices,
                                           aggregators=(), n_train=n_train or None,
                                           task=task)
        self.lock = threading.RLock()
        self.gather = None  # `feed.Gather` of the rows of the fit under way (`feed`)
        self.run_steps = StepsCall(lambda masked: make_steps_fn(
            self.group.models, self.group.optimizers, self.devices, self.group.task,
            self.input_shape, tf.float32, CLIENT_DEVICE, masked=masked))
        self._predictors: OrderedDict[str, object] = OrderedDict()

    def reset(self, seed: int) -> None:
        """Set members and optimisers to a fresh build's state for run seed `seed`
        (`members.member_seed(seed, k)` for member `k`)."""
        import dataclasses

        from ensemble.replication.in_graph import InGraphEnsemble

        cfg = dataclasses.replace(self.cfg, training=dataclasses.replace(self.cfg.training,
                                                                         seed=seed))
        fresh = InGraphEnsemble.build(cfg, self.input_shape, self.n_classes, self.devices,
                                      aggregators=(), n_train=self.n_train or None,
                                      task=self.group.task)
        for old, new in zip(self.group.models, fresh.models):
            for a, b in zip(old.variables, new.variables, strict=True):
                a.assign(b)
        for old, new in zip(self.group.optimizers, fresh.optimizers):
            for a, b in zip(old.variables, new.variables, strict=True):
                a.assign(b)

    def feed(self, x: np.ndarray, y: np.ndarray) -> None:
        """The training rows of the next fit: `x` `[n_train, *input_shape]` (fed as float32),
        `y` `[n_train]` targets; batches are gathered from them on the host."""
        from ensemble.replication.feed import Gather

        self.gather = Gather(np.asarray(x, np.float32), y,
                             self.group.task.target_dtype)

    def clear(self) -> None:
        """Drop the fed rows (the cache keeps the graphs, not the rows)."""
        self.gather = None

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
        from ensemble.replication.in_graph import InGraphEnsemble

        key = json.dumps([aggregator, params or {}], sort_keys=True)
        graph = self._predictors.pop(key, None)
        if graph is None:
            graph = InGraphEnsemble(self.group.models, self.devices, (aggregator,),
                                    params=params or {}, task=self.group.task)
        self._predictors[key] = graph
        while len(self._predictors) > MAX_PREDICTORS:
            self._predictors.popitem(last=False)
        return graph
