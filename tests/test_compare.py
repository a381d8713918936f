"""`ensemble compare` building blocks (the full comparison is measured by the benchmark)."""

import tomllib

import numpy as np
import pyarrow as pa
import pytest

from ensemble import config, tables
from pipelines import compare


def test_resolved_config_round_trips_through_toml():
    cfg = config.load(overrides={"members.hidden": [8, 4], "data.synthetic.rows": 99})
    assert config.from_dict(tomllib.loads(compare._to_toml(cfg.to_dict()))) == cfg


def _preds(p):
    return tables.predictions_table({0: p}, "test", np.arange(len(p)), None, np.array([0, 1]), ())


def test_parity_figures():
    p = np.array([[0.9, 0.1], [0.4, 0.6], [0.5, 0.5]], np.float32)
    q = np.array([[0.8, 0.2], [0.6, 0.4], [0.5, 0.5]], np.float32)
    diff, same = compare.parity(_preds(p), _preds(q))
    assert diff == pytest.approx(0.2, abs=1e-6) and same == pytest.approx(2 / 3)


def test_concurrent_peak_counts_the_jobs_largest_clients():
    clients = [{"peak_rss_bytes": b} for b in (5, 9, 7)]
    assert compare.concurrent_peak(100, clients, 2) == 116
    assert compare.concurrent_peak(100, [], 1) == 100


def test_verdict_names_the_faster_mode():
    base = {"member_rows_per_second": 1.0, "peak_rss_bytes": 2**20, "startup_seconds": 1.0,
            "test_accuracy": 0.9, "parity_max_abs_diff": 0.0, "parity_same_labels": 1.0}
    rows = [dict(base, mode=m, phase=ph, wall_seconds=s)
            for m, ph, s in [("in-graph", "train", 2.0), ("in-graph", "predict", 1.0),
                             ("between-graph", "train", 6.0), ("between-graph", "predict", 0.5)]]
    text = compare.verdict(pa.Table.from_pylist(rows))
    assert "train: in-graph is 3.00x faster" in text
    assert "predict: between-graph is 2.00x faster" in text
