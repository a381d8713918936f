"""Keras layers of the built-in builders, registered so saved members load with `safe_mode`.

`PeriodicEmbedding`: the "PLR (lite)" embedding of numeric features of Gorishniy, Rubachev and
Babenko, "On Embeddings for Numerical Features in Tabular Deep Learning" (NeurIPS 2022), as TabM
(Gorishniy et al. 2024) and RealMLP (Holzmueller et al. 2024, its "PBLD" variant) use it in
front of an MLP: each scalar feature `x_j` becomes `ReLU(W [sin(2 pi c_j x_j), cos(2 pi c_j
x_j)] + b)`, with `k` trainable frequencies `c_j` per feature (initialised from
`N(0, sigma^2)`) and one linear map `W` `[2k, d]` shared by all features ("lite").
"""

from __future__ import annotations

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="ensemble")
class PeriodicEmbedding(keras.layers.Layer):
    """`[batch, n_features]` -> `[batch, n_features * d_embedding]` (see the module docstring).

    Args:
        n_frequencies: `k`, frequencies per feature.
        d_embedding: `d`, width of each feature's embedding.
        sigma: standard deviation of the frequencies' initialisation (TabM's
            `frequency_init_scale`; inputs are standardised, so ~0.1 is smooth).
        seed: seed of both initialisers (frequencies: `seed`, the linear map: `seed + 1`).
    """

    def __init__(self, n_frequencies: int = 16, d_embedding: int = 8, sigma: float = 0.1,
                 seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.n_frequencies, self.d_embedding = int(n_frequencies), int(d_embedding)
        self.sigma, self.seed = float(sigma), int(seed)

    def build(self, input_shape):
        n_features = int(input_shape[-1])
        self.frequencies = self.add_weight(
            name="frequencies", shape=(n_features, self.n_frequencies),
            initializer=keras.initializers.RandomNormal(stddev=self.sigma, seed=self.seed))
        self.kernel = self.add_weight(
            name="kernel", shape=(2 * self.n_frequencies, self.d_embedding),
            initializer=keras.initializers.GlorotUniform(seed=self.seed + 1))
        self.bias = self.add_weight(name="bias", shape=(self.d_embedding,),
                                    initializer="zeros")

    def call(self, x):
        v = (2 * math.pi) * ops.expand_dims(x, -1) * self.frequencies  # [batch, f, k]
        v = ops.concatenate([ops.sin(v), ops.cos(v)], axis=-1)  # [batch, f, 2k]
        e = ops.relu(ops.einsum("bfi,id->bfd", v, self.kernel) + self.bias)
        return ops.reshape(e, (-1, e.shape[1] * self.d_embedding))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], int(input_shape[-1]) * self.d_embedding)

    def get_config(self):
        return {**super().get_config(), "n_frequencies": self.n_frequencies,
                "d_embedding": self.d_embedding, "sigma": self.sigma, "seed": self.seed}
