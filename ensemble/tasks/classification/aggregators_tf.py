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

from ensemble.tasks.base import check_weights
from ensemble.tasks.classification import threshold
from ensemble.tasks.classification.aggregators import LOG_CLIP, REGISTRY, member_weights, unknown


def _f64(member_probs) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(member_probs, tf.float32), tf.float64)


def mean(member_probs, params=None) -> tf.Tensor:
    """Soft voting: `[n_members, n_rows, n_classes]` -> `[n_rows, n_classes]` float32."""
    return tf.reduce_mean(tf.convert_to_tensor(member_probs, tf.float32), axis=0)


def vote(member_probs, params=None) -> tf.Tensor:
    """Hard voting: the share of member votes per class (ties as `np.argmax`)."""
    p = tf.convert_to_tensor(member_probs, tf.float32)
    n_members, n_classes = tf.shape(p)[0], tf.shape(p)[2]
    votes = tf.one_hot(tf.argmax(p, axis=2), n_classes, dtype=tf.float32)
    return tf.reduce_sum(votes, axis=0) / tf.cast(n_members, tf.float32)


def geometric(member_probs, params=None) -> tf.Tensor:
    """Normalised geometric mean, probabilities clipped at `LOG_CLIP`."""
    logp = tf.math.log(tf.clip_by_value(_f64(member_probs), LOG_CLIP, 1.0))
    return tf.cast(tf.nn.softmax(tf.reduce_mean(logp, axis=0)), tf.float32)


def weighted(member_probs, params: dict) -> tf.Tensor:
    """`weighted` and `greedy`: `sum_m w_m p_m` with the fitted weights (`n_members` static)."""
    p64 = _f64(member_probs)
    w = tf.constant(check_weights(params["weights"], int(p64.shape[0])), tf.float64)
    return tf.cast(tf.tensordot(w, p64, axes=1), tf.float32)


def temperature(member_probs, params: dict) -> tf.Tensor:
    """Temperature scaling of the mean (`params["temperature"]`)."""
    m = tf.clip_by_value(tf.reduce_mean(_f64(member_probs), axis=0), LOG_CLIP, 1.0)
    return tf.cast(tf.nn.softmax(tf.math.log(m) / float(params["temperature"])), tf.float32)


def stacking(member_probs, params: dict) -> tf.Tensor:
    """Stacking as one dense layer over the members' probabilities side by side."""
    coef = np.asarray(params["coef"], np.float64)  # [n_classes, n_members * n_classes]
    x = tf.reshape(tf.transpose(_f64(member_probs), [1, 0, 2]), [-1, coef.shape[1]])
    logits = tf.matmul(x, tf.constant(coef.T)) + tf.constant(np.asarray(params["intercept"],
                                                                        np.float64))
    return tf.cast(tf.nn.softmax(logits), tf.float32)


def aggregate_tf(member_probs, name: str, params: dict | None = None) -> tf.Tensor:
    """TensorFlow twin of `ensemble.tasks.classification.aggregators.aggregate`.

    Args:
        member_probs: `[n_members, n_rows, n_classes]` float32 probabilities (tensor or
            array); `n_members` and `n_classes` must be static for fitted aggregators.
        name: an aggregator of `ensemble.tasks.classification.aggregators.REGISTRY`.
        params: the aggregator's fitted parameters (an entry of `aggregators.json`);
            required by `weighted`, `greedy`, `stacking` and `temperature`.

    Returns:
        `[n_rows, n_classes]` float32.

    Raises:
        ValueError: unknown aggregator, or a fitted one without parameters.
    """
    if name not in REGISTRY:
        raise ValueError(unknown(name))
    return REGISTRY[name].apply_tf(member_probs, params)


def entropy_tf(p):
    """Shannon entropy (nats) over the last axis of `p` (float64), `0 log 0 = 0`: the TF twin
    of `ensemble.tasks.classification.metrics.entropy`."""
    safe = tf.where(p > 0, p, tf.ones_like(p))
    return -tf.reduce_sum(tf.where(p > 0, p * tf.math.log(safe), tf.zeros_like(p)), axis=-1)


def uncertainty_tf(member_probs, ensemble_probs, weights) -> dict:
    """Per-row uncertainty of an ensemble row, TF twin of
    `ensemble.tasks.classification.metrics.uncertainty`.

    Args:
        member_probs: `[n_members, batch, n_classes]` float32 probabilities.
        ensemble_probs: `[batch, n_classes]` float32, the aggregator's output.
        weights: `[n_members]` weights of the expected member entropy
            (`ensemble.tasks.classification.aggregators.member_weights`).

    Returns:
        `{"entropy", "expected_entropy", "mutual_information"}`, each `[batch]` float32 (float64
        inside): H(ensemble), sum_m w_m H(p_m) and the mutual information of the members'
        mixture, H(sum_m w_m p_m) - sum_m w_m H(p_m) >= 0 (Depeweg et al. 2018).
    """
    p = tf.cast(member_probs, tf.float64)
    w = tf.constant(np.asarray(weights, np.float64))
    member_h = entropy_tf(p)  # [n_members, batch]
    expected = tf.tensordot(w, member_h, axes=1)
    mi = entropy_tf(tf.tensordot(w, p, axes=1)) - expected
    return {"entropy": tf.cast(entropy_tf(tf.cast(ensemble_probs, tf.float64)), tf.float32),
            "expected_entropy": tf.cast(expected, tf.float32),
            "mutual_information": tf.cast(mi, tf.float32)}


def serving_outputs(stacked, name: str, params: dict | None, classes) -> dict:
    """An exported signature's outputs of aggregator `name` over `stacked` `[n_members, batch,
    n_classes]` probabilities: `probabilities`, `labels` (from the `classes` variable),
    `class_index` (the argmax, or with a decision threshold in `params` the positive class
    where its probability reaches it: `ensemble.tasks.classification.threshold`), `member_probabilities` `[batch, n_members, n_classes]`, and for
    probabilities (not vote shares) `entropy`, `expected_entropy`, `mutual_information`."""
    probs = aggregate_tf(stacked, name, params)
    t = threshold.of(params)
    index = tf.argmax(probs, axis=1) if t is None else tf.cast(
        probs[:, 1] >= tf.constant(t, probs.dtype), tf.int64)  # the decision threshold
    out = {"probabilities": probs, "labels": tf.gather(classes, index), "class_index": index,
           "member_probabilities": tf.transpose(stacked, [1, 0, 2])}
    if REGISTRY[name].probabilities:  # vote shares: no entropy (as predict)
        out.update(uncertainty_tf(stacked, probs,
                                  member_weights(name, int(stacked.shape[0]), params)))
    return out
