"""TensorFlow twins of the numpy aggregators of `ensemble.tasks.classification.aggregators`, for inference graphs.

The in-graph inference graph (and an exported SavedModel) apply these ops with the parameters
fitted on the validation split (`aggregators.json`), so a graph and the numpy aggregator give
the same ensemble rows; `tests/test_aggregate.py` proves it for every aggregator. The ops
compute in float64 and return float32, as the numpy functions do, so the two agree to float32
rounding. Stacking runs as one dense layer (a matmul plus bias, then softmax) over the
members' probabilities laid side by side.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ensemble.tasks.classification.aggregators import AGGREGATORS, LOG_CLIP, check_weights


def _weights(params: dict, n_members: int) -> tf.Tensor:
    return tf.constant(check_weights(params["weights"], n_members), tf.float64)


def aggregate_tf(member_probs, name: str, params: dict | None = None) -> tf.Tensor:
    """TensorFlow twin of `ensemble.tasks.classification.aggregators.aggregate`.

    Args:
        member_probs: `[n_members, n_rows, n_classes]` float32 probabilities (tensor or
            array); `n_members` and `n_classes` must be static for fitted aggregators.
        name: an aggregator of `ensemble.tasks.classification.aggregators.AGGREGATORS`.
        params: the aggregator's fitted parameters (an entry of `aggregators.json`);
            required by `weighted`, `greedy`, `stacking` and `temperature`.

    Returns:
        `[n_rows, n_classes]` float32.

    Raises:
        ValueError: unknown aggregator, or a fitted one without parameters.
    """
    p = tf.convert_to_tensor(member_probs, tf.float32)
    if name == "mean":
        return tf.reduce_mean(p, axis=0)
    if name == "vote":
        n_members, n_classes = tf.shape(p)[0], tf.shape(p)[2]
        votes = tf.one_hot(tf.argmax(p, axis=2), n_classes, dtype=tf.float32)
        return tf.reduce_sum(votes, axis=0) / tf.cast(n_members, tf.float32)
    if name not in AGGREGATORS:
        raise ValueError(f"Expected an aggregator from {', '.join(AGGREGATORS)}. "
                         f"Received: aggregator={name!r}")
    p64 = tf.cast(p, tf.float64)
    if name == "geometric":
        logp = tf.math.log(tf.clip_by_value(p64, LOG_CLIP, 1.0))
        return tf.cast(tf.nn.softmax(tf.reduce_mean(logp, axis=0)), tf.float32)
    if not params:
        raise ValueError(f"Aggregator {name!r} needs its fitted parameters (aggregators.json).")
    n_members = int(p.shape[0])
    if name in ("weighted", "greedy"):
        return tf.cast(tf.tensordot(_weights(params, n_members), p64, axes=1), tf.float32)
    if name == "temperature":
        mean = tf.clip_by_value(tf.reduce_mean(p64, axis=0), LOG_CLIP, 1.0)
        return tf.cast(tf.nn.softmax(tf.math.log(mean) / float(params["temperature"])),
                       tf.float32)
    coef = np.asarray(params["coef"], np.float64)  # stacking: [n_classes, n_members*n_classes]
    x = tf.reshape(tf.transpose(p64, [1, 0, 2]), [-1, coef.shape[1]])
    logits = tf.matmul(x, tf.constant(coef.T)) + tf.constant(np.asarray(params["intercept"],
                                                                        np.float64))
    return tf.cast(tf.nn.softmax(logits), tf.float32)
