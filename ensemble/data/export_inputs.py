"""The inputs of an exported signature, per input kind (`ensemble.data.kinds.export_inputs`).

A table run takes `features` `[batch, n_features]` float32 raw columns (or, with categorical
columns, one named input per column: TF Serving's columnar `inputs`) and the graph imputes,
encodes and standardises them in float64 as `Preprocessing.transform`; an array run takes its
raw values `[batch, *input_shape]` (the members' first layer scales them). Bad values are
refused in the graph (`ensemble.data.export_graph`). TensorFlow is imported inside the
functions: this module is imported by `kinds` without it.
"""

from __future__ import annotations


def array_inputs(pre):
    """The export signature's input of an array run (`ArrayPreprocessing`): `features`
    `[batch, *input_shape]` raw values (pixels) go to the members as they are (their first
    layer scales them). Returns `(TensorSpec, function, doc)`."""
    import tensorflow as tf

    from ensemble.data import export_graph as G

    shape = list(pre.input_shape)
    doc = f"features: [batch, {', '.join(map(str, shape))}] float32, raw values (pixels)"

    def to_pixels(f):  # ensemble.data.arrays refuses NaN and inf at predict
        with tf.control_dependencies(G.refuse_missing(f, "features")
                                     + G.refuse_nonfinite(f, "features")):
            return tf.cast(f, tf.float32)

    return tf.TensorSpec([None, *shape], tf.float32, name="features"), to_pixels, doc


def table_inputs(pre):
    """The export signature's inputs of a table run (`Preprocessing`) and the graph from them
    to the members' input: `(TensorSpec or {name: TensorSpec}, function, doc)`. Rows
    `[batch, n_features]` are imputed and standardised in float64 as
    `Preprocessing.transform`; with categorical columns, one input per column
    (`_columnar_graph`)."""
    import tensorflow as tf

    from ensemble.data import export_graph as G

    names = list(pre.feature_names)
    mean, scale = tf.constant(pre.mean, tf.float64), tf.constant(pre.scale, tf.float64)
    fill = tf.constant(pre.fill, tf.float64) if len(pre.fill) else None
    if pre.categories:
        return _columnar_graph(pre, mean, scale, fill)

    def to_x(features):
        checks = G.refuse_nonfinite(features, "features", names)
        if fill is None:
            checks += G.refuse_missing(features, "features", names)
        with tf.control_dependencies(checks):
            x = tf.cast(features, tf.float64)
        if fill is not None:
            x = tf.where(tf.math.is_nan(x), fill, x)
        return _scaled(tf.cast((x - mean) / scale, tf.float32), pre, "features")

    doc = (f"features: [batch, {len(names)}] float32, raw (unscaled) columns in this order: "
           + ", ".join(names))
    return tf.TensorSpec([None, len(names)], tf.float32, name="features"), to_x, doc


def _scaled(z, pre, name: str | None):
    """`z` `[batch, n_outputs]` after the check that it fits float32 (`export_graph`)."""
    import tensorflow as tf

    from ensemble.data import export_graph as G

    with tf.control_dependencies(G.refuse_unfit(z, name, pre.output_names)):
        return tf.identity(z)


def input_names(columns) -> dict[str, str]:
    """Column -> signature input name: the column name with every character but ASCII
    letters, digits and `_` replaced by `_`, and `c` put before a name that does not start
    with a letter (`_<k>` added when two names would collide). TensorFlow would otherwise
    rename such arguments itself (`function_type.sanitize_arg_name`: `od280/od315` ->
    `od280_od315`, `1st` -> `arg_1st`), with a warning, and two names renamed alike
    (`len /`, `len %`) would collide there."""
    import re

    out, used = {}, set()
    for c in columns:
        name = re.sub(r"[^A-Za-z0-9_]", "_", str(c))
        if not re.match(r"[A-Za-z]", name):
            name = f"c{name}"
        base, k = name, 1
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        out[c] = name
    return out


def _index_table(vocabulary, rare):
    """The lookup of an embedded column's index, as `Preprocessing.indices`: a
    `tf.lookup.StaticHashTable` from string to float64 (`2 + k` for `vocabulary[k]`, `1` for
    a `rare` (infrequent) category, default `0`: out of vocabulary), whose cost does not grow
    with the categories. Made outside the traced signature; the exported module tracks it
    (`to_x.resources`)."""
    import tensorflow as tf

    keys = [*vocabulary, *rare] or [""]  # ("": missing, never a category: index 0)
    values = [2.0 + k for k in range(len(vocabulary))] + [1.0] * len(rare) or [0.0]
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string),
                                            tf.constant(values, tf.float64)), default_value=0.0)


def _columnar_graph(pre, mean, scale, fill):
    """One named input per original column (TF Serving's columnar `inputs`): numeric columns
    float32 `[batch]` (NaN where missing), categorical columns string `[batch]` (`""` where
    missing); imputation, one-hot encoding and standardisation as `Preprocessing.transform`
    (numbers in a categorical column in their canonical spelling, `G.canonical_numbers`; an
    unknown category is an all-zero block; an embedded column becomes its index, `_index_table`)."""
    import tensorflow as tf

    from ensemble.data import export_graph as G
    from ensemble.data.preprocessing import BOOL_WORDS, is_boolean

    key = input_names(pre.columns)
    specs = {key[n]: tf.TensorSpec([None], tf.float32, name=key[n]) for n in pre.feature_names}
    specs.update({key[c]: tf.TensorSpec([None], tf.string, name=key[c])
                  for c in pre.categories})

    tables = {c: _index_table(pre.categories[c], pre.rare.get(c, [])) for c in pre.embedded}

    def to_x(inputs):
        first = inputs[next(iter(specs))]
        checks = []
        for n in pre.feature_names:
            checks += G.refuse_nonfinite(inputs[key[n]], key[n])
            if fill is None:
                checks += G.refuse_missing(inputs[key[n]], key[n])
        checks += [c for n in pre.categories if n not in pre.category_fill
                   for c in G.refuse_empty(inputs[key[n]], key[n])]
        with tf.control_dependencies(checks):
            num = [tf.cast(inputs[key[n]], tf.float64) for n in pre.feature_names]
        x = tf.stack(num, axis=1) if num else tf.zeros([tf.shape(first)[0], 0], tf.float64)
        if fill is not None:
            x = tf.where(tf.math.is_nan(x), fill, x)
        blocks, index = [x], []
        for c in [*pre.one_hot, *pre.embedded]:
            cats, col = pre.categories[c], inputs[key[c]]
            if c in pre.category_fill:
                col = tf.where(tf.equal(col, ""), pre.category_fill[c], col)
            col = G.canonical_numbers(col)  # `1935.0`: `1935`, as training spelt it
            if is_boolean(cats):  # `True`, `1`: as `Preprocessing` matches them
                for word, spellings in BOOL_WORDS.items():
                    hit = tf.reduce_any(tf.equal(col[:, None], tf.constant(spellings)[None, :]),
                                        axis=1)
                    col = tf.where(hit, word, col)
            if c in pre.embedded:
                index.append(tables[c].lookup(col)[:, None])
                continue
            blocks.append(tf.cast(tf.equal(col[:, None], tf.constant(cats)[None, :]),
                                  tf.float64))
        return _scaled(tf.cast((tf.concat(blocks + index, axis=1) - mean) / scale,
                               tf.float32), pre, None)

    to_x.resources = list(tables.values())  # the lookups, for the module to track
    doc = ("one input per column: " + ", ".join(
        f"{key[n]} float32 [batch]" for n in pre.feature_names) + ", " + ", ".join(
        f"{key[c]} string [batch]" for c in pre.categories))
    return specs, to_x, doc
