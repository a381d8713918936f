"""`ensemble.train`'s config tables and overrides as a notebook writes them: `pathlib` paths,
numpy numbers and arrays are taken as their plain values; other objects are refused naming
their key (`ensemble.config.schema.load`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ensemble.core.errors import UsageError
from ensemble.runs.api import as_config


def test_paths_and_numpy_values_are_plain_values():
    cfg = as_config({"data": {"source": Path("data") / "wine.csv", "target": "target"},
                     "members": {"count": np.int64(3), "hidden": np.array([8, 4])}},
                    overrides={"training.epochs": np.int32(2),
                               "training.learning_rate": np.float32(0.5)})
    assert cfg.data.source.endswith("data/wine.csv")
    assert (cfg.members.count, cfg.members.hidden) == (3, (8, 4))
    assert (cfg.training.epochs, cfg.training.learning_rate) == (2, 0.5)
    assert type(cfg.members.count) is int and type(cfg.training.epochs) is int
    assert as_config(None, {"members.count": np.array(5)}).members.count == 5  # 0-d array


@pytest.mark.parametrize("tables, overrides, key", [
    ({"data": {"source": pd.DataFrame({"a": [1]})}}, None, "data.source"),
    ({"members": {"hidden": [8, object()]}}, None, r"members.hidden\[1\]"),
    (None, {"data.source": pd.DataFrame({"a": [1]})}, "data.source"),
])
def test_other_objects_are_refused_naming_their_key(tables, overrides, key):
    with pytest.raises(UsageError, match=rf"Expected `{key}` to be a number, string, boolean, "
                                         rf"list or table\. Received: {key} of type "):
        as_config(tables, overrides)
