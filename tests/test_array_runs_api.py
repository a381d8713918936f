"""Runs trained on arrays through the Python API: `DeepEnsembleClassifier.load` and
`ensemble.load_run(...).predict` of runs `ensemble train` made from an image folder and from a
float `.npz` (the same probabilities as the CLI's prediction path, rows of the run's shape
only), a `model="cnn"` estimator's n-d rows (saved, loaded, other row shapes refused), and a
run of the other task refused at `load`."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import run_cli

import ensemble
from ensemble.core.errors import UsageError
from ensemble.sklearn import DeepEnsembleClassifier, DeepEnsembleRegressor

TRAIN = ["--members", "2", "--epochs", "1", "--devices", "cpu:2", "--quiet"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`{"images": (run, folder), "npz": (run, x)}`: 2-member, 1-epoch CLI runs on 16x16 RGB
    PNGs in two class folders and on a float `.npz` of rows `[6]`, and `"cnn"`: a 2-member
    `model="cnn"` estimator fitted on `[40, 8, 8, 1]` with its saved run."""
    from PIL import Image

    base = tmp_path_factory.mktemp("array_runs")
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (base / "imgs" / c).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), "RGB").save(
                base / "imgs" / c / f"{i}.png")
    x = rng.normal(size=(40, 6)).astype(np.float32) * 3 + 5  # the run standardises it
    np.savez(base / "rows.npz", x=x, y=(x[:, 0] > 5).astype(int))
    assert run_cli("train", "--data", base / "imgs", "--run-dir", base / "img_run", *TRAIN) == 0
    assert run_cli("train", "--data", base / "rows.npz", "--run-dir", base / "npz_run",
                   *TRAIN) == 0
    xi = rng.normal(size=(40, 8, 8, 1))
    cnn = DeepEnsembleClassifier(model="cnn", n_members=2, epochs=1, random_state=0,
                                 devices="cpu:2").fit(xi, np.arange(40) % 2)
    return {"images": (base / "img_run", base / "imgs"), "npz": (base / "npz_run", x),
            "cnn": (cnn, cnn.save(base / "cnn_run"), xi)}


def _p(table) -> np.ndarray:
    return table[[c for c in table.columns if c.startswith("p_")]].to_numpy(np.float64)


def test_load_and_load_run_predict_an_image_run_as_the_cli_reads_its_folder(runs):
    from PIL import Image

    run, folder = runs["images"]
    files = sorted(folder.rglob("*.png"))
    x = np.stack([np.asarray(Image.open(f)) for f in files])  # [20, 16, 16, 3] raw uint8
    by_folder = ensemble.load_run(run).predict(folder)  # the CLI's own reader of the folder
    assert by_folder["input"].tolist() == [str(f) for f in files]
    by_array = ensemble.load_run(run).predict(x)
    assert "input" not in by_array.columns and by_array["row"].tolist() == list(range(20))
    np.testing.assert_allclose(_p(by_array), _p(by_folder), atol=1e-6)
    est = DeepEnsembleClassifier.load(run)
    assert est.n_features_in_ == 16 and not hasattr(est, "feature_names_in_")
    # the members' Rescaling(1/255), applied in numpy for the estimator's rebuilt members
    np.testing.assert_allclose(est.predict_proba(x), _p(by_folder), atol=1e-5)
    assert list(est.predict(x)) == by_folder["y_pred"].tolist()
    with pytest.raises(ValueError, match=r"rows of shape \[8, 8, 3\]; DeepEnsembleClassifier "
                                         r"was fitted on rows of shape \[16, 16, 3\]"):
        est.predict(x[:, :8, :8])
    with pytest.raises(UsageError, match=r"Expected an array \[n_rows, 16, 16, 3\].*"
                                         r"Received: shape \(3, 16, 16\)"):
        ensemble.load_run(run).predict(x[:3, :, :, 0])
    with pytest.raises(ValueError, match=r"is a classification run; DeepEnsembleRegressor "
                                         r"loads regression runs only: load it with "
                                         r"DeepEnsembleClassifier\.load"):
        DeepEnsembleRegressor.load(run)


def test_load_of_a_float_npz_run_standardises_as_its_members_do(runs):
    run, x = runs["npz"]
    est = DeepEnsembleClassifier.load(run)
    assert est.n_features_in_ == 6
    table = ensemble.load_run(run).predict(x[:7])
    np.testing.assert_allclose(est.predict_proba(x[:7]), _p(table), atol=1e-5)
    # the .npz path itself, as `ensemble predict --data` reads it
    np.testing.assert_allclose(_p(ensemble.load_run(run).predict(str(runs["npz"][0].parent /
                                                                       "rows.npz")))[:7],
                               _p(table), atol=1e-6)
    with pytest.raises(ValueError, match="X has 5 features, but DeepEnsembleClassifier is "
                                         "expecting 6"):
        est.predict(x[:3, :5])
    with pytest.raises(ValueError, match=r"rows of shape \[6, 1\].*fitted on rows of shape \[6\]"):
        est.predict(x[:3, :, None])


@pytest.mark.parametrize("shape", [(3, 8, 9, 1), (3, 8, 12, 1), (3, 8, 8, 3), (3, 64)])
def test_cnn_estimator_refuses_other_row_shapes_fitted_and_loaded(runs, shape):
    cnn, path, _ = runs["cnn"]
    loaded = DeepEnsembleClassifier.load(path)
    bad = np.zeros(shape)
    got = re.escape(str(list(shape[1:])))
    for est in (cnn, loaded):
        with pytest.raises(ValueError, match=rf"X has rows of shape {got}; DeepEnsembleClassifier "
                                             r"was fitted on rows of shape \[8, 8, 1\]"):
            est.predict_proba(bad)
    with pytest.raises(UsageError, match=r"rows of shape \[8, 8, 1\]"):
        ensemble.load_run(path).predict(bad)


def test_cnn_estimator_saved_loaded_and_load_run_agree(runs):
    cnn, path, xi = runs["cnn"]
    expected = cnn.predict_proba(xi[:5])
    loaded = DeepEnsembleClassifier.load(path)
    assert loaded.n_features_in_ == 8
    np.testing.assert_allclose(loaded.predict_proba(xi[:5]), expected, atol=1e-6)
    np.testing.assert_allclose(_p(ensemble.load_run(path).predict(xi[:5])), expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"X_val has rows of shape \[8, 9, 1\]; X has rows of "
                                         r"shape \[8, 8, 1\]"):  # refused before training
        DeepEnsembleClassifier(model="cnn", n_members=2, epochs=1).fit(
            xi, np.arange(40) % 2, validation_data=(np.zeros((4, 8, 9, 1)), np.arange(4) % 2))
