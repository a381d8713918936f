"""The built-in builders, `mlp` and `cnn`, and the range checks of their parameters.

Both follow the builder signature of `ensemble.models.builders` (`build(input_shape, n_outputs,
*, seed, **params) -> keras.Model` of logits); Keras is imported inside each builder, so the
checks run before TensorFlow loads (`ensemble.config.schema`).
"""

from __future__ import annotations

from typing import Any, Sequence

from ensemble.core.errors import UsageError

ACTIVATIONS = ("relu", "tanh", "gelu", "elu", "sigmoid", "swish")
EMBEDDINGS = ("none", "periodic")  # the mlp's numeric feature embeddings


def mlp(input_shape: Sequence[int], n_outputs: int, *, seed: int,
        hidden: Sequence[int] = (256, 128), activation: str = "relu", dropout: float = 0.1,
        l2: float = 0.0, embedding: str = "none", n_frequencies: int = 16,
        d_embedding: int = 8, sigma: float = 0.1):
    """The built-in MLP: `[batch, *input_shape]` (flattened) [-> embedding] -> Dense(`hidden[i]`,
    `activation`) [+ Dropout(`dropout`)] ... -> Dense(`n_outputs`) logits.

    Every initialiser and dropout layer has its own seed derived from `seed`; with `l2 > 0`
    every Dense kernel carries `keras.regularizers.L2(l2)` (`l2 * sum(kernel**2)`, added to
    the training loss by `training.train_step`). `embedding = "periodic"` embeds each input
    feature first (`ensemble.models.layers.PeriodicEmbedding`: `n_frequencies`, `d_embedding`,
    `sigma`; Gorishniy et al. 2022, as TabM and RealMLP use it).
    """
    import keras

    reg = keras.regularizers.L2(l2) if l2 > 0 else None
    layers = [keras.Input(tuple(input_shape))]
    if len(input_shape) > 1:
        layers.append(keras.layers.Flatten(name="flatten"))
    if embedding == "periodic":
        from ensemble.models.layers import PeriodicEmbedding

        layers.append(PeriodicEmbedding(n_frequencies, d_embedding, sigma, seed=seed + 10_007,
                                        name="periodic_embedding"))
    for i, width in enumerate(hidden):
        layers.append(keras.layers.Dense(
            width, activation=activation, name=f"dense_{i}", kernel_regularizer=reg,
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 2 * i)))
        if dropout > 0:
            layers.append(keras.layers.Dropout(dropout, seed=seed + 2 * i + 1,
                                               name=f"dropout_{i}"))
    layers.append(keras.layers.Dense(
        n_outputs, name="logits", kernel_regularizer=reg,
        kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 2 * len(hidden))))
    return keras.Sequential(layers, name="mlp")


def cnn(input_shape: Sequence[int], n_outputs: int, *, seed: int,
        filters: Sequence[int] = (32, 64), kernel_size: int = 3, dense: int = 128,
        dropout: float = 0.25, scale: float = 1.0):
    """The built-in CNN for images: rows `input_shape` `[height, width]` (one channel) or
    `[height, width, channels]`, so inputs `[batch, *input_shape]`; per entry of
    `filters`, Conv2D(f, `kernel_size`, same padding, ReLU) -> MaxPooling2D(2) (while the
    image is at least 2 pixels high and wide); then Flatten -> Dropout(`dropout`) ->
    Dense(`dense`, ReLU) -> Dense(`n_outputs`) logits. `scale` multiplies the input first
    (inputs are standardised by the run's preprocessing, so 1.0 is the default).
    Rows of another rank (a table's `[n_features]`) raise UsageError (`check_image_rows`).
    """
    check_image_rows(input_shape)
    import keras

    init = lambda k: keras.initializers.GlorotUniform(seed=seed + k)  # noqa: E731
    x = inputs = keras.Input(tuple(input_shape))
    if len(input_shape) == 2:  # [h, w]: one channel
        x = keras.layers.Reshape((*input_shape, 1))(x)
    if scale != 1.0:
        x = keras.layers.Rescaling(scale)(x)
    h, w = input_shape[0], input_shape[1]
    for i, f in enumerate(filters):
        x = keras.layers.Conv2D(f, kernel_size, padding="same", activation="relu",
                                kernel_initializer=init(i), name=f"conv_{i}")(x)
        if h >= 2 and w >= 2:
            x = keras.layers.MaxPooling2D(2, name=f"pool_{i}")(x)
            h, w = h // 2, w // 2
    x = keras.layers.Flatten()(x)
    if dropout > 0:
        x = keras.layers.Dropout(dropout, seed=seed + 100)(x)
    x = keras.layers.Dense(dense, activation="relu", kernel_initializer=init(101))(x)
    out = keras.layers.Dense(n_outputs, kernel_initializer=init(102), name="logits")(x)
    return keras.Model(inputs, out, name="cnn")


def check_image_rows(input_shape: Sequence[int]) -> None:
    """Raises UsageError, naming the shape, unless rows are `[height, width]` or `[height,
    width, channels]` (every size >= 1): the ones the built-in `cnn` convolves."""
    shape = [int(d) for d in input_shape]
    if len(shape) not in (2, 3) or min(shape) < 1:
        raise UsageError(f"Builder 'cnn' needs rows shaped [height, width] or [height, width, "
                         f"channels] (images); received rows of shape {shape}. Use --model "
                         "mlp, or reshape x to images.")


def check_mlp_params(params: dict[str, Any], key: str) -> None:
    """Range checks of the built-in MLP's parameters (before TensorFlow loads).

    Raises:
        UsageError: a bad `hidden`, `activation`, `dropout` or `l2`; names `key`.
    """
    hidden = params.get("hidden", ())  # a list, as `[members] hidden`: one width is [64]
    if not isinstance(hidden, (list, tuple)) or not all(
            isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in hidden):
        raise UsageError(f"Expected `{key}.hidden` to be a list of positive layer widths "
                         f"(one layer: [64]). Received: {params.get('hidden')!r}")
    act = params.get("activation", "relu")
    if act not in ACTIVATIONS:
        raise UsageError(f"Expected `{key}.activation` to be one of {', '.join(ACTIVATIONS)}. "
                         f"Received: {act!r}")
    dropout = params.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
            or not 0.0 <= dropout < 1.0:
        raise UsageError(f"Expected `{key}.dropout` in [0, 1). Received: {dropout!r}")
    l2 = params.get("l2", 0.0)
    if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not l2 >= 0:
        raise UsageError(f"Expected `{key}.l2` to be >= 0. Received: {l2!r}")
    emb = params.get("embedding", "none")
    if emb not in EMBEDDINGS:
        raise UsageError(f"Expected `{key}.embedding` to be one of {', '.join(EMBEDDINGS)}. "
                         f"Received: {emb!r}")
    for name in ("n_frequencies", "d_embedding"):
        v = params.get(name, 1)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1024:
            raise UsageError(f"Expected `{key}.{name}` to be an integer in 1..1024. "
                             f"Received: {v!r}")
    sigma = params.get("sigma", 0.1)
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma > 0:
        raise UsageError(f"Expected `{key}.sigma` to be > 0. Received: {sigma!r}")


def check_cnn_params(params: dict[str, Any], key: str) -> None:
    """Range checks of the built-in CNN's parameters, before TensorFlow loads: each refusal
    names its `[model.params]` key (Keras's own refusals name none).

    Raises:
        UsageError: a bad `filters`, `kernel_size`, `dense`, `dropout` or `scale`; names `key`.
    """
    def positive(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    filters = params.get("filters", ())
    if not isinstance(filters, (list, tuple)) or not all(map(positive, filters)):
        raise UsageError(f"Expected `{key}.filters` to be a list of positive filter counts, "
                         f"one Conv2D each (e.g. [32, 64]). Received: {filters!r}")
    kernel = params.get("kernel_size", 1)
    if not (positive(kernel) or isinstance(kernel, (list, tuple)) and len(kernel) == 2
            and all(map(positive, kernel))):
        raise UsageError(f"Expected `{key}.kernel_size` to be a positive integer or [height, "
                         f"width]. Received: {kernel!r}")
    if not positive(params.get("dense", 1)):
        raise UsageError(f"Expected `{key}.dense` to be a positive integer. "
                         f"Received: {params['dense']!r}")
    dropout, scale = params.get("dropout", 0.0), params.get("scale", 1.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
            or not 0.0 <= dropout < 1.0:
        raise UsageError(f"Expected `{key}.dropout` in [0, 1). Received: {dropout!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise UsageError(f"Expected `{key}.scale` to be > 0. Received: {scale!r}")
