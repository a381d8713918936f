"""Ensemble members: seeds, batch order, the Keras model, and saving/loading it.

A member's initialisation and batch order depend only on `(run seed, member index)`, never on
the mode, the member count or the device. Its optimiser is in `ensemble.optimizer`, the one
training step and the epoch loop in `ensemble.training`.
"""

from __future__ import annotations

import numpy as np

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
    initialiser and dropout layer gets its own seed derived from `seed`. With `cfg.l2 > 0`
    every Dense kernel carries `keras.regularizers.L2(cfg.l2)` (`l2 * sum(kernel**2)`), which
    `training.train_step` adds to the loss: the same in both replication modes.
    """
    import keras

    reg = keras.regularizers.L2(cfg.l2) if cfg.l2 > 0 else None

    layers = [keras.Input((n_features,))]
    for i, width in enumerate(cfg.hidden):
        layers.append(keras.layers.Dense(
            width, activation=cfg.activation, name=f"dense_{i}", kernel_regularizer=reg,
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 2 * i)))
        if cfg.dropout > 0:
            layers.append(keras.layers.Dropout(cfg.dropout, seed=seed + 2 * i + 1,
                                               name=f"dropout_{i}"))
    layers.append(keras.layers.Dense(
        n_classes, activation="softmax", name="output", kernel_regularizer=reg,
        kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 2 * len(cfg.hidden))))
    return keras.Sequential(layers, name=name)


def save_member(model, path) -> None:
    """Save a member atomically in the Keras 3 format (`.keras`)."""
    from ensemble.artifacts import atomic_path

    with atomic_path(path, suffix=".keras") as tmp:
        model.save(tmp)


def load_member(path, device: str | None):
    """Load a saved member with `safe_mode=True` onto `device` (None: no device scope, as an
    export needs: nothing hard-wired).

    Raises:
        UsageError: missing file, or a model that cannot be loaded safely (names the file).
    """
    import contextlib
    from pathlib import Path

    import keras
    import tensorflow as tf

    if not Path(path).is_file():
        raise UsageError(f"Member model not found: {path}")
    try:
        with tf.device(device) if device is not None else contextlib.nullcontext():
            return keras.saving.load_model(path, safe_mode=True, compile=False)
    except Exception as exc:  # Keras raises ValueError/TypeError/OSError for bad files
        raise UsageError(f"Cannot load member model {path} safely: "
                         f"{str(exc).splitlines()[0][:300]}") from None
