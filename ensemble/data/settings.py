"""The `[data]` table of a run config: where the rows come from, how they are split and prepared.

Owned by the data package (the input concept); `ensemble.config` composes it into a run's
`Config` and checks its ranges.
"""
from __future__ import annotations

from pathlib import Path
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SyntheticConfig:
    """`make_classification` parameters of the built-in `synthetic` source."""

    rows: int = 50_000
    features: int = 64
    classes: int = 10
    seed: int = 0


@dataclass(frozen=True)
class DataConfig:
    """Where the data comes from, how it is split (fractions of all rows) and prepared.

    `categorical`: `"auto"` one-hot encodes string, boolean and dictionary columns, `"none"`
    encodes nothing, a list names the columns to encode. `impute`: `"error"` refuses missing
    feature values, `"median"` fills numeric ones with the training median (categorical ones
    with the most frequent category), `"most_frequent"` fills both with the most frequent value.
    A relative file `source` in a config file is resolved against that file's folder.
    `split_seed` alone decides the train/validation/test split (never the training seed), so
    runs with other seeds or member counts are scored on the same test rows. `drop`: columns
    left out. `image_size` (`[h, w]`, empty: as they are) and `color_mode` (`auto`: grey when
    every image is, `grayscale` or `rgb`): how an image folder is read (`ensemble.data.arrays`).
    `max_categories`: one-hot columns of a categorical column at most, its infrequent
    categories grouped into the last (scikit-learn's `OneHotEncoder(max_categories=)`); 0
    gives every category its own column. `embed_above`: a categorical column with more
    training categories than this becomes an integer index and a learned entity embedding in
    each member (`ensemble.data.embedding`); 0 one-hot encodes every column. `min_frequency`:
    an embedded column's categories seen fewer times in the training rows share one
    infrequent index.
    """

    source: str = "digits"
    target: str = "target"
    test_size: float = 0.2
    validation_size: float = 0.1
    split_seed: int = 0
    categorical: str | tuple[str, ...] = "auto"
    impute: str = "error"
    drop: tuple[str, ...] = ()
    max_categories: int = 64
    embed_above: int = 16
    min_frequency: int = 2
    image_size: tuple[int, ...] = ()
    color_mode: str = "auto"
    task: str = "auto"  # auto | classification | regression (ensemble.tasks.registry.resolve)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


def names_a_path(source: str) -> bool:
    """`data.source` names a file or folder (a `.csv`, `.parquet` or `.npz` file, or anything
    with a `/`), not a built-in data set: a config written elsewhere must make it absolute."""
    return Path(source).suffix in (".csv", ".parquet", ".npz") or "/" in source or \
        Path(source).suffixes[-2:-1] == [".csv"]
