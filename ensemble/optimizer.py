"""The members' optimiser: Adam on TensorFlow's fused `ResourceApplyAdam` kernel.

Own code instead of `keras.optimizers.Adam` because Keras's optimiser emits about a dozen ops
per variable (and a Python-side iteration counter check) where the fused kernel emits one: the
traced graph of 8 members stays small and each step cheap.
"""

from __future__ import annotations


class Adam:
    """Adam (Kingma & Ba 2015) with one `ResourceApplyAdam` op per variable.

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
