"""The scaler fitted on the training split, stored as JSON (never a pickle).

It also holds what a run needs to read new data: the feature names (columns are matched by
name at predict time, in any order) and the class labels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.preprocessing import StandardScaler

from ensemble.data import Dataset
from ensemble.errors import UsageError


@dataclass(frozen=True)
class Preprocessing:
    """Standardisation `(x - mean) / scale` plus the run's feature names and classes.

    Attributes:
        feature_names: the `n_features` training column names, in training order.
        mean, scale: `[n_features]` float64, from `sklearn.preprocessing.StandardScaler`.
        classes: sorted class labels `[n_classes]` (int64 or str).
    """

    feature_names: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    classes: np.ndarray

    @classmethod
    def fit(cls, ds: Dataset, train_rows: np.ndarray, classes: np.ndarray) -> "Preprocessing":
        """Fit the scaler on `ds.x[train_rows]` only."""
        sc = StandardScaler().fit(ds.x[train_rows].astype(np.float64))
        return cls(ds.feature_names, sc.mean_, sc.scale_, np.asarray(classes))

    def transform(self, ds: Dataset) -> np.ndarray:
        """Scale `ds.x` after matching its columns to the training columns by name.

        Returns:
            `[n_rows, n_features]` float32.

        Raises:
            UsageError: a training feature missing from `ds`, or an unexpected extra column.
        """
        pos = {name: i for i, name in enumerate(ds.feature_names)}
        missing = [n for n in self.feature_names if n not in pos]
        if missing:
            raise UsageError(
                f"Feature column {missing[0]!r} missing from {ds.name}; expected the "
                f"{len(self.feature_names)} training columns ({len(missing)} missing)."
            )
        extra = sorted(set(pos) - set(self.feature_names))
        if extra:
            raise UsageError(f"Unexpected column {extra[0]!r} in {ds.name}; not a training feature.")
        x = ds.x[:, [pos[n] for n in self.feature_names]].astype(np.float64)
        return ((x - self.mean) / self.scale).astype(np.float32)

    def to_json(self) -> str:
        return json.dumps({
            "scaler": "standard",
            "feature_names": list(self.feature_names),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "classes": self.classes.tolist(),
        }, indent=1)

    @classmethod
    def read(cls, path: Path) -> "Preprocessing":
        """Read `preprocessing.json`.

        Raises:
            UsageError: missing file or malformed content.
        """
        try:
            d = json.loads(Path(path).read_text())
            classes = np.asarray(d["classes"])
            return cls(tuple(d["feature_names"]), np.asarray(d["mean"], np.float64),
                       np.asarray(d["scale"], np.float64), classes)
        except FileNotFoundError:
            raise UsageError(f"Preprocessing file not found: {path}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"Preprocessing file {path} is malformed: {exc}") from None
