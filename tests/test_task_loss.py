"""The classification task's training loss: the fused CPU kernel under op determinism, its values
and gradients against a hand computation, and Keras's path where the fused kernel is not used."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.tasks.classification.task import Classification

tf = pytest.importorskip("tensorflow")


def _expected(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of softmax(logits) at y, and its gradient in the logits (float64):
    d/dz mean_i(-log softmax(z_i)[y_i]) = (softmax(z) - onehot(y)) / n."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    grad = p.copy()
    grad[np.arange(len(y)), y] -= 1.0
    return loss, grad / len(y)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(3)
    return rng.normal(0, 2, (32, 5)).astype(np.float32), rng.integers(0, 5, 32).astype(np.int32)


def test_traced_loss_on_cpu_uses_the_fused_kernel_under_op_determinism(batch):
    import keras

    tf.config.experimental.enable_op_determinism()  # as every training process does
    logits, y = batch
    task, head = Classification(), keras.layers.Softmax()

    @tf.function(autograph=False)
    def loss_and_grad(z, yb):
        with tf.device("/device:CPU:0"), tf.GradientTape() as tape:
            tape.watch(z)
            loss = task.loss(yb, head(z))
        return loss, tape.gradient(loss, z)

    loss, grad = loss_and_grad(tf.constant(logits), tf.constant(y))
    want_loss, want_grad = _expected(logits, y)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
    np.testing.assert_allclose(grad.numpy(), want_grad, atol=1e-7)
    graph = loss_and_grad.get_concrete_function(tf.constant(logits), tf.constant(y)).graph
    types = {op.type for op in graph.get_operations()}
    assert "SparseSoftmaxCrossEntropyWithLogits" in types
    assert "GatherV2" not in types  # TensorFlow's deterministic replacement was not used


def test_eager_and_non_softmax_outputs_take_keras_path_with_the_same_value(batch):
    logits, y = batch
    probs = tf.nn.softmax(tf.constant(logits))
    want_loss, _ = _expected(logits, y)
    task = Classification()
    np.testing.assert_allclose(float(task.loss(tf.constant(y), probs)), want_loss, rtol=1e-5)

    @tf.function(autograph=False)  # probabilities that are not a Softmax op's output
    def from_probabilities(p, yb):
        return task.loss(yb, tf.identity(p))

    traced = from_probabilities(probs, tf.constant(y))
    np.testing.assert_allclose(float(traced), want_loss, rtol=1e-5)
