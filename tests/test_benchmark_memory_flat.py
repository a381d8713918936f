"""Smoke test of benchmarks/memory_flat.py at a tiny size: its table and its measuring wrapper
(never its training runs)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("memory_flat",
                                                  ROOT / "benchmarks" / "memory_flat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_and_measure_at_a_tiny_size(tmp_path):
    bench = _module()
    bench.make_table(tmp_path / "t.parquet", 3000, features=4, classes=3)
    t = pq.read_table(tmp_path / "t.parquet")
    assert t.num_rows == 3000 and t.column_names == ["x0", "x1", "x2", "x3", "target"]
    assert set(np.unique(t.column("target").to_numpy())) == {0, 1, 2}
    out = bench.measure([sys.executable, "-c", "x = bytearray(64 << 20); x[::4096] = b'1' * "
                         "len(x[::4096])"], log=tmp_path / "log")
    assert out["code"] == 0
    assert out["peak_bytes"] >= 64 << 20  # the child's touched bytes at least
    assert 0 < bench.estimate(1_000_000, 10, "in-graph") < bench.estimate(
        16_000_000, 10, "in-graph")
