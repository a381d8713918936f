"""Label encoding: labels to class indices, shared by the inputs (`ensemble.data`) and the tasks.

Below both, because reading a data set and scoring stored predictions need the same mapping and
neither package imports the other.
"""
from __future__ import annotations

import numpy as np

from ensemble.core.errors import UsageError


def encode(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Map labels `[n_rows]` to class indices `[n_rows]` int32 (`classes` sorted).

    A regression run has no classes (`classes` empty): targets come back as float64.

    Raises:
        UsageError: a label that is not among `classes`.
    """
    y, classes = np.asarray(y), np.asarray(classes)
    if classes.size == 0:  # regression
        if y.dtype.kind not in "iuf":
            raise UsageError(f"Targets of type {y.dtype} are not numbers; this regression "
                             "run needs numeric targets.")
        return y.astype(np.float64)
    if (y.dtype.kind in "USO") != (classes.dtype.kind in "USO"):
        raise UsageError(
            f"Labels of type {y.dtype} do not match the run's classes {classes.tolist()}"
        )
    pos = np.clip(np.searchsorted(classes, y), 0, len(classes) - 1)
    unknown = classes[pos] != y
    if np.any(unknown):
        raise UsageError(
            f"Label {y[unknown][0].item()!r} is not a class of this run; expected one of "
            f"{classes.tolist()}"
        )
    return pos.astype(np.int32)
