"""Tasks: what a member's logits mean (the head), the training loss and the validation scores.

A builder returns logits `[batch, n_outputs]`; the task says how many outputs a data set
needs, puts its head on them (the member's saved model ends with it), gives the per-batch
training loss and scores a member on the validation split each epoch. Replication, placement,
checkpoints and the CLI never look inside: they call these methods.

Classification: `n_classes` logits, a softmax head (members output probabilities), mean
sparse categorical cross-entropy (natural log) as the loss, NLL and accuracy on validation.
"""

from __future__ import annotations

import numpy as np

from ensemble import metrics

TASKS = ("classification",)


class Classification:
    """Probabilities over `n_classes` classes from the builder's logits."""

    name = "classification"
    target_dtype = np.int32  # class indices

    def n_outputs(self, n_classes: int) -> int:
        """Logits the builder must return: one per class."""
        return n_classes

    def head(self, logits, name: str = "probabilities"):
        """Softmax over the last axis: `[batch, n_classes]` logits -> probabilities."""
        import keras

        return keras.layers.Softmax(name=name)(logits)

    def loss(self, y, outputs):
        """Mean sparse categorical cross-entropy (natural log) of `outputs` `[batch,
        n_classes]` probabilities against `y` `[batch]` int32 class indices (a scalar
        float32 tensor)."""
        import keras
        import tensorflow as tf

        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, outputs))

    def validation_scores(self, y: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """`{"val_loss": NLL, "val_accuracy": accuracy}` of one member's `[n_rows, n_classes]`
        probabilities against `y` `[n_rows]` class indices."""
        return {"val_loss": metrics.nll(y, outputs), "val_accuracy": metrics.accuracy(y, outputs)}

    @property
    def score_names(self) -> tuple[str, ...]:
        """The keys of `validation_scores`, in order."""
        return ("val_loss", "val_accuracy")


def get(name: str = "classification") -> Classification:
    """The task object of `name`.

    Raises:
        ValueError: an unknown task name.
    """
    if name != "classification":
        raise ValueError(f"Expected a task in {', '.join(TASKS)}. Received: {name!r}")
    return Classification()
