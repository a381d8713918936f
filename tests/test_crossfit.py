"""Predict's default aggregator is chosen out of fold: a fitted aggregator that overfits a small
validation split does not win by its in-sample NLL (`ensemble.tasks.crossfit`)."""

import numpy as np
import pytest
from sklearn.model_selection import KFold

from ensemble import tasks
from ensemble.runs import posthoc
from ensemble.tasks import crossfit
from ensemble.tasks.choice import default_aggregator
from ensemble.tasks.classification import fitted
from ensemble.tasks.classification import metrics as M

CLS = tasks.get("classification")
REG = tasks.get("regression")


def _noise(rng, n, members=6, classes=3):
    """Members that know nothing: Dirichlet probabilities, labels drawn apart from them."""
    return rng.dirichlet(np.ones(classes), size=(members, n)), rng.integers(0, classes, n)


def test_an_overfitting_weighting_loses_to_the_mean_out_of_fold():
    rng = np.random.default_rng(0)
    probs, y = _noise(rng, 30)
    names = ["mean", "weighted", "greedy"]
    fit = CLS.fit_aggregators(probs, y, names, list(range(6)))
    # in sample the fitted weights look better than the mean ...
    assert fit["validation_nll"]["weighted"] < fit["validation_nll"]["mean"] - 0.03
    # ... on 20,000 fresh rows of the same process they are worse: the mean is the right answer
    fresh, y_fresh = _noise(rng, 20_000)
    test = {a: M.nll(y_fresh, CLS.aggregate(fresh, a, fit["params"].get(a))) for a in names}
    assert test["mean"] < test["weighted"] and test["mean"] < test["greedy"]
    assert default_aggregator(names, fit) == "mean"


def _sure_members(rng, n, wrong=0.05, members=4, classes=3):
    """Members that agree, right on all but a share `wrong` of the rows, each giving its
    class 0.9 (on rows all right, a sharper temperature looks better)."""
    y = rng.integers(0, classes, n)
    said = np.where(rng.random(n) < wrong, (y + 1) % classes, y)
    p = np.full((members, n, classes), 0.1 / (classes - 1))
    p[:, np.arange(n), said] = 0.9
    return p, y


def test_a_validation_split_without_mistakes_keeps_the_mean():
    """30 rows the mean gets all right: every held-out fold says a temperature near 0 costs
    nothing, so cross-fitting alone still chose it; the first wrong test row pays for it."""
    rng = np.random.default_rng(2)
    probs, y = _sure_members(rng, 30)
    assert np.all(probs.mean(0).argmax(1) == y)  # no mistake among them
    names = ["mean", "temperature"]
    fit = CLS.fit_aggregators(probs, y, names, list(range(4)))
    assert fit["params"]["temperature"]["temperature"] < 0.2  # sharpened five-fold or more
    assert fit["validation_nll"]["temperature"] < 1e-3
    assert fit["out_of_fold"]["mistakes"] == 0 and fit["out_of_fold_nll"]["temperature"] is None
    assert default_aggregator(names, fit) == "mean"
    fresh, y_fresh = _sure_members(rng, 20_000)  # 5% wrong rows
    sharp = CLS.aggregate(fresh, "temperature", fit["params"]["temperature"])
    assert M.nll(y_fresh, fresh.mean(0)) < M.nll(y_fresh, sharp) / 2
    # one mistake among the rows: the fold holding it prices the sharpening
    probs[:, 0] = np.roll(probs[:, 0], 1, axis=-1)
    fit = CLS.fit_aggregators(probs, y, names, list(range(4)))
    assert fit["out_of_fold"]["mistakes"] == 1
    assert fit["out_of_fold_nll"]["temperature"] > fit["out_of_fold_nll"]["mean"]
    assert default_aggregator(names, fit) == "mean"


def test_out_of_fold_nll_is_the_held_out_folds_nll():
    rng = np.random.default_rng(1)
    probs, y = _noise(rng, 40)
    scores, how = crossfit.out_of_fold_nll(CLS, probs, y, ["mean", "weighted"],
                                           {"weights": ()}, None)
    mistakes = int(np.sum(probs.mean(0).argmax(1) != y))
    assert how == {"folds": 5, "rows": 40, "mistakes": mistakes} and mistakes > 0
    # by hand: every class has >= 5 rows, so stratified folds; weights fitted on 4 of them
    from sklearn.model_selection import StratifiedKFold

    held = np.empty((40, 3))
    for a, b in StratifiedKFold(5, shuffle=True, random_state=0).split(np.zeros(40), y):
        w = fitted.fit_weights(probs[:, a], y[a])["weights"]
        held[b] = np.tensordot(w, probs[:, b], axes=1)
    assert scores["weighted"] == pytest.approx(-np.mean(np.log(held[np.arange(40), y])),
                                               rel=1e-6)  # float32 rows
    # the mean fits nothing: its out-of-fold NLL is its NLL on all rows
    assert scores["mean"] == pytest.approx(-np.mean(np.log(probs.mean(0)[np.arange(40), y])))


def test_std_scaling_out_of_fold_by_hand():
    rng = np.random.default_rng(2)
    n = 25
    mu = rng.normal(size=n) + 0.1 * rng.normal(size=(3, n))  # members that agree
    out = np.stack([mu, np.full((3, n), 0.25)], axis=-1)  # members' variance 0.25: too sure
    y = mu.mean(0) + rng.normal(size=n)
    scores, how = crossfit.out_of_fold_nll(REG, out, y, ["mean", "std-scaling"], {}, None)
    total = 0.0
    for a, b in KFold(5, shuffle=True, random_state=0).split(np.zeros(n)):
        m, v = mu.mean(0), 0.25 + mu.var(0)  # the moment-matched mixture
        s2 = np.mean((y[a] - m[a]) ** 2 / v[a])
        var = s2 * v[b]
        total += np.sum(0.5 * np.log(2 * np.pi * var) + (y[b] - m[b]) ** 2 / (2 * var))
    assert how["folds"] == 5
    assert scores["std-scaling"] == pytest.approx(total / n, rel=1e-9)
    assert scores["std-scaling"] < scores["mean"]  # the overconfident mean gains from it


def test_folds_cover_every_row_once_and_fall_back():
    y = np.array([0] * 7 + [1] * 3)  # class 1 has 3 rows: no stratified 5 folds
    pairs = crossfit.folds(y, stratified=True)
    held = np.sort(np.concatenate([b for _, b in pairs]))
    np.testing.assert_array_equal(held, np.arange(10))
    assert len(pairs) == 5
    assert len(crossfit.folds(np.array([0, 1, 0]), stratified=True)) == 3  # k lowered to rows
    assert crossfit.folds(np.array([0]), stratified=True) == []
    scores, how = crossfit.out_of_fold_nll(CLS, np.full((2, 1, 2), 0.5), np.array([0]),
                                           ["mean", "temperature"], {}, None)
    assert scores["temperature"] is None and scores["mean"] == pytest.approx(np.log(2))


def test_sample_rows_caps_and_is_seeded(monkeypatch):
    assert len(crossfit.sample_rows(50, cap=100)) == 50
    rows = crossfit.sample_rows(1000, cap=100)
    assert len(set(rows)) == 100 and np.all(np.diff(rows) > 0)
    np.testing.assert_array_equal(rows, crossfit.sample_rows(1000, cap=100))
    monkeypatch.setattr(crossfit, "MAX_ROWS", 60)
    probs, y = _noise(np.random.default_rng(3), 200)
    assert crossfit.out_of_fold_nll(CLS, probs, y, ["mean"], {}, None)[1]["rows"] == 60


@pytest.mark.parametrize("fit, expected", [
    ({"validation_nll": {"mean": 0.5, "temperature": 0.1},
      "out_of_fold_nll": {"mean": 0.5, "temperature": 0.9}}, "mean"),
    ({"validation_nll": {"mean": 0.5, "temperature": 0.1}}, "temperature"),  # an older run
    ({"out_of_fold_nll": {"mean": 0.5, "temperature": 0.4}}, "temperature"),
])
def test_choice_ranks_the_out_of_fold_nll(fit, expected):
    assert default_aggregator(["mean", "temperature"], fit) == expected


def test_small_validation_notice(capsys):
    probs, y = _noise(np.random.default_rng(4), 30)
    split = posthoc.SplitMembers(list(range(6)), probs, np.arange(30), y)
    fit = posthoc.fit(CLS, {"validation": split}, ["mean", "temperature"])
    err = capsys.readouterr().err
    assert "(temperature) are fitted on only 30 validation rows" in err
    assert "data.validation_size" in err and "--aggregator mean" in err
    assert fit["out_of_fold"] == {"folds": 5, "rows": 30,
                                  "mistakes": int(np.sum(probs.mean(0).argmax(1) != y))}
    posthoc.fit(CLS, {"validation": split}, ["mean", "vote"])  # nothing fitted: silent
    assert crossfit.small_validation_notice(100, ["temperature"]) is None
    assert capsys.readouterr().err == ""


def test_stacking_with_a_given_c_skips_the_search():
    probs, y = _noise(np.random.default_rng(5), 60)
    p = fitted.fit_stacking(probs, y, folds=5, c=0.01)
    assert p["C"] == 0.01 and p["folds"] == 0
    from sklearn.linear_model import LogisticRegression

    from ensemble.tasks.classification import aggregators as A
    ref = LogisticRegression(C=0.01, max_iter=1000).fit(A.stacking_features(probs), y)
    np.testing.assert_allclose(p["coef"], ref.coef_, atol=1e-6)


def test_evaluate_prints_the_out_of_fold_nll():
    from ensemble.tasks.report import fitted_lines

    fit = {"members": [0, 1], "n_rows": 30, "params": {"temperature": {"temperature": 0.2}},
           "out_of_fold_nll": {"mean": 0.5, "vote": None, "temperature": 0.75},
           "out_of_fold": {"folds": 5, "rows": 30}}
    lines = fitted_lines(fit, lambda name, p: f"T = {p['temperature']:.3f}")
    assert lines[-2:] == ["out-of-fold validation NLL (5-fold cross-fitting on 30 rows; the "
                          "lowest is predict's default):", "  mean 0.5000, temperature 0.7500"]
    blind = fitted_lines({**fit, "out_of_fold": {"folds": 5, "rows": 30, "mistakes": 0}},
                         lambda *a: None)
    assert blind[-1].startswith("  the mean gets every one of these rows right")
    assert fitted_lines({**fit, "out_of_fold_nll": None}, lambda *a: None)[-1] == \
        "fitted on the validation split (30 rows):"  # a run from before them


def test_one_aggregator_is_not_cross_fitted(monkeypatch):
    """An estimator fits the one aggregator it names: nothing to choose, so no cross-fitting
    (it cost stacking 0.21 -> 0.91 s on 900 rows)."""
    rng = np.random.default_rng(1)
    probs, y = _sure_members(rng, 200)
    called = []
    monkeypatch.setattr(crossfit, "out_of_fold_nll", lambda *a, **k: called.append(a))
    fit = CLS.fit_aggregators(probs, y, ["temperature"], list(range(4)))
    assert called == [] and fit["out_of_fold"]["folds"] == 0
    assert fit["out_of_fold_nll"] == fit["validation_nll"]
    assert default_aggregator(["temperature"], fit) == "temperature"
    from ensemble.tasks.report import fitted_lines

    lines = fitted_lines(fit, lambda name, p: f"T = {p['temperature']:.3f}")
    assert lines[0] == "fitted on the validation split (200 rows):"
    assert not any("cross-fitting" in line for line in lines)  # one aggregator: no choice


def test_aggregators_that_fit_nothing_draw_no_folds(monkeypatch):
    """`mean` and `vote` are scored on every validation row: no folds are drawn (scikit-learn's
    model selection is not imported for them, 0.6 s of a short run)."""
    rng = np.random.default_rng(3)
    probs, y = _noise(rng, 40)
    monkeypatch.setattr(crossfit, "folds", lambda *a, **k: pytest.fail("folds drawn"))
    fit = CLS.fit_aggregators(probs, y, ["mean", "vote"], list(range(6)))
    assert fit["out_of_fold"]["folds"] == 0 and fit["out_of_fold"]["rows"] == 40
    mean_nll = -np.mean(np.log(probs.mean(0)[np.arange(40), y]))
    assert fit["out_of_fold_nll"]["mean"] == pytest.approx(mean_nll, rel=1e-6)
    assert fit["out_of_fold_nll"]["vote"] is None
