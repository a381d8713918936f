"""Mixed precision of the members: Keras dtype policies, loss scaling, the CPU's bfloat16 support.

`training.precision` names a Keras dtype policy (`keras.mixed_precision`, Micikevicius et al.
2018, "Mixed Precision Training"): `float32`, or `mixed_bfloat16` / `mixed_float16`, under which
a member's builder network keeps its variables (and so the optimiser's state) in float32 and
computes in the lower type; the task's head is built under float32, so the logits are cast to
float32 and the loss and the member's outputs are float32 in every precision. The policy is
stored in every layer's config of the saved member, so predict, export and serve rebuild the
member exactly as it trained.

It pays where the hardware multiplies the lower type faster: CPUs with AMX or AVX-512 BF16
(oneDNN's kernels; `cpu_support` reads the flags), GPUs with tensor cores (float16 from
compute capability 7.0, bfloat16 from 8.0). Elsewhere TensorFlow emulates it, slower than
float32.

A process that trains in a mixed precision takes its oneDNN tensors from the system allocator
(`TF_ONEDNN_USE_SYSTEM_ALLOCATOR`, `use_system_allocator`) rather than TensorFlow's pooled one:
`mixed_bfloat16` training of `wide` ran 5-8% faster that way, float32 no faster
(docs/benchmarks.md), so float32 runs keep the pool.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
# /proc/cpuinfo flags of a CPU that multiplies the lower type in hardware
CPU_FLAGS = {"mixed_bfloat16": ("amx_bf16", "avx512_bf16"),
             "mixed_float16": ("amx_fp16", "avx512_fp16")}
INITIAL_LOSS_SCALE = 2.0 ** 15  # keras.optimizers.LossScaleOptimizer's defaults
GROWTH_STEPS = 2000


SYSTEM_ALLOCATOR = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"  # read by TensorFlow at its first allocation


def use_system_allocator(precision: str) -> None:
    """For a mixed `precision`, set `TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1` in this process's
    environment unless it is set already (see the module docstring). TensorFlow reads it
    once, at its first tensor allocation: call before TensorFlow computes anything."""
    if precision != "float32":
        os.environ.setdefault(SYSTEM_ALLOCATOR, "1")


@contextlib.contextmanager
def dtype_policy(precision: str):
    """Within the block, Keras's global dtype policy is `precision` (one of `PRECISIONS`):
    the layers built there take it (a builder's layers that name no `dtype`)."""
    import keras

    before = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.mixed_precision.set_dtype_policy(before)


def cpu_support(precision: str, cpuinfo: str | Path = "/proc/cpuinfo") -> list[str] | None:
    """The flags of `cpuinfo` among `CPU_FLAGS[precision]` (`[]`: none, the lower type is
    emulated), or None when the file cannot be read (another OS) or `precision` is float32."""
    if precision not in CPU_FLAGS:
        return None
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return [f for f in CPU_FLAGS[precision] if f in flags]


def check_hardware(precision: str, gpu: bool, cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """The notice for a run in `precision` that this machine would train slower than in
    float32: a mixed precision without a GPU (`gpu`: one may be present) on a CPU whose
    `cpuinfo` flags lack the lower type's instructions; None when it pays or cannot be
    told."""
    flags = None if gpu else cpu_support(precision, cpuinfo)
    if flags is None or flags:
        return None
    return (f"training.precision = {precision} on a CPU without "
            f"{' or '.join(CPU_FLAGS[precision])} (the flags of /proc/cpuinfo) and no GPU: "
            "TensorFlow emulates the lower type there, slower than float32; use float32 on "
            "this machine.")


class LossScaled:
    """Dynamic loss scaling around an optimiser of `ensemble.models.optimizer` (the rule of
    `keras.optimizers.LossScaleOptimizer`): the gradients are taken of the loss times
    `scale` (float32, starting at 2^15), divided by it before the update; a step whose
    gradients are not all finite is skipped and halves `scale`, and every `GROWTH_STEPS`
    finite steps in a row double it. Used with `mixed_float16`, whose small gradients would
    underflow float16 unscaled.

    Create it under `tf.device` of the member, like the optimiser it wraps.
    """

    def __init__(self, inner, initial_scale: float = INITIAL_LOSS_SCALE,
                 growth_steps: int = GROWTH_STEPS):
        import tensorflow as tf

        self.inner, self.growth_steps = inner, int(growth_steps)
        self.scale = tf.Variable(float(initial_scale), dtype=tf.float32, trainable=False,
                                 name="loss_scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                      name="loss_scale_good_steps")

    @property
    def variables(self) -> list:
        """The scale, its counter of finite steps, then the wrapped optimiser's state."""
        return [self.scale, self.good_steps, *self.inner.variables]

    def scale_loss(self, loss):
        """`loss x scale`: what the gradients are taken of (inside the tape)."""
        return loss * self.scale

    def apply(self, grads) -> None:
        """Unscale `grads` (same order as the variables) and apply them when all are finite;
        update the scale."""
        import tensorflow as tf

        grads = [g / self.scale for g in grads]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])

        def step():
            self.inner.apply(grads)
            grown = self.good_steps + 1 >= self.growth_steps
            with tf.control_dependencies([self.scale.assign(
                    tf.where(grown, self.scale * 2.0, self.scale))]):
                return tf.identity(self.good_steps.assign(
                    tf.where(grown, tf.constant(0, tf.int64), self.good_steps + 1)))

        def skip():
            with tf.control_dependencies([self.scale.assign(self.scale * 0.5)]):
                return tf.identity(self.good_steps.assign(0))

        tf.cond(finite, step, skip)
