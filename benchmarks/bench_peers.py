"""The benchmark's peers, each in its own measured process: what users would pick instead.

`naive`: a plain Keras `fit` loop per member, one after another; `sklearn`: scikit-learn's
`MLPClassifier` per member; `jax`: the members stacked and trained side by side with JAX
(`jax.vmap` over the members, optax's Adam, one `jax.jit`-compiled `lax.scan` per epoch), in
float32 or bfloat16 compute; `predict-1m`: prediction of a million rows by the run. Each reads
a run directory that `benchmarks.benchmark` prepared, so every peer sees the same split.
JAX is a benchmark-only dependency (`pip install jax optax`), never the project's.
"""
from __future__ import annotations

import itertools
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
    from ensemble import tasks
    from ensemble.core import artifacts
    from ensemble.replication import devices
    from ensemble.replication.in_graph import InGraphEnsemble
    from ensemble.models.members import load_member
    from ensemble.replication.placement import place

    cfg, manifest, split = _load(run_dir)
    n = len(manifest.members)
    devs = place(n, devices.resolve("auto", n))
    models = [load_member(artifacts.member_model_path(run_dir, i), d) for i, d in enumerate(devs)]
    ens = InGraphEnsemble(models, devs, cfg.aggregation.aggregators,
                          task=tasks.for_run(manifest))
    x = np.random.default_rng(0).standard_normal((PREDICT_ROWS, split["train"][0].shape[1]),
                                                 dtype=np.float32)
    ens.predict(x[:16384])  # trace once
    seconds = timed(lambda: ens.predict(x, batch_size=32768))
    return {"predict_seconds": seconds, "rows": PREDICT_ROWS, "peak_rss_bytes": _peak_bytes()}


def worker_jax(run_dir: Path, precision: str = "float32") -> dict:
    """The members as one stacked JAX ensemble: `jax.vmap` of an MLP (the run's layers,
    Glorot-uniform kernels, zero biases) over `[n_members, ...]` parameters, optax's Adam
    (the run's learning rate, Keras's epsilon 1e-7), softmax cross-entropy, each member its
    own row order per epoch, an epoch's steps in one jit-compiled `lax.scan`; the ragged
    last batch is dropped (as a JAX user's fixed-shape loop would). `precision`
    `mixed_bfloat16`: parameters and Adam in float32, the forward and backward in bfloat16
    (parameters and rows cast per step), the loss in float32, as Keras's policy does."""
    import jax
    import jax.numpy as jnp
    import optax

    from ensemble.models.members import member_seed

    cfg, manifest, split = _load(run_dir)
    (x, y, _), (xt, yt, _) = split["train"], split["test"]
    n_members, bs, epochs = cfg.members.count, cfg.training.batch_size, cfg.training.epochs
    n_classes = len(manifest.dataset.classes)
    widths = [x.shape[1], *cfg.members.hidden, n_classes]
    act = getattr(jax.nn, cfg.members.activation)
    compute = jnp.bfloat16 if precision == "mixed_bfloat16" else jnp.float32
    start = time.perf_counter()

    def init(key):
        params = []
        for a, b in itertools.pairwise(widths):
            key, sub = jax.random.split(key)
            lim = np.sqrt(6.0 / (a + b))
            params.append((jax.random.uniform(sub, (a, b), jnp.float32, -lim, lim),
                           jnp.zeros(b, jnp.float32)))
        return params

    def logits(params, xb):
        h = xb.astype(compute)
        for i, (w, b) in enumerate(params):
            h = h @ w.astype(compute) + b.astype(compute)
            if i < len(params) - 1:
                h = act(h)
        return h.astype(jnp.float32)

    def loss(params, xb, yb):
        return optax.softmax_cross_entropy_with_integer_labels(logits(params, xb), yb).mean()

    opt = optax.adam(cfg.training.learning_rate, eps=1e-7)
    params = jax.vmap(init)(jnp.stack([jax.random.PRNGKey(member_seed(cfg.training.seed, i))
                                       for i in range(n_members)]))
    state = jax.vmap(opt.init)(params)

    def member_step(p, s, xb, yb):
        value, grads = jax.value_and_grad(loss)(p, xb, yb)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    @jax.jit
    def epoch(params, state, xs, ys):  # xs [steps, n_members, batch, features]
        def body(carry, batch):
            p, s, v = jax.vmap(member_step)(*carry, *batch)
            return (p, s), v
        (params, state), values = jax.lax.scan(body, (params, state), (xs, ys))
        return params, state, values.mean()

    xj, yj = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32)
    steps = len(x) // bs
    rng = np.random.default_rng(cfg.training.seed)
    epoch_seconds = []
    for _ in range(epochs):
        e0 = time.perf_counter()
        order = np.stack([rng.permutation(len(x))[:steps * bs] for _ in range(n_members)])
        idx = jnp.asarray(order.reshape(n_members, steps, bs).transpose(1, 0, 2))
        params, state, value = epoch(params, state, xj[idx], yj[idx])
        value.block_until_ready()
        epoch_seconds.append(time.perf_counter() - e0)
    seconds = time.perf_counter() - start
    probs = jax.nn.softmax(jax.jit(jax.vmap(logits, (0, None)))(params, jnp.asarray(xt)), -1)
    acc = float((np.asarray(probs).mean(0).argmax(1) == yt).mean())
    steady = epoch_seconds[1:]  # the first compiles
    return {"train_seconds": seconds, "test_accuracy": acc, "peak_rss_bytes": _peak_bytes(),
            "steady_rows": steps * bs * len(steady), "steady_seconds": sum(steady)}


WORKERS = {"naive": worker_naive, "sklearn": worker_sklearn, "jax": worker_jax,
           "predict-1m": worker_predict_1m}
PRECISION_WORKERS = ("jax",)  # the peers that run in each of the benchmark's precisions
