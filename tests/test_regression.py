"""Regression deep ensembles (#22): Gaussian metrics against scipy / scikit-learn / hand
computations, the mixture aggregators and their TensorFlow twins, the task resolution, and one
tiny diabetes run per mode (shared by the module) checked for equal members and for metrics
that an independent computation from `predictions.parquet` reproduces."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from scipy import integrate, stats

from conftest import run_cli
from ensemble.tasks.regression import aggregators as R
from ensemble import tasks
from ensemble.tasks import model_arrays
from ensemble.tasks.regression import fitted as RF
from ensemble.tasks.regression import metrics as RM
from ensemble.core.errors import UsageError

RNG = np.random.default_rng(0)
Y = RNG.normal(3.0, 2.0, 200)
MU = Y + RNG.normal(0.0, 1.0, 200)
SIGMA = RNG.uniform(0.5, 2.0, 200)

CONFIG = """
[data]
source = "diabetes"
task = "{task}"
[members]
count = 3
hidden = [16]
[training]
epochs = 2
batch_size = 64
learning_rate = 0.01
seed = 5
[aggregation]
aggregators = ["mean", "weighted", "greedy", "std-scaling"]
[placement]
devices = "cpu:2"
"""


# --- metrics ------------------------------------------------------------------------------

def test_nll_is_scipy_gaussian_log_density():
    want = -np.mean(stats.norm(MU, SIGMA).logpdf(Y))
    assert RM.nll(Y, MU, SIGMA) == pytest.approx(want, rel=1e-12)


def test_nll_is_in_target_units():
    """Scaling the target by c shifts the mean NLL by log c (nats per row, target units)."""
    c = 37.0
    assert RM.nll(c * Y, c * MU, c * SIGMA) == pytest.approx(RM.nll(Y, MU, SIGMA) + np.log(c))


def test_point_prediction_has_no_nll_and_crps_is_the_absolute_error():
    assert RM.nll(Y, MU, np.zeros_like(Y)) is None
    assert RM.crps(Y, MU, np.zeros_like(Y)) == pytest.approx(np.mean(np.abs(Y - MU)))


def test_rmse_mae_r2_match_scikit_learn():
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    assert RM.rmse(Y, MU) == pytest.approx(np.sqrt(mean_squared_error(Y, MU)))
    assert RM.mae(Y, MU) == pytest.approx(mean_absolute_error(Y, MU))
    assert RM.r2(Y, MU) == pytest.approx(r2_score(Y, MU))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "not well-defined with less than two samples"
        assert np.isnan(r2_score(Y[:1], MU[:1]))
    assert RM.r2(Y[:1], MU[:1]) is None  # undefined on one row: n/a, not a number


def test_crps_matches_its_integral_definition():
    """CRPS = integral of (F(x) - 1{x >= y})^2 dx (Gneiting and Raftery 2007, eq. 20)."""
    vals = []
    for y, mu, s in zip(Y[:5], MU[:5], SIGMA[:5]):
        f = stats.norm(mu, s).cdf
        left = integrate.quad(lambda x: f(x) ** 2, -np.inf, y)[0]
        right = integrate.quad(lambda x: (1 - f(x)) ** 2, y, np.inf)[0]
        vals.append(left + right)
    assert RM.crps(Y[:5], MU[:5], SIGMA[:5]) == pytest.approx(np.mean(vals), rel=1e-6)


def test_coverage_uses_scipy_central_interval():
    lo, hi = stats.norm(MU, SIGMA).interval(0.9)
    share, width = RM.coverage(Y, MU, SIGMA, 0.9)
    assert share == pytest.approx(np.mean((Y >= lo) & (Y <= hi)))
    assert width == pytest.approx(np.mean(hi - lo))


def test_calibration_error_hand_case():
    """Every y at the mean: share(y <= q_p) is 1 for p >= 0.5, 0 below; mean |p - share|
    over 0.05..0.95 = (sum of 0.05..0.45 + sum of 0.5..0.95 complements) / 19."""
    y = np.zeros(10)
    got = RM.calibration_error(y, y, np.ones(10))
    p = np.round(np.arange(0.05, 0.951, 0.05), 2)
    assert got == pytest.approx(np.mean(np.where(p >= 0.5, 1 - p, p)))


def test_mixture_nll_is_minus_log_of_the_mean_density():
    mu_m = np.stack([MU, MU + 1.0, MU - 2.0])
    var_m = np.stack([SIGMA ** 2, 2 * SIGMA ** 2, 0.5 * SIGMA ** 2])
    dens = np.mean([stats.norm(m, np.sqrt(v)).pdf(Y) for m, v in zip(mu_m, var_m)], axis=0)
    assert RM.mixture_nll(Y, mu_m, var_m) == pytest.approx(-np.mean(np.log(dens)))
    w = np.array([0.5, 0.0, 0.5])
    dens_w = 0.5 * (stats.norm(mu_m[0], np.sqrt(var_m[0])).pdf(Y)
                    + stats.norm(mu_m[2], np.sqrt(var_m[2])).pdf(Y))
    assert RM.mixture_nll(Y, mu_m, var_m, w) == pytest.approx(-np.mean(np.log(dens_w)))


# --- aggregators --------------------------------------------------------------------------

def test_mean_mixture_hand_case():
    """Members N(0, 1) and N(2, 1): mu = 1, aleatoric 1, epistemic 1 (sigma^2 = 2)."""
    out = np.array([[[0.0, 1.0]], [[2.0, 1.0]]])
    np.testing.assert_allclose(R.aggregate(out, "mean"), [[1.0, 1.0, 1.0]])
    e = R.aggregate(out, "weighted", {"weights": [3, 1]})  # mu 0.5, epi .75*.25+.25*2.25
    np.testing.assert_allclose(e, [[0.5, 1.0, 0.75 * 0.25 + 0.25 * 2.25]])
    np.testing.assert_allclose(R.aggregate(out, "std-scaling", {"scale": 2.0}),
                               [[1.0, 4.0, 4.0]])


def _members(n_members=3, n=150, seed=1):
    rng = np.random.default_rng(seed)
    y = rng.normal(0.0, 1.0, n)
    mu = y + rng.normal(0.0, 0.8, n) + rng.normal(0.0, 0.1, (n_members, n))  # shared error
    var = rng.uniform(0.05, 0.3, (n_members, n))  # overconfident: std-scaling widens
    return np.stack([mu, var], axis=2), y


def test_tf_twins_agree_with_numpy():
    from ensemble.tasks.regression.tf_ops import aggregate_tf

    out, y = _members()
    params = tasks.get("regression").fit_aggregators(
        out, y, ["weighted", "greedy", "std-scaling"], [0, 1, 2])["params"]
    for name in R.AGGREGATORS:
        want = R.aggregate(out, name, params.get(name))
        got = aggregate_tf(out.astype(np.float32), name, params.get(name)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_std_scale_is_the_nll_minimiser():
    from scipy.optimize import minimize_scalar

    out, y = _members()
    s = RF.fit_std_scale(out, y)["scale"]
    e = R.mixture(out)
    sd = np.sqrt(e[:, 1] + e[:, 2])
    res = minimize_scalar(lambda t: RM.nll(y, e[:, 0], np.exp(t) * sd), bounds=(-5, 5),
                          method="bounded", options={"xatol": 1e-10})
    assert s == pytest.approx(np.exp(res.x), rel=1e-4)
    assert s > 1.0  # the fixture's members are overconfident


def test_weighted_and_greedy_do_not_worsen_validation_nll():
    out, y = _members()
    base = RF.mixture_nll_gaussian(out, y)
    w = RF.fit_weights(out, y)["weights"]
    assert np.isclose(sum(w), 1.0) and min(w) >= 0
    assert RF.mixture_nll_gaussian(out, y, w) <= base + 1e-9
    g = RF.greedy_selection(out, y, 10)
    assert RF.mixture_nll_gaussian(out, y, g["weights"]) <= min(
        RF.mixture_nll_gaussian(out[m:m + 1], y) for m in range(3)) + 1e-9


def test_classification_aggregators_are_refused_for_regression():
    regression, classification = tasks.get("regression"), tasks.get("classification")
    with pytest.raises(UsageError, match="'vote' is for classification"):
        regression.check_aggregators(["mean", "vote"])
    assert regression.applied_aggregators(["mean", "vote"]) == ["mean", "std-scaling"]
    assert classification.applied_aggregators(["mean", "vote"]) == ["mean", "vote"]
    with pytest.raises(UsageError, match="std-scaling"):
        classification.check_aggregators(["std-scaling"])


# --- task resolution ----------------------------------------------------------------------

def test_task_resolution():
    from ensemble.tasks.registry import resolve

    assert resolve(np.array([0.5, 1.25, 3.0]), "auto") == "regression"
    assert resolve(np.array([0, 1, 2] * 20), "auto") == "classification"
    assert resolve(np.array(["a", "b"]), "auto") == "classification"
    diabetes_like = np.arange(100, dtype=np.float64)
    assert resolve(diabetes_like, "auto") == "regression"
    assert resolve(diabetes_like, "classification") == "classification"
    # prices: many whole numbers, a third of them on fewer than 3 rows (issue 40)
    prices = np.repeat(np.arange(1000, 1400), np.arange(400) % 6 + 1)
    assert resolve(prices, "auto") == "regression"
    # labels: 12 classes, every one on enough rows for a stratified split
    assert resolve(np.repeat(np.arange(12), 5), "auto") == "classification"
    with pytest.raises(UsageError, match="--task classification needs class labels"):
        resolve(np.array([0.5, 1.5]), "classification")


def test_whole_number_target_is_regression_or_refused_naming_task_regression(tmp_path,
                                                                           capsys):
    """Issue 40: a price in whole numbers (many values, most too rare for a stratified split)
    trains as regression with a notice naming --task classification; asked to be
    classification, the refusal is one line naming --task regression, without the labels."""
    from sklearn.datasets import load_diabetes

    d = load_diabetes(as_frame=True).frame
    path = tmp_path / "diabetes.csv"
    d.to_csv(path, index=False)
    from ensemble.runs.prepare import check_data
    from ensemble.config import schema

    check_data(schema.load(overrides={"data.source": str(path)}))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trained as regression" in err[0], err
    assert "--task classification" in err[0]
    code = run_cli("train", "--data", path, "--task", "classification", "--run-dir",
                   tmp_path / "run", "--epochs", "1")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--task regression" in err[0] and "classes have fewer than 3 rows" in err[0]
    assert "25.0" not in err[0] and "[" not in err[0]  # no list of labels
    assert not (tmp_path / "run").exists()


def test_stacking_refused_for_a_regression_run(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.format(task="auto").replace('"greedy", "std-scaling"', '"stacking"'))
    code = run_cli("train", "--config", cfg, "--run-dir", tmp_path / "run")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'stacking' is for classification" in err[0]


# --- one tiny run per mode ----------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("regression")
    cfg = root / "reg.toml"
    cfg.write_text(CONFIG.format(task="auto"))
    out = {}
    # between-graph: one client trains the members in turn (the client count is
    # test_between_graph's and test_parity_cnn's; each client process is a TensorFlow start)
    for mode, jobs in (("in-graph", []), ("between-graph", ["--jobs", "1"])):
        assert run_cli("train", "--config", cfg, "--mode", mode, *jobs, "--run-dir", root / mode,
                       "--quiet") == 0
        out[mode] = root / mode
    return out


def _table(run, name):
    return pq.read_table(run / name).to_pandas()


def test_both_modes_give_equal_members_and_ensembles(runs):
    a, b = (_table(runs[m], "predictions.parquet") for m in ("in-graph", "between-graph"))
    key = ["model", "split", "row"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    assert (a[key] == b[key]).all().all()
    mem, ens = a["member"].notna(), a["aggregator"].notna()
    for col in ("y_pred", "std"):  # members: equal within 1e-4 target units
        np.testing.assert_allclose(a.loc[mem, col], b.loc[mem, col], rtol=0, atol=1e-4)
    # ensembles: the in-graph graph computes in float32 and the fitted weights come from
    # each mode's own (equal to float32 rounding) validation predictions, through L-BFGS-B
    # on a numerical gradient: an empirical tolerance (1.4e-5 relative was seen once, with
    # the members bit-equal)
    for col in ("y_pred", "std", "aleatoric_std", "epistemic_std"):
        np.testing.assert_allclose(a.loc[ens, col], b.loc[ens, col], rtol=1e-4, atol=1e-4)


def test_predictions_layout(runs):
    p = _table(runs["in-graph"], "predictions.parquet")
    assert {"y_true", "y_pred", "std", "aleatoric_std", "epistemic_std", "source_row",
            "member", "aggregator"} <= set(p.columns)
    assert not any(c.startswith("p_") for c in p.columns)
    ens = p[p["aggregator"].notna()]
    np.testing.assert_allclose(ens["std"] ** 2,
                               ens["aleatoric_std"] ** 2 + ens["epistemic_std"] ** 2, rtol=1e-9)
    assert p.loc[p["member"].notna(), "epistemic_std"].isna().all()
    assert set(p["aggregator"].dropna()) == {"mean", "weighted", "greedy", "std-scaling"}
    hist = _table(runs["in-graph"], "history.parquet")
    assert {"val_loss", "val_rmse"} <= set(hist.columns) and "val_accuracy" not in hist.columns
    manifest = json.loads((runs["in-graph"] / "manifest.json").read_text())
    assert manifest["task"] == "regression" and manifest["dataset"]["classes"] == []


def test_metrics_equal_an_independent_computation(runs):
    """Recompute every metric of `metrics.parquet` from `predictions.parquet` with scipy /
    scikit-learn, the mixture weights from `aggregators.json`."""
    from sklearn.metrics import mean_absolute_error, r2_score

    run = runs["between-graph"]
    p, m = _table(run, "predictions.parquet"), _table(run, "metrics.parquet")
    fit = json.loads((run / "aggregators.json").read_text())
    assert len(m) == 2 * (3 + 4 + 1)  # members, aggregators and the prior, per split
    for _, r in m[m["model"] != "prior"].iterrows():
        t = p[(p["model"] == r["model"]) & (p["split"] == r["split"])].sort_values("row")
        y, mu, sd = t["y_true"].to_numpy(), t["y_pred"].to_numpy(), t["std"].to_numpy()
        assert r["rmse"] == pytest.approx(np.sqrt(np.mean((y - mu) ** 2)), rel=1e-9)
        assert r["mae"] == pytest.approx(mean_absolute_error(y, mu), rel=1e-9)
        assert r["r2"] == pytest.approx(r2_score(y, mu), rel=1e-9)
        assert r["nll"] == pytest.approx(-np.mean(stats.norm(mu, sd).logpdf(y)), rel=1e-9)
        lo, hi = stats.norm(mu, sd).interval(0.95)
        assert r["coverage_95"] == pytest.approx(np.mean((y >= lo) & (y <= hi)))
        assert r["width_95"] == pytest.approx(np.mean(hi - lo), rel=1e-9)
        members = p[(p["member"].notna()) & (p["split"] == r["split"])]
        comps = [members[members["member"] == i].sort_values("row") for i in range(3)]
        agg = r["aggregator"]
        if not isinstance(agg, str):  # a member row
            assert r["mixture_nll"] == pytest.approx(r["nll"])
            continue
        w = np.full(3, 1 / 3) if agg in ("mean", "std-scaling") else \
            np.asarray(fit["params"][agg]["weights"])
        s = fit["params"]["std-scaling"]["scale"] if agg == "std-scaling" else 1.0
        mus = np.stack([c["y_pred"].to_numpy() for c in comps])
        sds = np.stack([c["std"].to_numpy() for c in comps])
        center = mus.mean(axis=0)
        if agg == "std-scaling":
            mus, sds = center + s * (mus - center), s * sds
        dens = sum(wi * stats.norm(mi, si).pdf(y) for wi, mi, si in zip(w, mus, sds) if wi > 0)
        assert r["mixture_nll"] == pytest.approx(-np.mean(np.log(dens)), rel=1e-6)
        np.testing.assert_allclose(mu, w @ mus, rtol=1e-9)


def test_ensemble_beats_its_mean_member_on_nll(runs):
    m = _table(runs["in-graph"], "metrics.parquet")
    test = m[m["split"] == "test"]
    ens = test[test["model"] == "ensemble-mean"].iloc[0]
    assert ens["gain_vs_mean_nll"] > 0
    assert ens["nll"] < test[test["member"].notna()]["nll"].mean()


def test_aggregate_and_evaluate_a_regression_run(runs, capsys):
    run = runs["in-graph"]
    before = _table(run, "metrics.parquet")
    assert run_cli("aggregate", "--run", run, "--aggregators", "mean,std-scaling") == 0
    after = _table(run, "metrics.parquet")
    same = before[before["model"].isin(["ensemble-mean", "ensemble-std-scaling"])]
    np.testing.assert_allclose(after.set_index(["model", "split"]).loc[
        same.set_index(["model", "split"]).index, "nll"], same["nll"], rtol=1e-6)
    assert run_cli("aggregate", "--run", run, "--aggregators", "mean,vote") == 2
    capsys.readouterr()
    assert run_cli("evaluate", "--run", run) == 0
    text = capsys.readouterr().out
    assert "rmse" in text and "ensemble-std-scaling" in text and "std-scaling: s =" in text
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("ensemble gain on test"))
    header, gains = lines[at + 1], lines[at + 2:at + 6]
    assert header.split() == ["rmse", "nll", "crps"]
    assert gains[-1].startswith("  std-scaling vs best member")
    for line in gains:  # every cell right-aligned under its column name
        assert len(line) == len(header) and len(line.split()) == 4 + 3, line


def test_plots_draw_the_aggregator_predict_answers_with(runs, tmp_path):
    """Issue 40: PIT, coverage and confidence plots draw the ensemble `predict` answers with
    (lowest validation NLL, `tasks.choice`), labelled so, not the run's first aggregator."""
    from ensemble.runs.evaluate import _answer_curves
    from ensemble.tasks import confidence
    from ensemble.tasks.regression import plots

    run = runs["in-graph"]
    fit = json.loads((run / "aggregators.json").read_text())
    rows = [r for r in pq.read_table(run / "metrics.parquet").to_pylist()
            if r["split"] == "test"]
    for best in fit["aggregators"]:  # whichever has the lowest validation NLL is drawn
        nll = {a: (0.0 if a == best else 1.0) for a in fit["aggregators"]}
        (tmp_path / "aggregators.json").write_text(json.dumps({**fit, "out_of_fold_nll": nll}))
        shown = plots._shown(rows, tmp_path)
        assert [r["model"] for r in shown if r["aggregator"]] == [f"ensemble-{best}"]
        arrays = model_arrays.of_table(pq.read_table(run / "predictions.parquet"),
                                       tasks.get("regression"))
        curves, _ = _answer_curves(*confidence.curves(arrays), rows, tmp_path)
        assert [m for m in curves if m.startswith("ensemble")] == [
            f"ensemble-{best} (what predict answers with)"]
        assert sum(m.startswith("member") for m in curves) == 3


def test_regression_plots_and_member_scores_follow_the_task(runs, capsys):
    """`evaluate --plots` draws the regression task's plots (PIT, coverage, error against std,
    no classification reliability diagram), and members.parquet carries the task's scores:
    `val_nll` and `val_rmse` equal to an independent computation on the stored predictions."""
    run = runs["between-graph"]
    capsys.readouterr()
    assert run_cli("evaluate", "--run", run, "--plots") == 0
    out = capsys.readouterr().out
    for name in ("pit.png", "coverage.png", "error_vs_std.png"):
        assert (run / name).stat().st_size > 1000 and name in out
    assert not (run / "reliability.png").exists()
    members = _table(run, "members.parquet")
    assert {"val_nll", "val_rmse"} <= set(members.columns) and "val_accuracy" not in members
    preds = _table(run, "predictions.parquet")
    for _, m in members.iterrows():
        rows = preds[(preds["member"] == m["member"]) & (preds["split"] == "validation")]
        y, mu, sd = rows["y_true"].to_numpy(), rows["y_pred"].to_numpy(), rows["std"].to_numpy()
        assert m["val_rmse"] == pytest.approx(np.sqrt(np.mean((y - mu) ** 2)), rel=1e-5)
        assert m["val_nll"] == pytest.approx(-np.mean(stats.norm(mu, sd).logpdf(y)), rel=1e-4)


def test_evaluate_a_predict_file_reports_and_draws_its_split(runs, tmp_path, capsys):
    """`evaluate --predictions` of `predict --layout long` output (split `predict`): the RMSE
    against share kept block and `confidence.png` show that split. They looked for test only,
    so the block was missing and the picture empty (with matplotlib's no-legend warning)."""
    import warnings

    from ensemble.tasks import confidence

    run, out = runs["in-graph"], tmp_path / "long.parquet"
    assert run_cli("predict", "--run", run, "--data", "diabetes", "--layout", "long",
                   "--out", out, "--quiet") == 0
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty legend warns
        assert run_cli("evaluate", "--predictions", out, "--plots") == 0
    text = capsys.readouterr().out
    assert "RMSE of the rows kept by lowest predictive std on predict" in text
    p = pq.read_table(out).to_pandas()
    m = p[p["model"] == "ensemble-mean"].sort_values("row")
    y, mu, sd = m["y_true"].to_numpy(), m["y_pred"].to_numpy(), m["std"].to_numpy()
    keep = np.argsort(sd, kind="stable")[:int(np.ceil(0.5 * len(y)))]
    half = np.sqrt(np.mean((y[keep] - mu[keep]) ** 2))
    block = text.split("RMSE of the rows kept by lowest predictive std on predict")[1]
    row = next(x for x in block.splitlines() if x.startswith("  ensemble-mean ")).split()
    assert float(row[2]) == pytest.approx(half, rel=1e-3)  # area, then rmse 50% kept
    curves, _ = confidence.curves(model_arrays.of_table(pq.read_table(out), tasks.get("regression")),
                                  "predict")
    assert set(curves) == set(p["model"]) and (tmp_path / "confidence.png").is_file()


def test_verdict_names_the_ensemble_predict_answers_with(runs, tmp_path):
    """A predict file has no validation split: the verdict took the run's first aggregator
    ("ensemble-mean") while predict, export and the plots answer with the lowest validation
    NLL of the run's `aggregators.json`. The verdict now reads it too."""
    run, out = runs["between-graph"], tmp_path / "long.parquet"
    assert run_cli("predict", "--run", run, "--data", "diabetes", "--layout", "long",
                   "--out", out, "--quiet") == 0
    metrics = tasks.get("regression").metrics_table(pq.read_table(out), None)
    names = [a for a in dict.fromkeys(metrics.column("aggregator").to_pylist()) if a]
    assert len(names) > 1
    for best in names:
        fit = {"validation_nll": {a: (0.5 if a == best else 1.0) for a in names}}
        text = " ".join(tasks.get("regression").format_table(metrics, fit).split())
        assert f"ensemble (ensemble-{best}, chosen on validation) has predict RMSE" in text


def test_evaluate_of_a_wide_regression_file_names_the_regression_columns(runs, tmp_path,
                                                                          capsys):
    """A wide predict file with y_true is scored with the regression columns of the run's task
    (RMSE of y_pred and std, not a classifier's p_<class>)."""
    out = tmp_path / "wide.parquet"
    assert run_cli("predict", "--run", runs["in-graph"], "--data", "diabetes", "--out", out,
                   "--quiet") == 0
    capsys.readouterr()
    assert run_cli("evaluate", "--predictions", out) == 0
    text = capsys.readouterr().out.lower()
    assert "rmse" in text and "accuracy" not in text


def test_table_cells_keep_whole_numbers_of_large_targets():
    """Prices near 1e6: RMSEs of 556234 and 561234 printed both as `5.6e+05`, in the table and
    in the verdict ("test RMSE 5.6e+05 against 5.6e+05"). A whole number that fits the cell is
    now printed rounded to the unit; small values keep 4 significant digits."""
    from ensemble.tasks.regression.evaluation import COL, COLUMNS, cell, verdict

    assert [cell(v) for v in (556234.4, -561234.6, 12345.6, 5523456.7, 59.355, 0.0001234,
                              -0.0001234, 5.5e7, 10000.0, 560000.0, 9999.4)] == [
        "556234", "-561235", "12346", "5523457", "59.35", "0.00012", "-1e-04", "5.5e+07",
        "10000", "560000", "9999"]
    assert all(len(cell(v)) < COL for v in (556234.4, -9999999.0, 1e300, -1e-300))
    base = dict.fromkeys(COLUMNS, 0.5)
    rows = [{**base, "model": f"member-{i}", "member": i, "aggregator": None, "rmse": r,
             "nll": 14.7} for i, r in enumerate((561234.6, 563100.2))]
    rows.append({**base, "model": "ensemble-mean", "member": None, "aggregator": "mean",
                 "rmse": 556234.4, "nll": 14.6, "best_member": 0})
    assert "test RMSE 556234 against 562167 for the mean member" in verdict(rows, "test")


def test_verdict_of_point_members_does_not_mention_nll():
    """Point members (`loss = "mse"`) have no NLL: the verdict ended "(NLL in nats per row,
    target units)" after a sentence without any NLL."""
    from ensemble.tasks.regression.evaluation import COLUMNS, verdict

    base = dict.fromkeys(COLUMNS, 0.5)
    rows = [{**base, "model": f"member-{i}", "member": i, "aggregator": None, "rmse": r,
             "nll": None} for i, r in enumerate((340.1, 344.7))]
    rows.append({**base, "model": "ensemble-mean", "member": None, "aggregator": "mean",
                 "rmse": 337.9, "nll": 1742.0, "best_member": 0})
    assert verdict(rows, "test") == ("The 2-member ensemble (ensemble-mean) has test RMSE "
                                     "337.9 against 342.4 for the mean member (target units).")


def test_best_member_is_never_chosen_on_the_split_it_is_scored_on(runs, tmp_path):
    """A predict file without the run has no validation split: the best member was picked on
    the very rows it was then scored on (an optimistic "gain vs best member"). It is now
    left out, as for classification; the run's `aggregators.json` still names it."""
    run, out = runs["in-graph"], tmp_path / "long.parquet"
    assert run_cli("predict", "--run", run, "--data", "diabetes", "--layout", "long",
                   "--out", out, "--quiet") == 0
    rows = tasks.get("regression").metrics_table(pq.read_table(out), None).to_pylist()
    ens = [r for r in rows if r["aggregator"] is not None]
    assert ens and all(r["best_member"] is None and r["gain_vs_best_rmse"] is None
                       for r in ens)
    assert "best member" not in tasks.get("regression").format_table(
        tasks.get("regression").metrics_table(pq.read_table(out), None))
    best = json.loads((run / "aggregators.json").read_text())["best_member"]
    rows = tasks.get("regression").metrics_table(pq.read_table(out), best).to_pylist()
    member = next(r for r in rows if r["member"] == best)
    for r in (r for r in rows if r["aggregator"] is not None):
        assert r["best_member"] == best
        assert r["gain_vs_best_rmse"] == pytest.approx(member["rmse"] - r["rmse"])


def test_targets_near_1e9_keep_their_digits_in_predict_and_export(tmp_path):
    """Prices near 1e9 varying by ~20: float32 holds them in steps of 64, so the members
    trained on such steps and predict returned 3 distinct values (RMSE 16 of a std 20). The
    head, the losses' standardisation and the mixtures are float64: predict and the exported
    SavedModel give the same fine-grained means, close to the targets."""
    import pyarrow as pa
    import tensorflow as tf

    rng = np.random.default_rng(3)
    x = rng.normal(size=400)
    price = 1e9 + 20.0 * x + rng.normal(size=400) * 0.5
    pq.write_table(pa.table({"x": x, "price": price}), tmp_path / "p.parquet")
    assert run_cli("train", "--data", tmp_path / "p.parquet", "--target", "price",
                   "--members", "2", "--epochs", "20", "--devices", "cpu:2",
                   "--run-dir", tmp_path / "run", "--quiet") == 0
    assert run_cli("predict", "--run", tmp_path / "run", "--data", tmp_path / "p.parquet",
                   "--out", tmp_path / "out.parquet", "--quiet") == 0
    mean = pq.read_table(tmp_path / "out.parquet").column("y_pred").to_numpy()
    assert len(np.unique(mean)) == 400 and np.any(np.mod(mean, 64.0) != 0)
    assert np.sqrt(np.mean((mean - price) ** 2)) < 0.25 * price.std()
    stored = pq.read_table(tmp_path / "run" / "predictions.parquet").column("y_pred")
    assert np.any(np.mod(stored.to_numpy(), 64.0) != 0)
    assert run_cli("export", "--run", tmp_path / "run", "--out", tmp_path / "models") == 0
    serve = tf.saved_model.load(str(tmp_path / "models" / "1")).signatures["serving_default"]
    out = serve(features=tf.constant(x[:, None], tf.float32))
    assert out["mean"].dtype == tf.float64 and out["member_mean"].dtype == tf.float64
    np.testing.assert_allclose(out["mean"].numpy(), mean, rtol=0, atol=1e-3)


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_predict_keeps_the_targets_of_the_rows_that_have_one(runs, tmp_path, capsys, mode):
    """A regression input with a few targets missing (a CSV's empty cell, a Parquet NaN):
    y_true is null on those rows alone, the others keep their targets (was: null on every
    row), and evaluate scores the labelled rows."""
    from sklearn.datasets import load_diabetes

    d = load_diabetes()
    y = d.target.astype(np.float64)
    missing = [1, 7, 20]
    with_nan = y.copy()
    with_nan[missing] = np.nan
    cols = {n: d.data[:, i] for i, n in enumerate(d.feature_names)}
    for name, target in (("in.csv", pa.array(with_nan, mask=np.isnan(with_nan))),
                         ("in.parquet", pa.array(with_nan))):  # null, or a stored NaN
        table = pa.table({**cols, "target": target})
        data = tmp_path / name
        pcsv.write_csv(table, data) if name.endswith(".csv") else pq.write_table(table, data)
        out = tmp_path / f"{name}.long.parquet"
        capsys.readouterr()
        assert run_cli("predict", "--run", runs[mode], "--data", data, "--out", out,
                       "--layout", "long", "--batch-size", "64", "--mode", mode) == 0
        assert f"has 3 missing labels in {len(y)} rows" in capsys.readouterr().err
        got = pq.read_table(out).to_pandas()
        ens = got[got["model"] == "ensemble-mean"].sort_values("row")
        assert ens["y_true"].isna().tolist() == [i in missing for i in range(len(y))]
        np.testing.assert_allclose(ens["y_true"].dropna(), np.delete(y, missing))
        assert run_cli("evaluate", "--predictions", out) == 0
        cap = capsys.readouterr()
        assert f"predict ({len(y) - 3} rows)" in cap.out and "left out 3 rows" in cap.err
