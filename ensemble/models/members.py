"""Ensemble members: seeds, batch order, building a member from its builder, saving/loading.

A member's initialisation and batch order depend only on `(run seed, member index)`, never on
the mode, the member count or the device. A member is its builder's network (logits) with the
task's head on top, built under the member's device. Its optimiser is in `ensemble.models.optimizer`,
the one training step and the epoch loop in `ensemble.replication.training`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import numpy as np

from ensemble.models import builders
from ensemble.core.errors import UsageError
from ensemble.core.manifest import Manifest


def member_seed(run_seed: int, index: int) -> int:
    """The seed of member `index`: a 31-bit integer from `SeedSequence([run_seed, index])`."""
    return int(np.random.SeedSequence([run_seed, index]).generate_state(1)[0] >> 1)


def batch_order(run_seed: int, index: int, epoch: int, n_rows: int) -> np.ndarray:
    """Row order of member `index` in `epoch`: a permutation of `range(n_rows)`, int32."""
    rng = np.random.default_rng([run_seed, index, epoch])
    return rng.permutation(n_rows).astype(np.int32)


def build_network(spec: str, params: dict[str, Any], input_shape: Sequence[int],
                  n_outputs: int, seed: int):
    """Call builder `spec` with `params` and check what it returns.

    Keras's global seeds (`keras.utils.set_random_seed(seed)`: Python, numpy, TensorFlow and
    Keras's default seed generator) are set first, so a builder whose layers take no explicit
    seed still gives the same network in every process, mode and member count.

    Returns:
        The builder's `keras.Model`, `[batch, *input_shape] -> [batch, n_outputs]` logits.

    Raises:
        UsageError: the builder raises (its message kept; `SystemExit` and any other
            `BaseException` but `KeyboardInterrupt` too), returns no Keras model, returns the
            wrong output shape or dtype (not float), or a softmax output (logits expected), or holds a `Lambda` layer.
    """
    import keras

    fn = builders.resolve(spec)
    keras.utils.set_random_seed(seed)
    try:
        net = fn(tuple(int(d) for d in input_shape), int(n_outputs), seed=int(seed), **params)
    except (UsageError, KeyboardInterrupt):
        raise
    except BaseException as exc:  # the user's code (sys.exit too): its message, one line
        raise UsageError(f"Builder {spec!r} raised {type(exc).__name__}: "
                         f"{builders._first_line(exc)}") from None
    if not isinstance(net, keras.Model):
        raise UsageError(f"Builder {spec!r} returned {type(net).__name__}; expected a "
                         "keras.Model mapping [batch, *input_shape] to [batch, n_outputs] logits.")
    try:
        out = net(keras.Input(tuple(input_shape)))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise UsageError(f"Builder {spec!r}: its model cannot take inputs of shape "
                         f"[batch, {', '.join(map(str, input_shape))}]: "
                         f"{builders._first_line(exc)}") from None
    if isinstance(out, (list, tuple, dict)) or tuple(out.shape[1:]) != (n_outputs,):
        got = f"{len(out)} outputs" if isinstance(out, (list, tuple, dict)) else \
            f"output [batch, {', '.join(str(d) for d in out.shape[1:])}]"
        raise UsageError(f"Builder {spec!r} returned a model with {got}; expected one "
                         f"output, [batch, {n_outputs}] logits.")
    if not keras.backend.is_float_dtype(out.dtype):
        raise UsageError(f"Builder {spec!r} returned a model with {out.dtype} outputs; expected "
                         "float logits (cast the last layer's output to float32).")
    layers = _all_layers(net)
    lam = [layer.name for layer in layers if isinstance(layer, keras.layers.Lambda)]
    if lam:
        raise UsageError(f"Builder {spec!r}: layer {lam[0]!r} is a Lambda layer, which saved "
                         "members refuse to load (safe_mode); write it as a layer class "
                         "decorated with keras.saving.register_keras_serializable().")
    if _ends_in_softmax(net, layers):
        raise UsageError(f"Builder {spec!r} ends in a softmax; a builder returns logits (the "
                         "task adds the head): drop the final softmax activation.")
    if getattr(net, "compiled", False):
        _forget_compile(net)
    return net


def _forget_compile(net) -> None:
    """Drop what the builder's `net.compile(...)` attached (members train with the task's loss
    and the `[training]` optimiser): saved with the member, its never-built optimiser made
    Keras warn "Skipping variable loading for optimizer" at every load of the member.
    `compiled_by_builder(net)` remembers it for the notice (`cost.member_flops`)."""
    net.optimizer = None
    for name in ("loss", "_compile_loss", "_compile_metrics", "_compile_config"):
        if hasattr(net, name):
            setattr(net, name, None)
    net.compiled = False
    object.__setattr__(net, "_ensemble_compiled_by_builder", True)  # past Keras's tracking


def compiled_by_builder(net) -> bool:
    """Whether the builder compiled network `net` (`build_network` undid it)."""
    return bool(getattr(net, "_ensemble_compiled_by_builder", False))


def _all_layers(model) -> list:
    out = []
    for layer in model.layers:
        out.append(layer)
        if hasattr(layer, "layers"):
            out.extend(_all_layers(layer))
    return out


def _ends_in_softmax(net, layers) -> bool:
    import keras

    last = layers[-1] if layers else None
    if isinstance(last, keras.layers.Softmax):
        return True
    act = getattr(last, "activation", None)
    return getattr(act, "__name__", None) == "softmax" or act is keras.activations.softmax


def build_member(spec: str, params: dict[str, Any], input_shape: Sequence[int],
                 n_outputs: int, seed: int, name: str, task, scaling=None,
                 precision: str = "float32"):
    """A member: builder `spec`'s network (`build_network`) with `task`'s head, as one Keras
    model `[batch, *input_shape] -> ` the task's outputs (classification: `[batch,
    n_classes]` probabilities). `scaling` (a Keras layer, the input's preprocessing's
    `scaling_layer()`) comes first when given, so the member takes raw rows (image pixels;
    a table's index columns, embedded by its `CategoryEmbedding`, seeded by the member's
    `seed`). A builder whose signature names `embedded` gets the rows with their index
    columns instead, and `embedded` (`CategoryEmbedding.embedded`: one dict per index column,
    `column`, `position`, `n_indices`, `width`), and embeds them itself.

    The network is built under the Keras dtype policy `precision` (`training.precision`,
    `ensemble.models.precision`: float32 variables, computation in the lower type), the
    scaling and the head under float32: the head casts the logits to float32, so the member's
    outputs and the loss are float32 in every precision.

    Call it under `tf.device(...)` so its variables live on the member's device.

    Raises:
        UsageError: see `build_network`.
    """
    import keras

    from ensemble.models.precision import dtype_policy

    embedded = getattr(scaling, "embedded", None)  # a table's `CategoryEmbedding`
    if embedded:
        scaling = scaling.for_member((seed + EMBEDDING_SALT) % 2 ** 31)
    with dtype_policy(precision):
        if builders.takes_embedded(spec):  # the builder embeds the index columns itself
            net = build_network(spec, {**params,
                                       "embedded": scaling.embedded if embedded else []},
                                input_shape, n_outputs, seed)
            scaling = None if embedded else scaling
        else:  # the builder takes the rows as the first layer gives them
            net = build_network(spec, params, scaling.compute_output_shape(
                (None, *input_shape))[1:] if embedded else input_shape, n_outputs, seed)
    inputs = keras.Input(tuple(input_shape), name="features")
    x = scaling(inputs) if scaling is not None else inputs
    model = keras.Model(inputs, task.head(net(x)), name=name)
    # the member's own stand-in for Keras's global seed generator (`member_rng`); set past
    # Keras's attribute tracking, so the member's weights and saved file do not change
    object.__setattr__(model, "_ensemble_rng",
                       keras.random.SeedGenerator(seed=(int(seed) * 2654435761 + RNG_SALT)
                                                  % 2 ** 31))
    return model


EMBEDDING_SALT = 30_011  # the member's entity embeddings' seed: `seed + EMBEDDING_SALT`
RNG_SALT = 0x5EED  # keeps the member's global-generator seed apart from its builder's seed


@contextlib.contextmanager
def member_rng(model):
    """Within the block, Keras's global seed generator (what `keras.random.*` draws from when
    a layer passes no `seed`) is the member's own (made by `build_member` from its seed):
    traced there, each member of one graph draws from its own stream, as it would alone in a
    client process. One shared generator would give in-graph members that depend on the
    member count and the order of tracing. The replicas of a data-parallel member share its
    generator, so its stream depends on the replica count as its batches' split does; calls
    at prediction time are not wrapped (a layer that draws there, MC dropout, draws from
    Keras's). Members not made by `build_member` (loaded from a file) keep Keras's."""
    gen = getattr(model, "_ensemble_rng", None)
    try:
        from keras.src.backend.common import global_state
        from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR
    except ImportError:  # another Keras layout: Keras's own generator
        gen = None
    if gen is None:
        yield
        return
    before = global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)
    global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, gen)
    try:
        yield
    finally:
        global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, before)


def check_serializable(model, spec: str) -> None:
    """Save `model` and load it back with `safe_mode=True`, as every saved member will be.

    Raises:
        UsageError: a layer that cannot be saved or loaded safely (a custom layer without
            `keras.saving.register_keras_serializable`, say); names the error.
    """
    import tempfile
    from pathlib import Path

    import keras

    with tempfile.TemporaryDirectory(prefix="ensemble-check-") as tmp:
        path = Path(tmp) / "member.keras"
        try:
            model.save(path)
            keras.saving.load_model(path, safe_mode=True, compile=False)
        except Exception as exc:
            raise UsageError(f"Builder {spec!r}: its model cannot be saved and loaded safely "
                             f"({type(exc).__name__}: {builders._first_line(exc)}); register "
                             "custom layers with keras.saving.register_keras_serializable() "
                             "and give them get_config().") from None


def save_member(model, path) -> None:
    """Save a member atomically in the Keras 3 format (`.keras`)."""
    from ensemble.core.artifacts import atomic_path

    with atomic_path(path, suffix=".keras") as tmp:
        model.save(tmp)


def import_builder(manifest: Manifest, index: int) -> None:
    """Import member `index`'s builder module, as its saved model may need the custom layers
    the module registers (`keras.saving.register_keras_serializable`). Best effort: a builder
    that no longer imports leaves the load to say which layer is unknown.

    Raises:
        UsageError: its source file's sha256 differs from the manifest's
            (`builder_files.check_builder`), or the manifest records none for a file it
            names: it is not imported. Code whose sha256 the manifest does not record is
            never imported.
    """
    from ensemble.models.builder_files import check_builder

    spec = (manifest.member(index).hparams or {}).get("builder")
    if spec and spec not in builders.BUILTINS:  # never import a changed file (runs.preflight)
        recorded = manifest.builder_sha256(spec)
        found = builders.builder_file(spec)
        if recorded is None and found is not None:  # code nobody vouched for: not run
            raise UsageError(f"Member {index}'s builder {spec!r} names the file "
                             f"{str(found)!r}, whose sha256 the manifest does not record; it "
                             "is not imported (a file added to the run, or an edited manifest).")
        if recorded is None:  # no file to vouch for: nothing is imported (the load says
            return  # which custom layer it misses, if any)
        check_builder(spec, recorded)
    if spec and spec not in builders.BUILTINS and builders.importable(spec):
        try:
            builders.resolve(spec)
        except UsageError:
            pass


def load_run_member(run_dir, manifest: Manifest, index: int, device: str | None):
    """Member `index` of a run: its file verified against the manifest's sha256
    (`artifacts.verify`), its builder imported (`import_builder`), loaded by `load_member`.

    Raises:
        UsageError: a missing, changed or unloadable file.
    """
    from ensemble.core import artifacts

    path = artifacts.verify(run_dir, manifest, artifacts.member_model_path(run_dir, index))
    import_builder(manifest, index)
    model = load_member(path, device)
    with artifacts.opened(path, "member file"):
        check_member_shape(model, manifest)
    return model


def check_member_shape(model, manifest: Manifest) -> None:
    """Refuse a member whose input shape is not the run's (`dataset.input_shape`), or whose
    output width is not its number of classes (a run with classes): a file from another run.

    Raises:
        ValueError: names both shapes.
    """
    want = manifest.dataset.input_shape
    got = list(model.input_shape[1:]) if not isinstance(model.input_shape, list) else None
    if want is not None and got is not None and [int(d) if d is not None else None
                                                 for d in got] != list(want):
        raise ValueError(f"it takes inputs of shape {got}; the run's members take {want}")
    classes = manifest.dataset.classes  # a run with classes: one output per class
    width = model.output_shape[-1] if not isinstance(model.output_shape, list) else None
    if classes and width is not None and width != len(classes):
        raise ValueError(f"it outputs {width} values per row; the run has {len(classes)} "
                         "classes")


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

    import ensemble.tasks.regression.tf_ops  # noqa: F401 (registers the regression head's layer)
    import ensemble.models.layers  # noqa: F401 (registers the built-in builders' layers)
    import ensemble.data.embedding  # noqa: F401 (registers the tables' entity embeddings)

    if not Path(path).is_file():
        raise UsageError(f"Member model not found: {path}")
    try:
        with tf.device(device) if device is not None else contextlib.nullcontext():
            return keras.saving.load_model(path, safe_mode=True, compile=False)
    except Exception as exc:  # Keras raises ValueError/TypeError/OSError for bad files
        raise UsageError(f"Cannot load member model {path} safely: "
                         f"{str(exc).splitlines()[0][:300]}") from None
