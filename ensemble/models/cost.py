"""What a member costs: FLOPs per row of its forward pass, counted from the built model.

Own code, not TensorFlow's profiler: the profiler also counts element-wise ops and prints its
own report; placement and the benchmark want the multiply-adds of the matrix products and
convolutions that dominate a member's work, `2 * (multiply-adds)` per row, read from the
traced graph of one row so that any builder's network is counted the same way.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def mlp_flops(n_features: int, hidden: Sequence[int], n_classes: int, embedding: str = "none",
              n_frequencies: int = 16, d_embedding: int = 8) -> int:
    """FLOPs of one row through the built-in MLP (`ensemble.models.builtin.mlp`): its dense
    layers, `2 * sum(w_in * w_out)` (a multiply and an add per weight; biases and activations
    left out), and with `embedding = "periodic"` the embedding's per-feature product of the
    `2 * n_frequencies` sines and cosines with its `[2 * n_frequencies, d_embedding]` kernel,
    `2 * n_features * 2 * n_frequencies * d_embedding`, after which the first dense layer
    reads `n_features * d_embedding` values."""
    first, embed = n_features, 0
    if embedding == "periodic":
        first = n_features * d_embedding
        embed = 2 * n_features * (2 * n_frequencies) * d_embedding
    widths = [first, *hidden, n_classes]
    return int(embed + sum(2 * a * b for a, b in zip(widths, widths[1:])))


def _dims(tensor) -> list[int]:
    return [int(d) if d is not None else 1 for d in tensor.shape]


def _op_flops(op) -> int:
    kind = op.type
    if kind in ("MatMul", "BatchMatMulV2", "BatchMatMulV3"):
        a = _dims(op.inputs[0])
        transposed = op.get_attr("transpose_a") if kind == "MatMul" else op.get_attr("adj_x")
        k = a[-2] if transposed else a[-1]
        return 2 * k * int(np.prod(_dims(op.outputs[0])))
    if kind in ("Conv2D", "Conv3D"):
        kernel = _dims(op.inputs[1])  # [*spatial, c_in, c_out]
        return 2 * int(np.prod(kernel[:-1])) * int(np.prod(_dims(op.outputs[0])))
    if kind == "DepthwiseConv2dNative":
        kernel = _dims(op.inputs[1])  # [h, w, c_in, multiplier]
        return 2 * int(np.prod(kernel[:-2])) * int(np.prod(_dims(op.outputs[0])))
    if kind == "Conv2DBackpropInput":  # transposed convolution
        kernel = _dims(op.inputs[1])  # [h, w, c_out, c_in]
        return 2 * int(np.prod(kernel[:-2])) * kernel[-1] * int(np.prod(_dims(op.outputs[0])))
    return 0


def count_flops(model, input_shape: Sequence[int]) -> int:
    """FLOPs of one row through `model`: `2 x` the multiply-adds of its matrix products and
    convolutions (biases, activations and normalisations left out, as in `mlp_flops`),
    read from the graph of `model` traced on a `[1, *input_shape]` float32 input."""
    import tensorflow as tf

    fn = tf.function(lambda x: model(x, training=False), autograph=False)
    graph = fn.get_concrete_function(tf.TensorSpec([1, *input_shape], tf.float32)).graph

    def walk(g) -> int:
        total = 0
        for op in g.get_operations():
            total += _op_flops(op)
            for name in ("then_branch", "else_branch", "body", "f"):
                try:
                    fn_name = op.get_attr(name).name
                except (ValueError, AttributeError):
                    continue
                sub = g._functions.get(fn_name) if hasattr(g, "_functions") else None
                if sub is not None and hasattr(sub, "graph"):
                    total += walk(sub.graph)
        return total

    return int(walk(graph))


def member_flops(spec: str, params: dict[str, Any], input_shape: Sequence[int],
                 n_outputs: int, task, seed: int = 0, scaling=None) -> int:
    """FLOPs per row of a member of builder `spec` with `params`: `count_flops` of a fresh
    build on the CPU, which also checks the builder (`members.build_network`) and, for a
    user's builder, that its model saves and loads safely (`members.check_serializable`).
    The built-in MLP on a flat input is counted by its formula (`mlp_flops`, equal
    to `count_flops` of it), so a process that only places members need not load
    TensorFlow.

    Raises:
        UsageError: a bad builder.
    """
    import inspect

    from ensemble.models.builders import BUILTINS

    if spec == "mlp" and len(input_shape) == 1:
        defaults = inspect.signature(BUILTINS["mlp"]).parameters.items()
        p = {k: a.default for k, a in defaults if a.default is not a.empty} | dict(params)
        return mlp_flops(int(input_shape[0]), list(p["hidden"]), n_outputs, p["embedding"],
                         p["n_frequencies"], p["d_embedding"])
    from ensemble.core.tfimport import import_tensorflow_quietly

    import_tensorflow_quietly()  # maybe first here (a between-graph launcher): no banners
    import tensorflow as tf

    from ensemble.models.members import build_member, check_serializable

    with tf.device("/device:CPU:0"):
        model = build_member(spec, params, input_shape, n_outputs, seed, "check", task,
                             scaling() if scaling is not None else None)
        if spec not in BUILTINS:
            check_serializable(model, spec)
            _say_if_compiled(model, spec)
        return count_flops(model, input_shape)


def _say_if_compiled(model, spec: str) -> None:
    """A notice when builder `spec` compiled its network (`model`'s sub-model): the members
    train with the task's loss and the `[training]` optimiser, never the builder's."""
    import keras

    from ensemble.core.notices import notice
    from ensemble.models.members import compiled_by_builder

    net = next((layer for layer in model.layers if isinstance(layer, keras.Model)), None)
    if net is not None and compiled_by_builder(net):
        notice(f"builder {spec!r} compiled its model; its optimizer, loss and metrics are not "
               "used: members train with the task's loss and the [training] optimizer "
               "(training.optimizer, training.learning_rate).", once=True)


def member_costs(hparams: Sequence[dict[str, Any]], input_shape: Sequence[int],
                 n_outputs: int, task, scaling=None) -> list[int]:
    """FLOPs per row of every member (`member_flops`), `hparams` `[n_members]` as
    `config.member_hparams` gives them; each distinct builder and params built once.
    `scaling`: the preprocessing's `scaling_layer` (called only when a member is built: a
    table's entity embeddings, `members.build_member`).

    Raises:
        UsageError: a bad builder.
    """
    import json

    done: dict[str, int] = {}
    out = []
    for h in hparams:
        key = json.dumps([h["builder"], h["params"]], sort_keys=True)
        if key not in done:
            done[key] = member_flops(h["builder"], h["params"], input_shape, n_outputs, task,
                                     scaling=scaling)
        out.append(done[key])
    return out
