"""Regression on `.npz` arrays, as on tables: float targets train as regression under
`--task auto` (Keras's layout keeps its own test split), `--task regression` takes integer
targets too, NaN/inf targets are one line; `predict` (both modes) fills `y_true` and the
Gaussian columns, `evaluate` reads the run."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import run_cli

COMMON = ("--members", "2", "--epochs", "1", "--devices", "cpu:2", "--quiet")


def _rows(n=90, seed=0):
    """`x` `[n, 3, 2]` float32 and a noisy linear target `[n]` float64."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3, 2)).astype(np.float32)
    return x, x.reshape(n, -1) @ rng.normal(size=6) + 0.1 * rng.normal(size=n)


@pytest.fixture(scope="module")
def keras_run(tmp_path_factory):
    """A Keras-layout `.npz` of float targets and its run (`--task auto`)."""
    base = tmp_path_factory.mktemp("npz_regression")
    x, y = _rows()
    np.savez(base / "reg.npz", x_train=x[:70], y_train=y[:70], x_test=x[70:], y_test=y[70:])
    assert run_cli("train", "--data", base / "reg.npz", "--run-dir", base / "run", *COMMON) == 0
    return base, x, y


def test_float_targets_train_as_regression_with_the_files_test_split(keras_run):
    base, x, y = keras_run
    manifest = json.loads((base / "run" / "manifest.json").read_text())
    assert manifest["task"] == "regression" and manifest["dataset"]["classes"] == []
    assert manifest["dataset"]["input_shape"] == [3, 2]
    assert sorted(np.load(base / "run" / "data" / "test.row.npy").tolist()) == \
        list(range(70, len(x)))
    pred = pq.read_table(base / "run" / "predictions.parquet").to_pydict()
    test = [i for i, s in enumerate(pred["split"]) if s == "test"]
    assert sorted({pred["source_row"][i] for i in test}) == list(range(70, len(x)))
    np.testing.assert_allclose([pred["y_true"][i] for i in test if pred["source_row"][i] == 70],
                               y[70])  # float targets kept, not rounded to classes
    assert all(pred["std"][i] > 0 for i in test)


def test_predict_fills_y_true_in_both_modes_and_evaluate_reads_the_run(keras_run, capsys):
    base, x, y = keras_run
    np.savez(base / "new.npz", x=x[:20], y=y[:20])
    tables = {}
    for mode in ("in-graph", "between-graph"):  # between-graph: clients stream the .npz
        out = base / f"{mode}.parquet"
        assert run_cli("predict", "--run", base / "run", "--data", base / "new.npz", "--out",
                       out, "--mode", mode, "--quiet") == 0
        tables[mode] = pq.read_table(out).to_pydict()
    got = tables["in-graph"]
    np.testing.assert_allclose(got["y_true"], y[:20])
    assert np.all(np.asarray(got["std"]) > 0) and got["input"][0] == "new.npz[0]"
    np.testing.assert_allclose(tables["between-graph"]["y_pred"], got["y_pred"], atol=1e-5)
    capsys.readouterr()
    assert run_cli("evaluate", "--run", base / "run") == 0
    assert "rmse" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_predict_on_targets_with_nan_leaves_only_their_y_true_empty(keras_run, capsys, mode):
    """A NaN or inf target is a row without one: its y_true is null, the others keep theirs
    (was: null on every row), one notice counts them; evaluate scores the others."""
    base, x, y = keras_run
    bad = np.isin(np.arange(5), [2, 4])
    np.savez(base / "nan.npz", x=x[:5], y=np.where(np.arange(5) == 2, np.nan,
                                                    np.where(bad, np.inf, y[:5])))
    out = base / f"nan-{mode}.parquet"
    capsys.readouterr()
    assert run_cli("predict", "--run", base / "run", "--data", base / "nan.npz", "--out", out,
                   "--mode", mode, "--layout", "long") == 0
    assert (f"the y array of {base / 'nan.npz'} has 2 missing labels in 5 rows"
            in capsys.readouterr().err)
    got = pq.read_table(out)
    ens = got.filter(pc.equal(got.column("model"), "ensemble-mean"))
    got_y = ens.column("y_true").to_pylist()
    assert [v is None for v in got_y] == bad.tolist()
    np.testing.assert_allclose([v for v in got_y if v is not None], y[:5][~bad], rtol=1e-12)
    assert got.column("y_true").null_count == 2 * len({*got.column("model").to_pylist()})
    assert run_cli("evaluate", "--predictions", out) == 0
    cap = capsys.readouterr()
    assert "predict (3 rows)" in cap.out and "left out 2 rows of split 'predict'" in cap.err


def test_task_regression_takes_integer_targets(tmp_path):
    """Few distinct whole numbers are classes under `auto`; `--task regression` is honoured."""
    x, y = _rows(seed=1)
    np.savez(tmp_path / "int.npz", x=x, y=(y > 0).astype(np.int64) * 2 + (y > 1))
    assert run_cli("train", "--data", tmp_path / "int.npz", "--task", "regression",
                   "--run-dir", tmp_path / "run", *COMMON) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["task"] == "regression" and manifest["dataset"]["classes"] == []


@pytest.mark.parametrize("bad, message", [
    (np.nan, "hold 1 missing or non-finite target(s) (NaN or inf; first at row 3)"),
    (np.inf, "hold 1 missing or non-finite target(s) (NaN or inf; first at row 3)"),
    (1e39, "beyond float32"),
])
def test_non_finite_targets_are_one_line(tmp_path, capsys, bad, message):
    x, y = _rows()
    y[3] = bad
    np.savez(tmp_path / "bad.npz", x=x, y=y)
    assert run_cli("train", "--data", tmp_path / "bad.npz", "--run-dir", tmp_path / "run",
                   *COMMON) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "bad.npz" in lines[0], lines
    assert not (tmp_path / "run").exists()
