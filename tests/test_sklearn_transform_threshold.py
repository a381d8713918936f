"""`DeepEnsembleRegressor(target_transform=...)` and `DeepEnsembleClassifier(threshold=...)`:
scikit-learn parameters (stored as given, checked at `fit`) routed to
`training.target_transform` and `training.threshold`."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn.base import clone
from sklearn.metrics import f1_score

from ensemble.sklearn import DeepEnsembleClassifier, DeepEnsembleRegressor

SMALL = dict(n_members=2, hidden=(8,), dropout=0.0, epochs=2, learning_rate=0.02,
             batch_size=32, random_state=3)


def _positive(n=240, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    return x, np.exp(0.8 * x[:, 0] + 0.3 * rng.normal(size=n))  # > 0, skewed


def test_log1p_members_are_the_lognormals_of_members_fitted_on_log1p_y():
    """Same seed, same rows: the transformed regressor's members are the plain regressor's
    Gaussians of `log1p(y)` mapped to the target scale (scipy's log-normal moments), and
    `predict` is their mixture's mean and std there."""
    x, y = _positive()
    est = DeepEnsembleRegressor(**SMALL, validation_fraction=0, target_transform="log1p")
    est.fit(x, y)
    plain = DeepEnsembleRegressor(**SMALL, validation_fraction=0).fit(x, np.log1p(y))
    assert est.config_.training.target_transform == "log1p"
    assert est.target_loc_ == pytest.approx(np.log1p(y).mean())
    assert est.target_scale_ == pytest.approx(np.log1p(y).std())
    z = plain.predict_members(x)  # [n_members, n_rows, (mean, variance)] of log1p(y)
    dist = stats.lognorm(s=np.sqrt(z[..., 1]), scale=np.exp(z[..., 0]), loc=-1)
    members = est.predict_members(x)
    np.testing.assert_allclose(members[..., 0], dist.mean(), rtol=1e-4)
    np.testing.assert_allclose(members[..., 1], dist.var(), rtol=1e-3)
    mean, std = est.predict(x, return_std=True)
    np.testing.assert_allclose(mean, dist.mean().mean(axis=0), rtol=1e-4)
    second = (dist.var() + dist.mean() ** 2).mean(axis=0)
    np.testing.assert_allclose(std, np.sqrt(second - dist.mean().mean(axis=0) ** 2), rtol=1e-3)
    assert (mean > -1).all()


def test_the_transform_survives_save_load_and_is_checked_at_fit(tmp_path):
    x, y = _positive(120)
    est = DeepEnsembleRegressor(**SMALL, target_transform="log")
    assert clone(est).get_params()["target_transform"] == "log"
    est.fit(x, y)
    back = DeepEnsembleRegressor.load(est.save(tmp_path / "run"))
    assert back.target_transform == "log"
    np.testing.assert_allclose(back.predict(x), est.predict(x), rtol=1e-6)
    with pytest.raises(ValueError, match=r"target_transform.*None, 'log1p' or 'log'.*'sqrt'"):
        DeepEnsembleRegressor(**SMALL, target_transform="sqrt").fit(x, y)
    with pytest.raises(ValueError, match=r"'y' > 0.*1 rows outside, the smallest -0\.5"):
        DeepEnsembleRegressor(**SMALL, target_transform="log").fit(x, np.r_[y[:-1], -0.5])


def _binary(n=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    return x, np.where(x[:, 0] + 0.5 * rng.normal(size=n) > 1.0, "yes", "no")


def test_auto_f1_threshold_maximises_f1_on_the_validation_rows_and_sets_predict(tmp_path):
    x, y = _binary()
    x_val, y_val = _binary(150, seed=1)
    est = DeepEnsembleClassifier(**SMALL, threshold="auto:f1")
    est.fit(x, y, validation_data=(x_val, y_val))
    t = np.float32(est.aggregators_["params"]["mean"]["threshold"])  # compared in float32
    p = est.predict_members(x_val)[:, :, 1].mean(axis=0)  # `mean`: float32, as the graph's
    best = max(f1_score(y_val == "yes", p >= c) for c in np.unique(p))
    assert f1_score(y_val == "yes", p >= t) == pytest.approx(best)
    p_new = est.predict_members(x)[:, :, 1].mean(axis=0)
    np.testing.assert_array_equal(est.predict(x), np.where(p_new >= t, "yes", "no"))
    back = DeepEnsembleClassifier.load(est.save(tmp_path / "run"))
    assert back.threshold == "auto:f1"
    np.testing.assert_array_equal(back.predict(x), est.predict(x))


def test_a_number_threshold_and_the_refusals():
    x, y = _binary()
    est = DeepEnsembleClassifier(**SMALL, threshold=0.2).fit(x, y)
    p = est.predict_members(x)[:, :, 1].mean(axis=0)  # float32, as the graph's `mean`
    np.testing.assert_array_equal(est.predict(x), np.where(p >= np.float32(0.2), "yes", "no"))
    assert est.config_.training.threshold == 0.2
    with pytest.raises(ValueError, match=r"`threshold`.*number in \(0, 1\).*Received: 1\.5"):
        DeepEnsembleClassifier(**SMALL, threshold=1.5).fit(x, y)
    with pytest.raises(ValueError, match=r"2 classes.*Received: 3 classes"):
        DeepEnsembleClassifier(**SMALL, threshold=0.3).fit(x, np.arange(len(y)) % 3)
    with pytest.raises(ValueError, match=r"validation rows.*validation_fraction > 0"):
        DeepEnsembleClassifier(**SMALL, threshold=0.3, validation_fraction=0).fit(x, y)
