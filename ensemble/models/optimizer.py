"""The members' optimisers: Adam on TensorFlow's fused kernel (the default), or any Keras one.

Own Adam instead of `keras.optimizers.Adam` because Keras's optimiser emits about a dozen ops
per variable (and a Python-side iteration counter check) where the fused kernel emits one: the
traced graph of 8 members stays small and each step cheap. Any other `keras.optimizers` name
(`sgd`, `adamw`, `rmsprop`, ...) runs Keras's own optimiser behind the same two-method
interface (`apply(grads)`, `variables`, `scale_loss(loss)`), built on the member's device
before tracing; `mixed_float16` wraps either in `precision.LossScaled`.
"""

from __future__ import annotations

import math
from typing import Any

FUSED_ADAM_PARAMS = ("beta_1", "beta_2", "epsilon", "weight_decay")


def cosine(step, base_lr: float, total_steps: int):
    """Cosine decay to 0 (Loshchilov & Hutter 2017; `keras.optimizers.schedules.CosineDecay`
    with alpha 0): `base_lr * 0.5 * (1 + cos(pi * min(step, total) / total))`, a float32
    tensor for the 0-based `step`."""
    import tensorflow as tf

    t = tf.minimum(tf.cast(step, tf.float32), float(total_steps)) / float(total_steps)
    return base_lr * 0.5 * (1.0 + tf.cos(math.pi * t))


class Adam:
    """Adam (Kingma & Ba 2015) with one `ResourceApplyAdam` op per variable.

    Same update as `keras.optimizers.Adam` (beta_1 0.9, beta_2 0.999, epsilon 1e-7):
    `m += (g - m)(1 - b1)`, `v += (g^2 - v)(1 - b2)`,
    `var -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`; with `total_steps`, `lr`
    follows `cosine` over the steps. `weight_decay` > 0 makes it AdamW (Loshchilov & Hutter
    2019): `var -= lr * weight_decay * var` before each step, as Keras's `weight_decay`.
    Create it under `tf.device` of the member: its slots live beside the variables.
    """

    def __init__(self, variables, learning_rate: float, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7, total_steps: int | None = None,
                 weight_decay: float = 0.0):
        import tensorflow as tf

        self.weights = list(variables)
        self.lr, self.b1, self.b2, self.eps = learning_rate, beta_1, beta_2, epsilon
        self.weight_decay = float(weight_decay)
        self.total_steps = total_steps
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.m = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in self.weights]
        self.v = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in self.weights]

    @property
    def variables(self) -> list:
        """The optimiser's state: step counter and both slots of every variable."""
        return [self.iterations, *self.m, *self.v]

    def scale_loss(self, loss):
        """The loss the gradients are taken of: `loss` itself (no loss scaling)."""
        return loss

    def apply(self, grads) -> None:
        """Apply one update with `grads` (same order as the variables)."""
        import tensorflow as tf

        step = self.iterations.assign_add(1)
        t = tf.cast(step, tf.float32)
        lr = self.lr if self.total_steps is None else cosine(step - 1, self.lr, self.total_steps)
        b1_power, b2_power = tf.pow(self.b1, t), tf.pow(self.b2, t)
        for var, m, v, g in zip(self.weights, self.m, self.v, grads):
            if self.weight_decay:  # decoupled, before the step, as keras.optimizers.AdamW
                var.assign_sub(var * (self.weight_decay * lr))
            handle = getattr(var, "value", var).handle  # keras.Variable wraps a tf.Variable
            tf.raw_ops.ResourceApplyAdam(
                var=handle, m=m.handle, v=v.handle, beta1_power=b1_power,
                beta2_power=b2_power, lr=lr, beta1=self.b1, beta2=self.b2,
                epsilon=self.eps, grad=g, use_locking=False)


class KerasOptimizer:
    """A `keras.optimizers` optimiser behind `Adam`'s interface; built now (its slots on the
    current device)."""

    def __init__(self, optimizer, variables):
        self.optimizer, self.weights = optimizer, list(variables)
        optimizer.build(self.weights)

    @property
    def variables(self) -> list:
        """The optimiser's state (step counter, slots, learning rate)."""
        return list(self.optimizer.variables)

    def scale_loss(self, loss):
        """The loss the gradients are taken of: `loss` itself (no loss scaling)."""
        return loss

    def apply(self, grads) -> None:
        """Apply one update with `grads` (same order as the variables)."""
        self.optimizer.apply(grads, self.weights)


def check_optimizer(name: str, params: dict[str, Any]) -> None:
    """Check an optimiser name and its parameters without building it (Keras is imported
    only for a name other than the fused `adam`).

    Raises:
        UsageError: an unknown name or a parameter it does not take.
    """
    if name == "adam" and set(params) <= set(FUSED_ADAM_PARAMS):
        return
    import keras

    from ensemble.core.errors import UsageError

    try:
        keras.optimizers.get({"class_name": name, "config": {"learning_rate": 1e-3, **params}})
    except (ValueError, TypeError) as exc:
        raise UsageError(f"Cannot make optimizer {name!r} with {params}: "
                         f"{str(exc).splitlines()[0][:200]}; expected a keras.optimizers name "
                         "(adam, sgd, adamw, rmsprop, ...) and its keyword arguments in "
                         "[training.optimizer_params].") from None


def build_optimizer(model, learning_rate: float, name: str = "adam",
                    params: dict[str, Any] | None = None, schedule: str = "constant",
                    total_steps: int | None = None, precision: str = "float32"):
    """The optimiser of `model.trainable_variables`, its state created now (on the current
    device); under `precision` `mixed_float16`, with dynamic loss scaling
    (`precision.LossScaled`).

    Args:
        name: `adam` (fused; `params` among beta_1, beta_2, epsilon, weight_decay) or a
            `keras.optimizers`
            name; `params` are its keyword arguments.
        schedule: `constant` or `cosine` (decay to 0 over `total_steps` updates).
        precision: `training.precision`; `mixed_float16` wraps the optimiser in
            `precision.LossScaled`.

    Raises:
        UsageError: an unknown optimiser name or a parameter it does not take (names both).
    """
    from ensemble.core.errors import UsageError

    params = dict(params or {})
    steps = total_steps if schedule == "cosine" else None
    if name == "adam" and set(params) <= set(FUSED_ADAM_PARAMS):
        return _scaled(Adam(model.trainable_variables, learning_rate, total_steps=steps,
                            **params), precision)
    import keras

    lr = (keras.optimizers.schedules.CosineDecay(learning_rate, steps) if steps
          else learning_rate)
    try:
        opt = keras.optimizers.get({"class_name": name,
                                    "config": {"learning_rate": lr, **params}})
    except (ValueError, TypeError) as exc:
        raise UsageError(f"Cannot make optimizer {name!r} with {params}: "
                         f"{str(exc).splitlines()[0][:200]}; expected a keras.optimizers name "
                         "(adam, sgd, adamw, rmsprop, ...) and its keyword arguments in "
                         "[training.optimizer_params].") from None
    return _scaled(KerasOptimizer(opt, model.trainable_variables), precision)


def _scaled(optimizer, precision: str):
    """`optimizer` with loss scaling when `precision` computes in float16."""
    if precision != "mixed_float16":
        return optimizer
    from ensemble.models.precision import LossScaled

    return LossScaled(optimizer)
