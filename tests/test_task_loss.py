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


def test_balanced_class_weight_is_scikit_learns_and_weights_the_loss_as_keras():
    """`training.class_weight = "balanced"`: scikit-learn's weights n / (k n_c) over the
    training labels; the loss is Keras's class_weight mean of w[y] * cross-entropy."""
    import tensorflow as tf
    from sklearn.utils.class_weight import compute_class_weight

    from ensemble.tasks.classification.task import Classification

    y = np.array([0] * 90 + [1] * 8 + [2] * 2)
    task, entries = Classification().with_class_weight("balanced", y, [0, 1, 2])
    expected = compute_class_weight("balanced", classes=np.arange(3), y=y)
    np.testing.assert_allclose(entries["class_weight"], expected)
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]], np.float32)
    yb = np.array([0, 1, 2], np.int32)
    got = float(task.loss(tf.constant(yb), tf.constant(p)))
    want = np.mean(expected[yb] * -np.log(p[np.arange(3), yb]))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert Classification().with_class_weight("none", y, [0, 1, 2])[1] == {}


def test_class_weight_table_maps_labels_and_leaves_the_rest_at_one():
    """`training.class_weight = {label = weight}`: Keras's and scikit-learn's dict, keyed by
    the class labels as text; a class it leaves out weighs 1 (`compute_class_weight`)."""
    from sklearn.utils.class_weight import compute_class_weight

    from ensemble.core.errors import UsageError
    from ensemble.tasks.classification.task import Classification

    y = np.array([0, 0, 1, 2])
    classes = np.array(["cat", "dog", "pig"])
    _, entries = Classification().with_class_weight({"pig": 5, "cat": 0.5}, y, classes)
    want = compute_class_weight({"pig": 5, "cat": 0.5}, classes=classes, y=classes[y])
    np.testing.assert_allclose(entries["class_weight"], want)
    np.testing.assert_allclose(entries["class_weight"], [0.5, 1.0, 5.0])
    with pytest.raises(UsageError, match="Received: goat"):
        Classification().with_class_weight({"goat": 2}, y, classes)
