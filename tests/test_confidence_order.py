"""The confidence block read from a predictions file model by model (`confidence.BlockBuilder`):
a file whose models' rows are interleaved is refused, not scored on its last stretch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest


def test_interleaved_models_are_refused_not_scored_in_part(tmp_path, monkeypatch):
    from ensemble import tasks
    from ensemble.core import artifacts
    from ensemble.tasks import confidence, model_arrays, tables
    from ensemble.tasks.predicted import SplitPredictions

    task = tasks.get()
    rng = np.random.default_rng(5)
    n, classes = 40, np.array([0, 1, 2])
    members = {i: rng.dirichlet(np.ones(3), n).astype(np.float32) for i in range(2)}
    whole = tables.predictions_table("test", SplitPredictions(
        members, None, np.arange(n), rng.integers(0, 3, n)), classes, ("mean",), task=task)
    monkeypatch.setattr(model_arrays, "BATCH_ROWS", 7)
    artifacts.write_parquet(tmp_path / "ordered.parquet", whole)  # model by model: scored
    assert confidence.block_of_file(tmp_path / "ordered.parquet", task) == \
        confidence.block(model_arrays.of_table(whole, task))
    by_row = whole.take(pc.sort_indices(whole, [("row", "ascending"), ("model", "ascending")]))
    artifacts.write_parquet(tmp_path / "by_row.parquet", by_row)
    with pytest.raises(ValueError, match="each model's rows together"):
        confidence.block_of_file(tmp_path / "by_row.parquet", task)
