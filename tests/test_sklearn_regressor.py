"""`DeepEnsembleRegressor`: scikit-learn's estimator checks (tiny settings), the diabetes fit
with `return_std`, a fitted aggregator, and save/load."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from ensemble.sklearn import DeepEnsembleRegressor

# learning_rate 0.02 and 5 epochs: check_regressors_train wants a training R^2 of 0.5 on its
# data; tiny members so the fits take seconds (the traced graphs are reused).
TINY = DeepEnsembleRegressor(n_members=2, hidden=(8,), dropout=0.0, epochs=5,
                             learning_rate=0.02, random_state=0)
EXPECTED_FAILED: dict[str, str] = {}


@parametrize_with_checks([TINY], expected_failed_checks=lambda est: EXPECTED_FAILED)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def diabetes():
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    return x[:300], y[:300], x[300:], y[300:]


def test_return_std_target_units_and_save_load(diabetes, tmp_path):
    x, y, xt, yt = diabetes
    reg = DeepEnsembleRegressor(n_members=2, hidden=(16,), dropout=0.0, epochs=5,
                                learning_rate=0.01, batch_size=32, random_state=1,
                                aggregator="std-scaling").fit(x, y, validation_data=(xt, yt))
    mean, std = reg.predict(xt, return_std=True)
    assert mean.shape == std.shape == (len(xt),) and np.all(std > 0)
    assert abs(mean.mean() - y.mean()) < 2 * y.std()  # target units, not standardised
    members = reg.predict_members(xt)
    assert members.shape == (2, len(xt), 2)
    # std-scaling: the mean mixture's std times the fitted s
    mix_var = members[..., 1].mean(0) + members[..., 0].var(0)
    s = reg.aggregators_["params"]["std-scaling"]["scale"]
    np.testing.assert_allclose(std, s * np.sqrt(mix_var), rtol=1e-4)
    np.testing.assert_allclose(mean, members[..., 0].mean(0), rtol=1e-5)
    assert {"val_loss", "val_rmse"} <= set(reg.history_.columns)
    reg.save(tmp_path / "run")
    back = DeepEnsembleRegressor.load(tmp_path / "run")
    m2, s2 = back.predict(xt, return_std=True)
    np.testing.assert_allclose(m2, mean, rtol=1e-5)
    np.testing.assert_allclose(s2, std, rtol=1e-4)
    with pytest.raises(ValueError, match=r"rows of shape \[10, 1\]; DeepEnsembleRegressor was "
                                         r"fitted on rows of shape \[10\]"):
        back.predict(xt[:, :, None])
    from ensemble.sklearn import DeepEnsembleClassifier

    with pytest.raises(ValueError, match=r"is a regression run; DeepEnsembleClassifier loads "
                                         r"classification runs only: load it with "
                                         r"DeepEnsembleRegressor\.load"):
        DeepEnsembleClassifier.load(tmp_path / "run")


def test_fitted_aggregator_needs_validation_data(diabetes):
    x, y, _, _ = diabetes
    with pytest.raises(ValueError, match="validation_data"):
        DeepEnsembleRegressor(aggregator="greedy", epochs=1, validation_fraction=0).fit(x, y)
    with pytest.raises(ValueError, match="aggregator"):
        DeepEnsembleRegressor(aggregator="vote", epochs=1).fit(x, y)


def test_evaluating_a_saved_estimator_names_the_way_to_evaluate_it(diabetes, tmp_path, capsys):
    """A saved estimator has no predictions of its own (every row trained): `evaluate --run`
    said "Artifact missing: .../predictions.parquet"; it now names the predict command
    whose output evaluates it."""
    from conftest import run_cli

    x, y, _, _ = diabetes
    DeepEnsembleRegressor(n_members=1, hidden=(4,), epochs=1).fit(x, y).save(tmp_path / "r")
    capsys.readouterr()
    assert run_cli("evaluate", "--run", tmp_path / "r") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no predictions of its own" in err[0], err
    assert "--target COL --layout long --out P.parquet" in err[0]
