"""Regression defaults that work for the user (issue 30, points 2 and 8).

- The mixture's CRPS in closed form equals scipy's numerical integration of
  `int (F(x) - 1{x >= y})^2 dx` and a sampled estimate.
- The default aggregator is the run's best on validation NLL, for predict, export and serve;
  `predict --aggregator` names another and refuses one the run lacks.
- A default regression run applies `mean` and `std-scaling`; its ensemble-size curve stops at
  its member count; its progress lines name the units of the loss and of the validation scores.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import run_cli
from ensemble.tasks.regression import metrics as RM
from ensemble.tasks.choice import default_aggregator
from ensemble.core.errors import UsageError


def _mixture_cdf(x, mu, sd, w):
    from scipy import stats

    return sum(wi * stats.norm.cdf(x, m, s) for wi, m, s in zip(w, mu, sd))


def test_mixture_crps_equals_numerical_integration():
    from scipy import integrate

    rng = np.random.default_rng(4)
    n_members, n_rows = 3, 6
    mu = rng.normal(0, 3, (n_members, n_rows))
    var = rng.uniform(0.05, 4, (n_members, n_rows))
    w = np.array([0.2, 0.5, 0.3])
    y = rng.normal(0, 3, n_rows)
    expected = []
    for r in range(n_rows):
        def f(x, r=r):
            return _mixture_cdf(x, mu[:, r], np.sqrt(var[:, r]), w)
        lo, hi = -60.0, 60.0
        below = integrate.quad(lambda x: f(x) ** 2, lo, y[r], limit=400)[0]
        above = integrate.quad(lambda x: (f(x) - 1) ** 2, y[r], hi, limit=400)[0]
        expected.append(below + above)
    assert RM.mixture_crps(y, mu, var, w) == pytest.approx(np.mean(expected), rel=1e-7)
    # one member: the Gaussian CRPS; a zero weight drops its member
    assert RM.mixture_crps(y, mu[:1], var[:1]) == pytest.approx(
        RM.crps(y, mu[0], np.sqrt(var[0])), rel=1e-12)
    assert RM.mixture_crps(y, mu, var, [0.4, 0.6, 0.0]) == pytest.approx(
        RM.mixture_crps(y, mu[:2], var[:2], [0.4, 0.6]), rel=1e-12)


def test_mixture_crps_equals_a_sampled_estimate_and_differs_from_moment_matching():
    """E|X - y| - E|X - X'| / 2 by sampling the mixture (scipy's norm), one row with two
    well separated members: the moment-matched Gaussian's CRPS is clearly different."""
    from scipy import stats

    mu, var, w, y = np.array([[-4.0], [4.0]]), np.array([[1.0], [1.0]]), [0.5, 0.5], 0.5
    rng = np.random.default_rng(0)
    n = 400_000
    pick = rng.random((2, n)) < 0.5
    x = np.where(pick, stats.norm(-4, 1).rvs((2, n), random_state=rng),
                 stats.norm(4, 1).rvs((2, n), random_state=rng))
    sampled = np.mean(np.abs(x[0] - y)) - 0.5 * np.mean(np.abs(x[0] - x[1]))
    exact = RM.mixture_crps([y], mu, var, w)
    assert exact == pytest.approx(sampled, abs=0.02)
    matched = RM.crps([y], [0.0], [np.sqrt(1.0 + 16.0)])
    assert abs(matched - exact) > 0.3


@pytest.mark.parametrize("names, nll, requested, expected", [
    (["mean", "std-scaling"], {"mean": 5.6, "std-scaling": 5.4}, None, "std-scaling"),
    (["mean", "std-scaling"], {"mean": 5.4, "std-scaling": 5.4}, None, "mean"),  # tie
    (["mean", "vote"], {"mean": 0.3, "vote": None}, None, "mean"),
    (["vote", "mean"], {"vote": None, "mean": 0.3}, None, "mean"),
    (["mean", "std-scaling"], None, None, "mean"),  # no aggregators.json: the first
    (["mean", "std-scaling"], {"mean": 5.6, "std-scaling": 5.4}, "mean", "mean"),
])
def test_default_aggregator(names, nll, requested, expected):
    fit = None if nll is None else {"validation_nll": nll}
    assert default_aggregator(names, fit, requested) == expected


def test_default_aggregator_refuses_one_the_run_lacks():
    with pytest.raises(UsageError, match=r"one of the run's aggregators \(mean, std-scaling\)"
                                         r"\. Received: 'vote'"):
        default_aggregator(["mean", "std-scaling"], None, "vote")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """A regression run on diabetes with the default aggregators: 2 members, 3 epochs."""
    base = tmp_path_factory.mktemp("regdefaults")
    assert run_cli("train", "--data", "diabetes", "--members", "2", "--epochs", "3",
                   "--devices", "cpu:2", "--run-dir", base / "run", "--quiet") == 0
    return base / "run"


def test_default_run_applies_std_scaling_and_answers_with_the_best(default_run, tmp_path,
                                                                   capsys):
    fit = json.loads((default_run / "aggregators.json").read_text())
    assert fit["aggregators"] == ["mean", "std-scaling"]
    nll = fit["out_of_fold_nll"]  # what the default is chosen on (`tasks.crossfit`)
    best = min(fit["aggregators"], key=lambda a: nll[a])
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", default_run, "--data", "diabetes", "--out", out) == 0
    assert run_cli("predict", "--run", default_run, "--data", "diabetes", "--layout", "long",
                   "--out", tmp_path / "long.parquet") == 0
    wide = pq.read_table(out).to_pandas()
    long = pq.read_table(tmp_path / "long.parquet").to_pandas()
    for agg in fit["aggregators"]:
        rows = long[long.model == f"ensemble-{agg}"].sort_values("row")
        same = np.allclose(wide["std"], rows["std"]) and np.allclose(wide.y_pred, rows.y_pred)
        assert same == (agg == best), agg
    other = next(a for a in fit["aggregators"] if a != best)
    assert run_cli("predict", "--run", default_run, "--data", "diabetes", "--aggregator",
                   other, "--out", tmp_path / "other.parquet") == 0
    rows = long[long.model == f"ensemble-{other}"].sort_values("row")
    assert np.allclose(pq.read_table(tmp_path / "other.parquet").column("std").to_numpy(),
                       rows["std"])
    capsys.readouterr()
    assert run_cli("predict", "--run", default_run, "--data", "diabetes", "--aggregator",
                   "vote", "--out", tmp_path / "bad.parquet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--aggregator" in err[0] and "'vote'" in err[0]
    assert not (tmp_path / "bad.parquet").exists()


def test_default_export_serves_the_best_aggregator(default_run, tmp_path):
    import tensorflow as tf

    fit = json.loads((default_run / "aggregators.json").read_text())
    best = min(fit["aggregators"], key=lambda a: fit["out_of_fold_nll"][a])
    assert run_cli("export", "--run", default_run, "--out", tmp_path / "m") == 0
    sigs = tf.saved_model.load(str(tmp_path / "m" / "1")).signatures
    names = (tmp_path / "m" / "1" / "assets" / "feature_names.txt").read_text().split()
    x = tf.constant(np.linspace(-0.05, 0.05, 3 * len(names), dtype=np.float32)
                    .reshape(3, len(names)) + 0.01)
    default, chosen = sigs["serving_default"](features=x), sigs[best](features=x)
    other = sigs[next(a for a in fit["aggregators"] if a != best)](features=x)
    assert np.array_equal(default["std"].numpy(), chosen["std"].numpy())
    assert not np.allclose(default["std"].numpy(), other["std"].numpy())


def test_metrics_crps_is_the_mixtures(default_run):
    from ensemble.tasks.regression import aggregators as R

    preds = pq.read_table(default_run / "predictions.parquet").to_pandas()
    metrics = pq.read_table(default_run / "metrics.parquet").to_pandas()
    test = preds[preds.split == "test"]
    members = [test[test.model == f"member-{i}"].sort_values("row") for i in range(2)]
    y = members[0].y_true.to_numpy()
    stacked = np.stack([np.column_stack([m.y_pred, m["std"] ** 2]) for m in members])
    mu_m, var_m, w = R.components(stacked, "mean")
    row = metrics[(metrics.model == "ensemble-mean") & (metrics.split == "test")].iloc[0]
    assert row.crps == pytest.approx(RM.mixture_crps(y, mu_m, var_m, w), rel=1e-9)
    ens = test[test.model == "ensemble-mean"].sort_values("row")
    assert row.crps != pytest.approx(RM.crps(y, ens.y_pred, ens["std"]), rel=1e-9)


def test_size_curve_stops_at_the_member_count(default_run):
    curve = pq.read_table(default_run / "ensemble_size.parquet").to_pandas()
    assert set(curve.order) == {"first", "greedy"}
    assert curve.groupby("order").k.max().to_dict() == {"first": 2, "greedy": 2}


def test_regression_progress_names_units():
    from ensemble.replication import progress, protocol

    line = progress.format_report(protocol.Epoch(3, {"member": 0, "epoch": 0, "loss": -0.98,
                                                     "val_loss": 7.15, "val_rmse": 60.1,
                                                     "seconds": 0.4}))
    assert "loss -0.9800 (standardised target)" in line
    assert "val_loss 7.1500 - val_rmse 60.1000 (target units)" in line
    line = progress.format_report(protocol.Epoch(3, {"member": 0, "epoch": 0, "loss": 0.5,
                                                     "val_loss": 0.6, "val_accuracy": 0.8,
                                                     "seconds": 0.4}))
    assert "units" not in line and "val_accuracy 0.8000" in line
