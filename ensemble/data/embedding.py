"""Entity embeddings of a table's high-cardinality categorical columns: the members' first layer.

A categorical column with more training categories than `data.embed_above` reaches the
members as one input column holding an integer index (`Preprocessing`: `0` the
out-of-vocabulary index of a category never seen in the training rows, `1` the infrequent
index shared by the categories seen fewer than `data.min_frequency` times, `2 + k` the k-th
category of the column's vocabulary); `CategoryEmbedding` maps each index to a learned vector
(`keras.layers.Embedding`, Guo and Berkhahn 2016, "Entity Embeddings of Categorical
Variables"), the out-of-vocabulary index to the zero vector. The embedding's width follows
fastai's rule (`tabular.model.emb_sz_rule`): `min(600, round(1.6 * n ** 0.56))` for `n`
indices.

The layer is imported by `Preprocessing.scaling_layer` and when a member is loaded; Keras is
imported at the top of this module, so nothing imports it before TensorFlow is wanted.
"""

from __future__ import annotations

import keras
from keras import ops


def width(n_indices: int) -> int:
    """The embedding width of a column with `n_indices` indices (vocabulary, infrequent and
    out-of-vocabulary): fastai's `min(600, round(1.6 * n_indices ** 0.56))`."""
    return int(min(600, round(1.6 * n_indices ** 0.56)))


@keras.saving.register_keras_serializable(package="ensemble")
class CategoryEmbedding(keras.layers.Layer):
    """`[batch, n_dense + n_embedded]` -> `[batch, n_dense + sum(widths)]`: the first
    `n_dense` columns (numeric and one-hot, standardised) as they are, then each index column
    `j` (float32 holding an integer in `0..n_indices[j] - 1`) as its embedding of `widths[j]`
    values (zeros for index 0, the out-of-vocabulary index).

    Args:
        n_dense: the input columns passed through.
        n_indices: indices per embedded column (its vocabulary plus 2).
        widths: each embedded column's width (`width(n)` by default).
        columns: the embedded columns' names (the layers' names and the builder contract).
        seed: seed of the embeddings' initialisers (column `j`: `seed + j`), the member's.
    """

    def __init__(self, n_dense: int, n_indices, widths=None, columns=None, seed: int = 0,
                 **kwargs):
        kwargs["autocast"] = False  # indices stay float32 (exact): bfloat16 rounds past 256
        super().__init__(**kwargs)
        self.n_dense, self.n_indices = int(n_dense), [int(n) for n in n_indices]
        self.widths = [int(w) for w in widths] if widths else [width(n) for n in self.n_indices]
        self.columns = [str(c) for c in columns] if columns else [
            f"column_{j}" for j in range(len(self.n_indices))]
        self.seed = int(seed)
        self.tables = [keras.layers.Embedding(
            n, w, name=f"embedding_{j}",
            embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05,
                                                                    seed=self.seed + j))
            for j, (n, w) in enumerate(zip(self.n_indices, self.widths))]

    @property
    def embedded(self) -> list[dict]:
        """The builder contract's description of the index columns: one dict per embedded
        column, `{"column", "position", "n_indices", "width"}` (`position`: its column in
        the row)."""
        return [{"column": c, "position": self.n_dense + j, "n_indices": n, "width": w}
                for j, (c, n, w) in enumerate(zip(self.columns, self.n_indices, self.widths))]

    def for_member(self, seed: int) -> "CategoryEmbedding":
        """The same layer with the initialisers' seed of a member (`seed`)."""
        return type(self)(**{**self.get_config(), "seed": int(seed)})

    def build(self, input_shape):
        for table in self.tables:
            table.build((None,))

    def call(self, x):
        out = [ops.cast(x[:, :self.n_dense], self.compute_dtype)]
        for j, (table, n) in enumerate(zip(self.tables, self.n_indices)):
            index = ops.clip(ops.cast(ops.round(x[:, self.n_dense + j]), "int32"), 0, n - 1)
            known = ops.cast(ops.expand_dims(index > 0, -1), table.compute_dtype)
            out.append(table(index) * known)
        return ops.concatenate(out, axis=-1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.n_dense + sum(self.widths))

    def get_config(self):
        return {**super().get_config(), "n_dense": self.n_dense, "n_indices": self.n_indices,
                "widths": self.widths, "columns": self.columns, "seed": self.seed}
