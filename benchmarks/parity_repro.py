"""Reproduction: what decides whether a member's float sums are the same in two processes.

    python -m benchmarks.parity_repro [--threads 1,2,4] [--steps 30]

Trains small networks (one Conv2D; the built-in-style CNN on 8x8x1; a CNN on 25x25x1; a CNN
with batch normalisation; an MLP) for `--steps` Adam steps from the same seeds and batches,
each configuration in its own fresh process (a process's thread pools and oneDNN are fixed
when TensorFlow starts): every intra-op thread count of `--threads`, with oneDNN on and off
(`TF_ENABLE_ONEDNN_OPTS`), op determinism on. Prints, per network, the largest absolute
difference of the trained weights against 1 thread with oneDNN on (0 means bit-identical).
docs/concepts/parity.md quotes its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

NETS = ("conv1_b64", "cnn8_b64", "cnn25_b32", "cnnbn16_b64", "mlp_b256")


def _net(name: str):
    """(input shape, batch rows, model) of a network of `NETS`, seeded."""
    import keras

    L, init = keras.layers, lambda k: keras.initializers.GlorotUniform(seed=k)  # noqa: E731
    conv = lambda f, **kw: L.Conv2D(f, 3, kernel_initializer=init(f), **kw)  # noqa: E731
    head = lambda n: [L.Flatten(), L.Dense(n, kernel_initializer=init(99))]  # noqa: E731
    shape, batch, layers = {
        "conv1_b64": ((8, 8, 1), 64, [conv(16, padding="same"), *head(10)]),
        "cnn8_b64": ((8, 8, 1), 64, [conv(16, padding="same", activation="relu"),
                                     L.MaxPooling2D(2), conv(32, padding="same",
                                                             activation="relu"),
                                     L.MaxPooling2D(2), L.Flatten(), L.Dropout(0.25, seed=3),
                                     L.Dense(64, activation="relu", kernel_initializer=init(4)),
                                     L.Dense(10, kernel_initializer=init(5))]),
        "cnn25_b32": ((25, 25, 1), 32, [conv(8, activation="relu"), L.MaxPooling2D(2),
                                        conv(16, activation="relu"), L.MaxPooling2D(2),
                                        *head(3)]),
        "cnnbn16_b64": ((16, 16, 3), 64, [conv(16, padding="same"), L.BatchNormalization(),
                                          L.ReLU(), L.MaxPooling2D(2), conv(32, padding="same"),
                                          L.BatchNormalization(), L.ReLU(),
                                          L.GlobalAveragePooling2D(),
                                          L.Dense(10, kernel_initializer=init(5))]),
        "mlp_b256": ((64,), 256, [L.Dense(256, activation="relu", kernel_initializer=init(1)),
                                  L.Dense(256, activation="relu", kernel_initializer=init(2)),
                                  L.Dense(10, kernel_initializer=init(3))]),
    }[name]
    return shape, batch, keras.Sequential([keras.Input(shape), *layers])


def worker(threads: int, steps: int, out: str) -> None:
    """Train every network of `NETS` `steps` Adam steps on `threads` intra-op threads; save
    the weights to `out` (.npz, `<net>/<variable index>`)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.experimental.enable_op_determinism()
    import keras

    weights = {}
    for name in NETS:
        shape, batch, model = _net(name)
        rng = np.random.default_rng(0)
        x = tf.constant(rng.random((4 * batch, *shape), np.float32))
        y = tf.constant(rng.integers(0, 3, 4 * batch))
        opt = keras.optimizers.Adam(1e-3)

        @tf.function
        def step(xb, yb, model=model, opt=opt):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                    yb, model(xb, training=True), from_logits=True))
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

        for s in range(steps):
            lo = (s % 4) * batch
            step(x[lo:lo + batch], y[lo:lo + batch])
        weights.update({f"{name}/{i}": v.numpy() for i, v in enumerate(model.weights)})
    np.savez(out, **weights)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        worker(int(argv[1]), int(argv[2]), argv[3])
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.parity_repro", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2,4", help="intra-op thread counts (default 1,2,4)")
    p.add_argument("--steps", type=int, default=30, help="Adam steps (default 30)")
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for onednn in (1, 0):
            for t in threads:
                out = str(Path(tmp) / f"{onednn}-{t}.npz")
                env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=str(onednn),
                           TF_CPP_MIN_LOG_LEVEL="3")
                subprocess.run([sys.executable, "-m", "benchmarks.parity_repro", "worker", str(t),
                                str(args.steps), out], env=env, check=True)
                with np.load(out) as z:
                    runs[(onednn, t)] = dict(z)
    ref = runs[(1, threads[0])]
    print(f"max |w - w(oneDNN on, {threads[0]} thread)| after {args.steps} Adam steps")
    print(f"{'oneDNN':<8}{'threads':>8}" + "".join(f"{n:>13}" for n in NETS))
    table = []
    for (onednn, t), w in runs.items():
        diffs = {n: max(float(np.abs(w[k] - ref[k]).max()) for k in w if k.startswith(n + "/"))
                 for n in NETS}
        table.append({"onednn": onednn, "threads": t, **diffs})
        print(f"{'on' if onednn else 'off':<8}{t:>8}" + "".join(f"{diffs[n]:>13.1e}"
                                                             for n in NETS))
    print(json.dumps(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
