"""Ensemble members: construction, seeds, the one training step, and the epoch loop.

Both builders use these functions, which is what makes the two replication modes give
identical members: a member's initialisation and batch order depend only on
`(run seed, member index)`, never on the mode, the member count or the device.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Sequence

import numpy as np

from ensemble import metrics
from ensemble.config import MembersConfig
from ensemble.errors import UsageError


def member_seed(run_seed: int, index: int) -> int:
    """The seed of member `index`: a 31-bit integer from `SeedSequence([run_seed, index])`."""
    return int(np.random.SeedSequence([run_seed, index]).generate_state(1)[0] >> 1)


def batch_order(run_seed: int, index: int, epoch: int, n_rows: int) -> np.ndarray:
    """Row order of member `index` in `epoch`: a permutation of `range(n_rows)`, int32."""
    rng = np.random.default_rng([run_seed, index, epoch])
    return rng.permutation(n_rows).astype(np.int32)


def build_member(cfg: MembersConfig, n_features: int, n_classes: int, seed: int, name: str):
    """A Keras MLP `[n_rows, n_features] -> [n_rows, n_classes]` probabilities (softmax).

    Call it under `tf.device(...)` so its variables live on the member's device. Every
    initialiser and dropout layer gets its own seed derived from `seed`.
    """
    import keras

    layers = [keras.Input((n_features,))]
    for i, width in enumerate(cfg.hidden):
        layers.append(keras.layers.Dense(
            width, activation=cfg.activation, name=f"dense_{i}",
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 2 * i)))
        if cfg.dropout > 0:
            layers.append(keras.layers.Dropout(cfg.dropout, seed=seed + 2 * i + 1,
                                               name=f"dropout_{i}"))
    layers.append(keras.layers.Dense(
        n_classes, activation="softmax", name="output",
        kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 2 * len(cfg.hidden))))
    return keras.Sequential(layers, name=name)


class Adam:
    """Adam (Kingma & Ba 2015) with TensorFlow's fused `ResourceApplyAdam` kernel: one op per
    variable instead of a dozen, which keeps both the traced graph and each step small.

    Same update as `keras.optimizers.Adam` (beta_1 0.9, beta_2 0.999, epsilon 1e-7):
    `m += (g - m)(1 - b1)`, `v += (g^2 - v)(1 - b2)`,
    `var -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`.
    Create it under `tf.device` of the member: its slots live beside the variables.
    """

    def __init__(self, variables, learning_rate: float, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7):
        import tensorflow as tf

        self.variables = list(variables)
        self.lr, self.b1, self.b2, self.eps = learning_rate, beta_1, beta_2, epsilon
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.m = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in self.variables]
        self.v = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in self.variables]

    def apply(self, grads) -> None:
        """Apply one update with `grads` (same order as the variables)."""
        import tensorflow as tf

        t = tf.cast(self.iterations.assign_add(1), tf.float32)
        b1_power, b2_power = tf.pow(self.b1, t), tf.pow(self.b2, t)
        for var, m, v, g in zip(self.variables, self.m, self.v, grads):
            handle = getattr(var, "value", var).handle  # keras.Variable wraps a tf.Variable
            tf.raw_ops.ResourceApplyAdam(
                var=handle, m=m.handle, v=v.handle, beta1_power=b1_power,
                beta2_power=b2_power, lr=self.lr, beta1=self.b1, beta2=self.b2,
                epsilon=self.eps, grad=g, use_locking=False)


def build_optimizer(model, learning_rate: float) -> Adam:
    """Adam over `model.trainable_variables`, its slots created now (on the current device)."""
    return Adam(model.trainable_variables, learning_rate)


def save_member(model, path) -> None:
    """Save a member atomically in the Keras 3 format (`.keras`)."""
    from ensemble.artifacts import atomic_path

    with atomic_path(path, suffix=".keras") as tmp:
        model.save(tmp)


def load_member(path, device: str):
    """Load a saved member with `safe_mode=True` onto `device`.

    Raises:
        UsageError: missing file, or a model that cannot be loaded safely (names the file).
    """
    import keras
    import tensorflow as tf
    from pathlib import Path

    if not Path(path).is_file():
        raise UsageError(f"Member model not found: {path}")
    try:
        with tf.device(device):
            return keras.saving.load_model(path, safe_mode=True, compile=False)
    except Exception as exc:  # Keras raises ValueError/TypeError/OSError for bad files
        raise UsageError(f"Cannot load member model {path} safely: "
                         f"{str(exc).splitlines()[0][:300]}") from None


def train_step(model, optimizer, x, y, idx):
    """THE training step of one member: gather the batch, forward, backward, Adam update.

    Args:
        x: `[n_train, n_features]` float32 tensor on the member's device.
        y: `[n_train]` int32 class indices on the member's device.
        idx: `[batch]` int32 row indices of this batch.

    Returns:
        Scalar float32 mean cross-entropy (natural log) of the batch.
    """
    import keras
    import tensorflow as tf

    xb, yb = tf.gather(x, idx), tf.gather(y, idx)
    with tf.GradientTape() as tape:
        probs = model(xb, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(yb, probs))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads)
    return loss


def _progbar(n_steps: int, epoch: int, epochs: int):
    if not sys.stdout.isatty():
        return None
    import keras

    print(f"Epoch {epoch + 1}/{epochs}")
    return keras.utils.Progbar(n_steps)


def train_loop(step: Callable[[np.ndarray], object], predict_val: Callable[[], np.ndarray],
               indices: Sequence[int], run_seed: int, epochs: int, n_train: int,
               batch_size: int, y_val: np.ndarray, checkpoints=None) -> list[dict]:
    """Run the epochs for the members `indices` and record their history.

    Args:
        step: takes `[len(indices), batch]` int32 batch rows, runs one training step of those
            members, returns their `[len(indices)]` losses (a tensor or array).
        predict_val: returns validation probabilities `[len(indices), n_val, n_classes]`.
        y_val: `[n_val]` validation class indices.
        checkpoints: optional `checkpoints.EpochCheckpoints`: training resumes after its newest
            checkpoint and saves one after every epoch.

    Returns:
        History records `{member, epoch, loss, val_loss, val_accuracy, seconds}` of every epoch
        (restored ones included); `seconds` is the epoch's wall time, shared by the members
        trained together.
    """
    from ensemble.checkpoints import maybe_hold

    start_epoch, records = checkpoints.restore() if checkpoints is not None else (0, [])
    n_steps = -(-n_train // batch_size)
    for epoch in range(start_epoch, epochs):
        start = time.perf_counter()
        order = np.stack([batch_order(run_seed, i, epoch, n_train) for i in indices])
        bar = _progbar(n_steps, epoch, epochs)
        loss_sum = 0.0
        for s in range(n_steps):
            lo, hi = s * batch_size, min((s + 1) * batch_size, n_train)
            loss_sum = loss_sum + step(order[:, lo:hi]) * (hi - lo)
            if bar is not None:
                bar.update(s + 1)
            maybe_hold(epoch, s, indices)
        losses = np.asarray(loss_sum) / n_train
        val = predict_val()
        seconds = time.perf_counter() - start
        for k, i in enumerate(indices):
            records.append({
                "member": i, "epoch": epoch, "loss": float(losses[k]),
                "val_loss": metrics.nll(y_val, val[k]),
                "val_accuracy": metrics.accuracy(y_val, val[k]), "seconds": seconds,
            })
        if checkpoints is not None:
            checkpoints.save(epoch, records)
        maybe_hold(epoch, None, indices)
    return records
