"""Aggregators beyond mean/vote and their fitting: hand-computed values, ensemble selection on a
case a reader can follow, stacking against scikit-learn, TensorFlow twins, no test row in a fit."""

import numpy as np
import pytest

from ensemble.tasks.classification import aggregators as A
from ensemble import tasks
from ensemble.tasks.classification import fitted
from ensemble.runs import posthoc
from ensemble.tasks import tables
from ensemble.tasks.predicted import SplitPredictions
from ensemble.tasks.classification import metrics as M
from ensemble.core.errors import UsageError

PROBS = np.array([
    [[0.7, 0.2, 0.1], [0.1, 0.5, 0.4]],
    [[0.2, 0.6, 0.2], [0.1, 0.3, 0.6]],
    [[0.6, 0.3, 0.1], [0.3, 0.3, 0.4]],
], dtype=np.float32)

# Greedy case (2 classes, 2 rows, both of class 0). A is sure and right on row 0, unsure on
# row 1; B the reverse; C is lukewarm on both. NLL: A = B = (-ln .99 - ln .4) / 2 = 0.463,
# C = -ln .6 = 0.511; A+B averaged gives .695 on both rows: -ln .695 = 0.364, the best.
A_, B_, C_ = [[.99, .01], [.4, .6]], [[.4, .6], [.99, .01]], [[.6, .4], [.6, .4]]
GREEDY = np.array([A_, B_, C_])
GREEDY_Y = np.array([0, 0])


def test_geometric_by_hand():
    g = np.array([[0.7 * 0.2 * 0.6, 0.2 * 0.6 * 0.3, 0.1 * 0.2 * 0.1],
                  [0.1 * 0.1 * 0.3, 0.5 * 0.3 * 0.3, 0.4 * 0.6 * 0.4]]) ** (1 / 3)
    np.testing.assert_allclose(A.geometric(PROBS), g / g.sum(axis=1, keepdims=True), atol=1e-7)


def test_weighted_by_hand():
    expected = (2 * PROBS[0] + PROBS[1] + PROBS[2]) / 4
    np.testing.assert_allclose(A.weighted(PROBS, [2, 1, 1]), expected, atol=1e-7)
    with pytest.raises(UsageError, match="3 non-negative member weights"):
        A.weighted(PROBS, [1, -1, 1])


def test_temperature_by_hand():
    # mean [0.8, 0.2] at T = 2: sqrt(.8) / (sqrt(.8) + sqrt(.2)) = 2/3
    p = np.array([[[0.8, 0.2]], [[0.8, 0.2]]])
    np.testing.assert_allclose(A.temperature_scaled(p, 2.0), [[2 / 3, 1 / 3]], atol=1e-7)
    np.testing.assert_allclose(A.temperature_scaled(p, 1.0), [[0.8, 0.2]], atol=1e-7)


def test_stacking_apply_by_hand():
    # one member, identity coefficients: softmax of the probabilities themselves
    p = np.array([[[1.0, 0.0]]])
    e = np.e
    np.testing.assert_allclose(A.stacked(p, np.eye(2), [0.0, 0.0]),
                               [[e / (e + 1), 1 / (e + 1)]], atol=1e-7)
    with pytest.raises(UsageError, match="do not fit"):
        A.stacked(PROBS, np.eye(3), np.zeros(3))


def test_fitted_aggregator_without_parameters_is_refused():
    with pytest.raises(UsageError, match="greedy"):
        A.aggregate(PROBS, "greedy")


def test_greedy_picks_what_a_reader_picks():
    # round 1: A (0.463, tie with B goes to the smaller index); round 2: A+B (0.364);
    # round 3: A+B+A or A+B+B (0.374) or A+B+C (0.41): worse, so the kept prefix is [A, B]
    res = fitted.greedy_selection(GREEDY, GREEDY_Y, rounds=3)
    assert res["order"] == [0, 1, 0]
    assert res["size"] == 2
    assert res["weights"] == [0.5, 0.5, 0.0]


def test_weights_fitted_on_the_simplex():
    # at w = (.5, .5, 0) the NLL gradient is -1 for A and B and -0.6/.695 > -1 for C: optimal
    w = fitted.fit_weights(GREEDY, GREEDY_Y)["weights"]
    np.testing.assert_allclose(w, [0.5, 0.5, 0.0], atol=1e-4)


def test_temperature_fit_matches_a_grid_search():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4) * 0.3, size=(3, 200))
    y = rng.integers(0, 4, 200)
    t = fitted.fit_temperature(probs, y)["temperature"]
    grid = np.exp(np.linspace(np.log(0.05), np.log(20), 4001))
    nlls = [M.nll(y, A.temperature_scaled(probs, g)) for g in grid]
    assert t == pytest.approx(grid[int(np.argmin(nlls))], rel=2e-3)


@pytest.mark.parametrize("n_classes", [2, 4])
def test_stacking_matches_scikit_learn(n_classes):
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(n_classes)
    y = np.repeat(np.arange(n_classes), 30)
    probs = rng.dirichlet(np.ones(n_classes), size=(3, len(y)))
    probs[0, np.arange(len(y)), y] += 1.0  # member 0 informative
    probs /= probs.sum(axis=2, keepdims=True)
    fit = fitted.fit_stacking(probs, y, folds=5)
    new = rng.dirichlet(np.ones(n_classes), size=(3, 50))
    ours = A.stacked(new, fit["coef"], fit["intercept"])
    theirs = LogisticRegression(C=fit["C"], max_iter=1000).fit(
        A.stacking_features(probs), y).predict_proba(A.stacking_features(new))
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    assert fit["folds"] == 5


def test_mutual_information_is_the_mixtures_for_a_sharpened_aggregate():
    """Two confident members that disagree: their mean is uniform (entropy log 2, expected
    entropy ~0), so BALD's mutual information is ~log 2 whatever the aggregate is. A sharpened
    aggregate (temperature 0.2 of the mean of [0.9, 0.1] and [0.6, 0.4]) has an entropy below
    the members' own, which made `entropy - expected_entropy` negative."""
    members = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    sharp = np.array([[0.999, 0.001]])
    u = M.uncertainty(members, sharp)
    assert u["mutual_information"] == pytest.approx([np.log(2)])
    assert u["entropy"] == pytest.approx(M.entropy(sharp))
    soft = np.array([[[0.9, 0.1]], [[0.6, 0.4]]])
    h = lambda p: -np.sum(p * np.log(p), axis=-1)  # noqa: E731
    mi = M.uncertainty(soft, sharp)["mutual_information"]
    assert mi == pytest.approx(h(np.array([0.75, 0.25])) - (h(soft[0]) + h(soft[1])) / 2)
    assert mi[0] > 0 > (M.entropy(sharp) - (h(soft[0]) + h(soft[1])) / 2)[0]


def test_entropy_mutual_information_and_kl_by_hand():
    assert M.entropy(np.array([[0.5, 0.5], [1.0, 0.0]])) == pytest.approx([np.log(2), 0.0])
    members = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # two sure members that disagree
    u = M.uncertainty(members, members.mean(axis=0))
    assert u["entropy"] == pytest.approx([np.log(2)])
    assert u["expected_entropy"] == pytest.approx([0.0])
    assert u["mutual_information"] == pytest.approx([np.log(2)])
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    kl_pq = 0.5 * np.log(0.5 / 0.9) + 0.5 * np.log(0.5 / 0.1)
    kl_qp = 0.9 * np.log(0.9 / 0.5) + 0.1 * np.log(0.1 / 0.5)
    assert M.mean_pairwise_kl(np.array([[p], [q]])) == pytest.approx((kl_pq + kl_qp) / 2)
    assert M.mean_pairwise_kl(np.array([[p]])) == 0.0


def _random(n_members=4, n_rows=120, n_classes=5, seed=0):
    """Random member probabilities `[n_members, n_rows, n_classes]` and balanced labels."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(n_classes) * 0.5, size=(n_members, n_rows)).astype(np.float32)
    return probs, np.tile(np.arange(n_classes), n_rows // n_classes)


def _fit_random(n_members=4, n_rows=120, n_classes=5, seed=0):
    probs, y = _random(n_members, n_rows, n_classes, seed)
    fit = tasks.get().fit_aggregators(probs, y, A.AGGREGATORS, list(range(n_members)))
    return probs, y, fit


@pytest.fixture(scope="module")
def random_fit():
    """`_fit_random()` once for the module: every aggregator fitted (stacking's takes seconds)."""
    return _fit_random()


@pytest.mark.parametrize("name", A.AGGREGATORS)
def test_tensorflow_twin_agrees_with_numpy_for_every_aggregator(name, random_fit):
    from ensemble.tasks.classification.aggregators_tf import aggregate_tf

    _, _, fit = random_fit
    new = np.random.default_rng(9).dirichlet(np.ones(5), size=(4, 300)).astype(np.float32)
    params = fit["params"].get(name)
    np.testing.assert_allclose(aggregate_tf(new, name, params).numpy(),
                               A.aggregate(new, name, params), atol=1e-6)


def _member_table(probs_by_split, y_by_split):
    parts = [tables.predictions_table(s, SplitPredictions(
        dict(enumerate(p)), None, np.arange(p.shape[1]) + 1000 * k, y_by_split[s]),
        np.arange(p.shape[2]), task=tasks.get())
             for k, (s, p) in enumerate(probs_by_split.items())]
    import pyarrow as pa

    return pa.concat_tables(parts)


def test_no_fitted_aggregator_reads_a_test_row():
    probs, y = _random(seed=1)
    test_probs, test_y = _random(seed=2)
    clean = posthoc.by_split(_member_table({"validation": probs, "test": test_probs},
                                           {"validation": y, "test": test_y}), tasks.get())
    poisoned_p = np.roll(test_probs, 1, axis=2)[::-1]  # every test row wrong, members shuffled
    poisoned = posthoc.by_split(_member_table({"validation": probs, "test": poisoned_p},
                                              {"validation": y, "test": (test_y + 1) % 5}),
                                tasks.get())
    names = A.AGGREGATORS
    task = tasks.get()
    assert posthoc.fit(task, clean, names) == posthoc.fit(task, poisoned, names)
    # ... while the test rows themselves do change
    assert not np.allclose(clean["test"].probs, poisoned["test"].probs)


def test_run_predictions_rebuilt_with_uncertainty_columns(random_fit):
    probs, y, fit = random_fit
    splits = posthoc.by_split(_member_table({"validation": probs}, {"validation": y}),
                              tasks.get())
    preds = posthoc.rebuild(splits, tasks.get(), np.arange(5), ["mean", "vote", "greedy"],
                            fit["params"])
    mean = preds.filter(preds.column("model").to_numpy(zero_copy_only=False) == "ensemble-mean")
    mi = mean.column("mutual_information").to_numpy()
    assert np.all(mi >= -1e-12)  # BALD >= 0 for the mean (Jensen)
    vote = preds.filter(preds.column("model").to_numpy(zero_copy_only=False) == "ensemble-vote")
    assert vote.column("entropy").null_count == vote.num_rows
    metrics = tasks.get().metrics_table(preds).to_pylist()
    row = next(r for r in metrics if r["model"] == "ensemble-mean")
    assert row["mean_mutual_information"] == pytest.approx(float(mi.mean()))
    assert row["best_member"] == fit["best_member"]
    member_nll = np.mean([r["nll"] for r in metrics if r["member"] is not None])
    assert row["gain_vs_mean_nll"] == pytest.approx(member_nll - row["nll"])


def test_every_task_declares_each_aggregator_with_its_twin_and_fit():
    from ensemble.core.errors import UsageError
    from ensemble.tasks import base, registry

    for task_class in registry.REGISTRY.values():
        task = task_class()
        assert set(task.default_aggregators) <= set(task.aggregators)
        for name, agg in task.aggregators.items():
            assert callable(base._resolve(agg.twin)), (task.name, name)
            assert agg.fitted == (agg.fit is not None and callable(base._resolve(agg.fit)))
            if agg.fitted:
                with pytest.raises(UsageError, match="parameters are missing"):
                    task.aggregate(np.full((2, 3, 2), 0.5), name)
    assert registry.AGGREGATOR_NAMES[-1] == "std-scaling"  # config's list: every task's


def test_a_task_spec_that_is_not_a_task_is_refused(tmp_path):
    from ensemble.core.errors import UsageError
    from ensemble.tasks import registry

    (tmp_path / "duck.py").write_text("class Duck:\n    def head(self, logits):\n"
                                      "        return logits\n")
    with pytest.raises(UsageError, match="lacks .*n_outputs.*subclass ensemble.tasks"):
        registry.get(f"{tmp_path / 'duck.py'}:Duck")
