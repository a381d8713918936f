"""The benchmark's peers, each in its own measured process: what users would pick instead.

`naive`: a plain Keras `fit` loop per member, one after another; `sklearn`: scikit-learn's
`MLPClassifier` per member; `predict-1m`: prediction of a million rows by the run. Each reads
a run directory that `benchmarks.benchmark` prepared, so every peer sees the same split.
"""
from __future__ import annotations

import resource
import time
from pathlib import Path

import numpy as np

PREDICT_ROWS = 1_000_000


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _peak_bytes(children: int = 0) -> int:
    """Own peak resident bytes plus `children` x the largest reaped child's peak (an upper
    bound for a pool of `children` workers)."""
    from ensemble.replication.devices import peak_rss_bytes

    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return peak_rss_bytes() + children * kids


def _load(run_dir: Path):
    from ensemble.core import artifacts
    from ensemble.core.manifest import Manifest
    from ensemble.runs.context import config_of

    manifest = Manifest.load(run_dir)
    split = {s: artifacts.read_split(run_dir, s) for s in artifacts.SPLITS}
    return config_of(manifest), manifest, split


def worker_naive(run_dir: Path) -> dict:
    """Members built and trained one after another with `model.fit`, then averaged."""
    import keras

    from ensemble import tasks
    from ensemble.config.schema import member_hparams
    from ensemble.models.members import build_member, member_seed

    cfg, manifest, split = _load(run_dir)
    (x, y, _), (xt, yt, _) = split["train"], split["test"]
    n_classes = len(manifest.dataset.classes)
    epoch_seconds: list[list[float]] = []

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            epoch_seconds[-1].append(time.perf_counter() - self.start)

    probs, seconds = [], 0.0
    for i in range(cfg.members.count):
        start = time.perf_counter()
        h = member_hparams(cfg, i)
        model = build_member(h["builder"], h["params"], x.shape[1:], n_classes,
                             member_seed(cfg.training.seed, i), f"member_{i}", tasks.get())
        model.compile(keras.optimizers.Adam(cfg.training.learning_rate),
                      "sparse_categorical_crossentropy")
        epoch_seconds.append([])
        model.fit(x, y, batch_size=cfg.training.batch_size, epochs=cfg.training.epochs,
                  shuffle=True, verbose=0, callbacks=[EpochTimes()])
        seconds += time.perf_counter() - start
        probs.append(model.predict(xt, batch_size=16384, verbose=0))
    acc = float((np.mean(probs, axis=0).argmax(1) == yt).mean())
    steady = [s for member in epoch_seconds for s in member[1:]]  # each member's first: tracing
    return {"train_seconds": seconds, "test_accuracy": acc, "peak_rss_bytes": _peak_bytes(),
            # rows per member, as in-graph's (whose members train side by side)
            "steady_rows": len(x) * len(steady) / cfg.members.count,
            "steady_seconds": sum(steady)}


def worker_sklearn(run_dir: Path) -> dict:
    """`VotingClassifier(voting="soft")` of `MLPClassifier`s, same layers/epochs, n_jobs=2."""
    import warnings

    from joblib.externals.loky import get_reusable_executor
    from sklearn.ensemble import VotingClassifier
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    from ensemble.models.members import member_seed

    cfg, _, split = _load(run_dir)
    (x, y, _), (xt, yt, _) = split["train"], split["test"]
    members = [(f"member_{i}", MLPClassifier(
        hidden_layer_sizes=cfg.members.hidden, activation=cfg.members.activation, solver="adam",
        alpha=0.0, batch_size=cfg.training.batch_size,
        learning_rate_init=cfg.training.learning_rate, max_iter=cfg.training.epochs,
        shuffle=True, random_state=member_seed(cfg.training.seed, i)))
        for i in range(cfg.members.count)]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = VotingClassifier(members, voting="soft", n_jobs=2).fit(x, y)
    seconds = time.perf_counter() - start
    acc = float((clf.predict(xt) == yt).mean())
    get_reusable_executor().shutdown(wait=True)  # reap the workers so their memory is counted
    return {"train_seconds": seconds, "test_accuracy": acc,
            "peak_rss_bytes": _peak_bytes(children=2)}


def worker_predict_1m(run_dir: Path) -> dict:
    """In-graph prediction of 1,000,000 rows by the trained ensemble of `run_dir`."""
    from ensemble.core import artifacts
    from ensemble.replication import devices
    from ensemble.replication.in_graph import InGraphEnsemble
    from ensemble.models.members import load_member
    from ensemble.replication.placement import place

    cfg, manifest, split = _load(run_dir)
    n = len(manifest.members)
    devs = place(n, devices.resolve("auto", n))
    models = [load_member(artifacts.member_model_path(run_dir, i), d) for i, d in enumerate(devs)]
    ens = InGraphEnsemble(models, devs, cfg.aggregation.aggregators)
    x = np.random.default_rng(0).standard_normal((PREDICT_ROWS, split["train"][0].shape[1]),
                                                 dtype=np.float32)
    ens.predict(x[:16384])  # trace once
    seconds = timed(lambda: ens.predict(x, batch_size=32768))
    return {"predict_seconds": seconds, "rows": PREDICT_ROWS, "peak_rss_bytes": _peak_bytes()}


WORKERS = {"naive": worker_naive, "sklearn": worker_sklearn, "predict-1m": worker_predict_1m}
