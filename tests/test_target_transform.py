"""The regression target transforms (`log1p`, `log`) against SciPy's log-normal."""

import numpy as np
import pytest
from scipy import integrate, stats

from ensemble.core.errors import UsageError
from ensemble.tasks.regression import transform as T

RNG = np.random.default_rng(0)
MU = RNG.normal(1.0, 0.7, 40)
SD = RNG.uniform(0.1, 0.9, 40)


def _lognorm(name, mu, sd):
    shift = 1.0 if name == "log1p" else 0.0
    return stats.lognorm(s=sd, scale=np.exp(mu), loc=-shift)


@pytest.mark.parametrize("name", ["log1p", "log"])
def test_moments_quantiles_and_nll_are_scipys_lognormal(name):
    t = T.get(name)
    dist = _lognorm(name, MU, SD)
    y = dist.rvs(random_state=1)
    mean, var = t.moments(MU, SD ** 2)
    np.testing.assert_allclose(mean, dist.mean(), rtol=1e-10)
    np.testing.assert_allclose(var, dist.var(), rtol=1e-10)
    np.testing.assert_allclose(t.quantile(MU, SD, 0.95), dist.ppf(0.95), rtol=1e-10)
    assert t.nll(y, MU, SD) == pytest.approx(-np.mean(dist.logpdf(y)), rel=1e-10)
    mu2, s2 = t.to_gaussian(mean, var)
    np.testing.assert_allclose(mu2, MU, rtol=1e-9)
    np.testing.assert_allclose(s2, SD ** 2, rtol=1e-9)


@pytest.mark.parametrize("name", ["log1p", "log"])
def test_mixture_nll_and_crps(name):
    t = T.get(name)
    mu_m, var_m = np.stack([MU, MU + 0.3]), np.stack([SD ** 2, (SD / 2) ** 2])
    y = _lognorm(name, MU, SD).rvs(random_state=2)
    dens = 0.5 * (_lognorm(name, mu_m[0], SD).pdf(y) + _lognorm(name, mu_m[1], SD / 2).pdf(y))
    assert t.mixture_nll(y, mu_m, var_m) == pytest.approx(-np.mean(np.log(dens)), rel=1e-9)
    for i in range(3):  # CRPS = integral of (F(x) - 1{x >= y})^2 dx
        d = _lognorm(name, MU[i], SD[i])
        lo = -t.shift
        num = (integrate.quad(lambda x: d.cdf(x) ** 2, lo, y[i])[0]
               + integrate.quad(lambda x: d.sf(x) ** 2, y[i], np.inf)[0])
        assert t.crps(y[i:i + 1], MU[i:i + 1], SD[i:i + 1]) == pytest.approx(num, rel=1e-6)


def test_metrics_on_the_target_scale():
    t = T.get("log")
    dist = _lognorm("log", MU, SD)
    y = dist.rvs(random_state=3)
    m = t.all_metrics(y, MU, SD)
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((y - dist.mean()) ** 2)))
    lo, hi = dist.ppf(0.05), dist.ppf(0.95)
    assert m["coverage_90"] == pytest.approx(np.mean((y >= lo) & (y <= hi)))
    assert m["width_90"] == pytest.approx(np.mean(hi - lo))
    assert m["nll"] == pytest.approx(-np.mean(dist.logpdf(y)))


def test_targets_outside_the_domain_are_refused():
    T.get("log1p").check(np.array([0.0, 3.0, np.nan]))
    with pytest.raises(UsageError, match=r"log1p.*-1\.5"):
        T.get("log1p").check(np.array([0.0, -1.5]), "income")
    with pytest.raises(UsageError, match=r"'log'.* 0\.0"):
        T.get("log").check(np.array([0.0, 2.0]), "income")
    with pytest.raises(UsageError, match="sqrt"):
        T.get("sqrt")


# --- one tiny run with --target-transform log1p: train, predict, export -------------------

CONFIG = """
[data]
source = "diabetes"
[members]
count = 3
hidden = [16]
[training]
epochs = 2
batch_size = 64
learning_rate = 0.01
seed = 5
[aggregation]
aggregators = ["mean", "std-scaling"]
[placement]
devices = "cpu:2"
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from conftest import run_cli

    root = tmp_path_factory.mktemp("transform")
    (root / "c.toml").write_text(CONFIG)
    assert run_cli("train", "--config", root / "c.toml", "--run-dir", root / "run",
                   "--target-transform", "log1p", "--quiet") == 0
    return root


def test_train_reports_log_normals_on_the_target_scale(run):
    """metrics.parquet's NLL is scipy's log-normal NLL of the y_pred and std train wrote
    (the log-normal with those moments), and the run records the transform."""
    import json

    import pyarrow.parquet as pq

    table = pq.read_table(run / "run" / "predictions.parquet")
    assert table.schema.metadata[b"target_transform"] == b"log1p"
    manifest = json.loads((run / "run" / "manifest.json").read_text())
    assert manifest["config"]["training"]["target_transform"] == "log1p"
    p, m = table.to_pandas(), pq.read_table(run / "run" / "metrics.parquet").to_pandas()
    assert (p["y_pred"] > -1).all()
    for model in ("member-0", "ensemble-mean", "ensemble-std-scaling"):
        t = p[(p.model == model) & (p.split == "test")]
        y, mean, sd = (t[c].to_numpy() for c in ("y_true", "y_pred", "std"))
        s = np.sqrt(np.log1p(sd ** 2 / (mean + 1) ** 2))
        dist = stats.lognorm(s=s, scale=(mean + 1) * np.exp(-s ** 2 / 2), loc=-1)
        np.testing.assert_allclose(dist.mean(), mean, rtol=1e-9)
        r = m[(m.model == model) & (m.split == "test")].iloc[0]
        assert r["nll"] == pytest.approx(-np.mean(dist.logpdf(y)), rel=1e-9)
        lo, hi = dist.ppf(0.05), dist.ppf(0.95)
        assert r["coverage_90"] == pytest.approx(np.mean((y >= lo) & (y <= hi)))
        assert r["width_90"] == pytest.approx(np.mean(hi - lo), rel=1e-6)


def test_predict_and_export_apply_the_transform(run):
    import pyarrow.parquet as pq
    import tensorflow as tf
    from conftest import run_cli
    from sklearn.datasets import load_diabetes

    out = run / "pred.parquet"
    assert run_cli("predict", "--run", run / "run", "--data", "diabetes", "--out", out,
                   "--aggregator", "mean", "--quiet") == 0
    wide = pq.read_table(out).to_pandas()
    train = pq.read_table(run / "run" / "predictions.parquet").to_pandas()
    t = train[(train.model == "ensemble-mean") & (train.split == "test")]
    got = wide.set_index("row").loc[t["source_row"], ["y_pred", "std"]].to_numpy()
    np.testing.assert_allclose(got, t[["y_pred", "std"]].to_numpy(), rtol=1e-5)
    assert run_cli("export", "--run", run / "run", "--out", run / "models",
                   "--aggregator", "mean") == 0
    model = tf.saved_model.load(str(run / "models" / "1"))
    x = load_diabetes().data.astype(np.float32)
    served = model.signatures["serving_default"](features=tf.constant(x))
    np.testing.assert_allclose(served["mean"].numpy(), wide["y_pred"], rtol=1e-4)
    np.testing.assert_allclose(served["std"].numpy(), wide["std"], rtol=1e-4)


def test_a_target_outside_the_domain_or_a_class_target_is_refused(tmp_path, capsys):
    import pandas as pd
    from conftest import run_cli

    rng = np.random.default_rng(0)
    pd.DataFrame({"a": rng.normal(size=60), "y": np.r_[0.0, rng.uniform(1, 9, 59)]}).to_csv(
        tmp_path / "t.csv", index=False)
    for transform, code_ok in (("log", 2), ("log1p", 0)):
        code = run_cli("train", "--data", tmp_path / "t.csv", "--target", "y",
                       "--target-transform", transform, "--run-dir", tmp_path / transform,
                       "--epochs", "1", "--members", "2", "--quiet")
        err = capsys.readouterr().err
        assert code == code_ok, err
        if code == 2:
            assert "'y'" in err and "0.0" in err and "log" in err
            assert not (tmp_path / transform).exists()
    pd.DataFrame({"a": rng.normal(size=60), "y": ["u", "v"] * 30}).to_csv(
        tmp_path / "c.csv", index=False)
    assert run_cli("train", "--data", tmp_path / "c.csv", "--target", "y",
                   "--target-transform", "log1p", "--run-dir", tmp_path / "c") == 2
    assert "regression target" in capsys.readouterr().err


def test_negative_predictions_of_a_non_negative_target_get_a_notice(capsys):
    from ensemble.tasks.eval_writer import negative_notice
    from ensemble.tasks.predicted import SplitPredictions

    ens = np.column_stack([[-2.0, 1.0, 3.0], np.ones(3), np.ones(3)])
    split = SplitPredictions({}, {"mean": ens}, np.arange(3), np.array([0.0, 2.0, 5.0]))
    negative_notice({"test": split}, ["mean"])
    err = capsys.readouterr().err
    assert "1 test rows" in err and "--target-transform log1p" in err
    negative_notice({"test": split._replace(y=np.array([-1.0, 2.0, 5.0]))}, ["mean"])
    negative_notice({"test": split._replace(ensembles={"mean": np.abs(ens)})}, ["mean"])
    assert capsys.readouterr().err == ""


def _lognormal_nll(y, mean, sd):
    """SciPy's log-normal NLL (log1p: loc -1) of the log-normal with moments mean, sd**2."""
    s = np.sqrt(np.log1p(sd ** 2 / (mean + 1) ** 2))
    return -np.mean(stats.lognorm(s=s, scale=(mean + 1) * np.exp(-s ** 2 / 2),
                                  loc=-1).logpdf(y))


def test_std_scaling_minimises_the_lognormal_nll_on_validation(run):
    """The fitted std-scaling factor is the one the run's own (log-normal) NLL prefers on the
    validation rows it was fitted on, not the Gaussian closed form's."""
    import json

    import pyarrow.parquet as pq

    s = json.loads((run / "run" / "aggregators.json").read_text())["params"][
        "std-scaling"]["scale"]
    p = pq.read_table(run / "run" / "predictions.parquet").to_pandas()
    val = p[p.split == "validation"]
    mean_rows = val[val.model == "ensemble-mean"].sort_values("row")
    scaled = val[val.model == "ensemble-std-scaling"].sort_values("row")
    y, mean, sd = (mean_rows[c].to_numpy() for c in ("y_true", "y_pred", "std"))
    np.testing.assert_allclose(scaled["std"], s * sd, rtol=1e-5)
    best = _lognormal_nll(y, mean, s * sd)
    for c in (0.9, 0.98, 1.02, 1.1):
        assert best <= _lognormal_nll(y, mean, c * s * sd) + 1e-9
    gaussian = np.sqrt(np.mean((y - mean) ** 2 / sd ** 2))  # the Gaussian closed form's
    assert abs(gaussian - s) > 1e-3 and best < _lognormal_nll(y, mean, gaussian * sd)


def test_predict_file_names_the_transform(run):
    import pyarrow.parquet as pq
    from conftest import run_cli

    out = run / "pred-meta.parquet"
    assert run_cli("predict", "--run", run / "run", "--data", "diabetes", "--out", out,
                   "--quiet") == 0
    assert pq.read_table(out).schema.metadata[b"target_transform"] == b"log1p"


def test_the_loaded_estimator_predicts_the_runs_lognormals(run):
    """`DeepEnsembleRegressor.load` of a `--target-transform log1p` run: `predict`'s mean and
    std are the run's `y_pred` and `std` of its aggregator on the same rows."""
    import pyarrow.parquet as pq
    from sklearn.datasets import load_diabetes

    from ensemble.sklearn import DeepEnsembleRegressor

    est = DeepEnsembleRegressor.load(run / "run")
    assert est.target_transform == "log1p"
    p = pq.read_table(run / "run" / "predictions.parquet").to_pandas()
    t = p[(p.model == f"ensemble-{est.aggregator_}") & (p.split == "test")]
    mean, std = est.predict(load_diabetes().data[t["source_row"]], return_std=True)
    np.testing.assert_allclose(mean, t["y_pred"], rtol=1e-5)
    np.testing.assert_allclose(std, t["std"], rtol=1e-5)


@pytest.mark.parametrize("name", ["log1p", "log"])
def test_shift_metrics_of_a_transformed_run_are_the_lognormals(name):
    """`evaluate --shift` of a run with a target transform: NLL and 90% coverage of the
    log-normal with the outputs' moments (an ensemble's variance: aleatoric + epistemic)."""
    from ensemble.tasks.regression.task import Regression

    dist = _lognorm(name, MU, SD)
    y = dist.rvs(random_state=4)
    mean, var = T.get(name).moments(MU, SD ** 2)
    outputs = np.stack([mean, 0.25 * var, 0.75 * var], axis=1)  # [n_rows, 3]
    m = Regression().with_transform(name).shift_scores(y, outputs, "mean")
    assert m["nll"] == pytest.approx(-np.mean(dist.logpdf(y)), rel=1e-9)
    lo, hi = dist.ppf(0.05), dist.ppf(0.95)
    assert m["coverage_90"] == pytest.approx(np.mean((y >= lo) & (y <= hi)))
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((y - dist.mean()) ** 2)))
