"""`DeepEnsembleClassifier` beyond scikit-learn's checks: the same members as the in-graph
builder and as between-graph clients, scikit-learn's model selection, validation data, fitted
aggregators, run directories and pickling."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from sklearn.datasets import load_iris

from conftest import ROOT
from ensemble.core import artifacts
from ensemble.core.errors import UsageError
from ensemble.tasks.classification import metrics
from ensemble.sklearn import DeepEnsembleClassifier

SMALL = dict(n_members=2, hidden=(8,), dropout=0.0, epochs=4, learning_rate=0.02,
             batch_size=16)


@pytest.fixture(scope="module")
def iris():
    x, y = load_iris(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], np.asarray(["setosa", "versicolor", "virginica"])[y[order]]
    return x[:110], y[:110], x[110:], y[110:]


@pytest.fixture(scope="module")
def fitted(iris):
    x, y, xv, yv = iris
    return DeepEnsembleClassifier(**SMALL, random_state=7).fit(x, y, validation_data=(xv, yv))


def test_import_ensemble_stays_light():
    code = ("import sys, ensemble; ensemble.DeepEnsembleClassifier; "
            "ensemble.DeepEnsembleRegressor; "
            "print('tensorflow' in sys.modules, 'pipelines' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_validation_data_gives_history_and_fitted_aggregator(iris, fitted):
    x, y, xv, yv = iris
    hist = fitted.history_
    assert sorted(hist["epoch"].unique()) == [0, 1, 2, 3]
    last = hist[hist["epoch"] == 3].sort_values("member")
    members = fitted.predict_members(xv)
    y_idx = np.searchsorted(fitted.classes_, yv)
    for k in range(2):
        assert last["val_loss"].iloc[k] == pytest.approx(metrics.nll(y_idx, members[k]), rel=1e-5)
    assert fitted.score(x, y) > 0.8
    np.testing.assert_allclose(fitted.predict_proba(xv), members.mean(axis=0), atol=1e-6)
    with pytest.raises(ValueError, match="validation_data"):
        DeepEnsembleClassifier(**SMALL, aggregator="temperature",
                               validation_fraction=0).fit(x, y)
    temp = DeepEnsembleClassifier(**SMALL, random_state=7, aggregator="temperature").fit(
        x, y, validation_data=(xv, yv))
    t = temp.aggregators_["params"]["temperature"]["temperature"]
    assert temp.aggregators_["n_rows"] == len(xv) and t > 0
    logits = np.log(np.clip(members.mean(axis=0), 1e-12, None)) / t  # the same members
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(temp.predict_proba(xv), expected, atol=1e-4)


def test_bad_parameters_name_the_parameter(iris):
    x, y, _, _ = iris
    with pytest.raises(ValueError, match=r"`n_members` to be positive.*n_members=0"):
        DeepEnsembleClassifier(n_members=0).fit(x, y)
    with pytest.raises(ValueError, match=r"^Expected `learning_rate` to be a number\. "
                                         r"Received: learning_rate='fast'$"):
        DeepEnsembleClassifier(learning_rate="fast").fit(x, y)
    with pytest.raises(ValueError, match=r"^Expected `hidden\[1\]` to be an integer\. "
                                         r"Received: hidden\[1\]='a'$"):
        DeepEnsembleClassifier(hidden=[4, "a"]).fit(x, y)
    with pytest.raises(ValueError, match="mode"):
        DeepEnsembleClassifier(mode="sideways").fit(x, y)
    with pytest.raises(ValueError, match=r"not in y's classes"):
        DeepEnsembleClassifier(**SMALL).fit(x, y, validation_data=(x[:2], ["a", "b"]))


def test_pipeline_cross_validation_and_grid_search(iris):
    from sklearn.model_selection import GridSearchCV, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler

    x, y, _, _ = iris
    pipe = make_pipeline(MinMaxScaler(), DeepEnsembleClassifier(**SMALL, random_state=0))
    scores = cross_val_score(pipe, x, y, cv=3)
    assert len(scores) == 3 and scores.min() > 0.6
    grid = GridSearchCV(DeepEnsembleClassifier(**SMALL, random_state=0),
                        {"epochs": [1, 6], "hidden": [(8,), (16,)]}, cv=2).fit(x, y)
    assert grid.best_params_["epochs"] == 6  # more training wins on iris
    assert grid.best_estimator_.score(x, y) > 0.8


def test_save_load_pickle_and_run_api(iris, fitted, tmp_path):
    import pandas as pd

    import ensemble

    x, y, xv, yv = iris
    kept = DeepEnsembleClassifier(**SMALL, random_state=7, run_dir=tmp_path / "kept",
                                  validation_fraction=0).fit(x, y)
    manifest = artifacts.read_manifest(tmp_path / "kept")
    assert manifest["mode"] == "in-graph" and manifest["status"] == "completed"
    assert manifest["dataset"]["rows"] == {"train": len(x)}
    assert kept.history_["val_loss"].isna().all()  # no validation_data
    expected = fitted.predict_proba(xv)
    path = fitted.save(tmp_path / "clf")
    with pytest.raises(ValueError, match=r"already holds a run; pass save\(path, "
                                         r"overwrite=True\) to replace it"):
        fitted.save(path)
    fitted.save(path, overwrite=True)
    loaded = DeepEnsembleClassifier.load(path)
    np.testing.assert_allclose(loaded.predict_proba(xv), expected, atol=1e-6)
    assert loaded.get_params()["n_members"] == 2 and list(loaded.classes_) == list(
        fitted.classes_)
    clone = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(clone.predict_proba(xv), expected)
    run = ensemble.load_run(path)
    table = run.predict(xv, layout="long")
    ens = table[table["model"] == "ensemble-mean"].sort_values("row")
    assert list(ens["y_pred"]) == list(fitted.predict(xv))
    # named columns come back as feature_names_in_
    cols = [f"c{i}" for i in range(4)]
    named = DeepEnsembleClassifier(**SMALL, random_state=7).fit(pd.DataFrame(x, columns=cols), y)
    back = DeepEnsembleClassifier.load(named.save(tmp_path / "named"))
    assert list(back.feature_names_in_) == cols
    np.testing.assert_allclose(back.predict_proba(pd.DataFrame(xv, columns=cols)),
                               named.predict_proba(pd.DataFrame(xv, columns=cols)), atol=1e-6)


def test_between_graph_gives_the_in_graph_members(iris, fitted, tmp_path, monkeypatch):
    """Member 0 trained alone by a between-graph client process equals member 0 of the
    two-member in-graph ensemble: members depend on (seed, index) only, not on the mode or
    the member count (one member: one client process, the test's cost)."""
    x, y, xv, yv = iris
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    between = DeepEnsembleClassifier(**{**SMALL, "n_members": 1}, random_state=7,
                                     mode="between-graph").fit(x, y, validation_data=(xv, yv))
    assert list(scratch.iterdir()) == []  # its temporary run directory is gone
    np.testing.assert_allclose(between.predict_members(xv)[0], fitted.predict_members(xv)[0],
                               atol=1e-5)
    ours = fitted.history_[fitted.history_["member"] == 0]
    np.testing.assert_allclose(between.history_["val_loss"], ours["val_loss"], rtol=1e-5)


def test_same_members_as_ensemble_train_on_the_same_rows(tmp_path):
    """The estimator trains through the CLI's blocks: given the training rows of an
    `ensemble train` run (raw, in the run's order), the same seed gives the same members;
    also after a fit with another seed on the same cached graphs (they reset to a fresh
    build)."""
    import ensemble
    from ensemble.models.members import load_member

    run = ensemble.train({"data": {"source": "iris"},
                          "members": {"count": 2, "hidden": [8], "dropout": 0.1},
                          "training": {"epochs": 3, "batch_size": 16, "learning_rate": 0.02,
                                       "seed": 4, "early_stopping": 0},  # fit has no validation
                          "placement": {"devices": "cpu:2"}}, run_dir=tmp_path / "run")
    with pytest.raises(UsageError, match=r"already holds a run; pass overwrite=True to "
                       r"replace it or choose another run_dir"):  # train's own words
        ensemble.train({"data": {"source": "iris"}}, run_dir=tmp_path / "run")
    rows = artifacts.read_split(run.path, "train")[2]
    x, y = load_iris(return_X_y=True)
    DeepEnsembleClassifier(n_members=2, hidden=(8,), dropout=0.1, epochs=2, batch_size=16,
                           learning_rate=0.02, random_state=9, devices="cpu:2").fit(x, y)
    est = DeepEnsembleClassifier(n_members=2, hidden=(8,), dropout=0.1, epochs=3,
                                 batch_size=16, learning_rate=0.02, random_state=4,
                                 devices="cpu:2", validation_fraction=0).fit(x[rows], y[rows])
    for k in range(2):
        theirs = load_member(artifacts.member_model_path(run.path, k), "/device:CPU:0")
        for a, b in zip(est.member_weights_[k], theirs.get_weights(), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
    # the notebook API on the same run: metrics, evaluate, predict(DataFrame)
    assert run.status == "completed" and run.mode == "in-graph"
    stored = run.metrics
    assert set(stored["split"]) == {"validation", "test"}
    np.testing.assert_allclose(run.evaluate()["nll"], stored["nll"], equal_nan=True)
    frame = load_iris(as_frame=True).frame
    test_rows = artifacts.read_split(run.path, "test")[2]
    got = run.predict(frame.iloc[test_rows], layout="long")
    want = run.predictions.query("split == 'test'")
    cols = [c for c in want.columns if c.startswith("p_")]
    for model in ("member-0", "ensemble-mean"):
        a = got[got["model"] == model].sort_values("row")
        b = want[want["model"] == model].sort_values("row")
        np.testing.assert_allclose(a[cols].to_numpy(), b[cols].to_numpy(), atol=1e-6)
        assert list(a["y_true"]) == list(b["y_true"])  # the target column is read too


def test_ood_detection_matches_scikit_learn(fitted, iris):
    from scipy.stats import entropy
    from sklearn.metrics import roc_auc_score

    _, _, xv, _ = iris
    far = xv * 4.0 + 10.0  # far outside the training range
    table = fitted.ood_detection(xv, far)
    row = table[(table.model == "ensemble-mean") & (table.score == "entropy")].iloc[0]
    h_in = entropy(fitted.predict_members(xv).mean(axis=0), axis=1)
    h_out = entropy(fitted.predict_members(far).mean(axis=0), axis=1)
    expected = roc_auc_score(np.r_[np.zeros(len(xv)), np.ones(len(far))], np.r_[h_in, h_out])
    assert row.auroc == pytest.approx(expected, abs=1e-6)
    assert table.score.nunique() == 3 and row.n_in == len(xv) == row.n_out


def test_labels_mixing_text_and_numbers_are_refused_before_tensorflow_loads():
    import subprocess
    import sys

    code = """
import sys
import numpy as np, pandas as pd
from ensemble.sklearn import DeepEnsembleClassifier
y = np.array([0, 1, 2] * 20, dtype=object)
y[::7] = "high"
try:
    DeepEnsembleClassifier(n_members=1, epochs=1).fit(pd.DataFrame({"x": np.arange(60.0)}), y)
except ValueError as exc:
    print(exc)
print("tensorflow" in sys.modules)
"""
    from conftest import ROOT

    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120).stdout.splitlines()
    assert out[0].startswith("y mixes text and numbers: 51 rows hold numbers (such as 1)")
    assert "9 hold text (such as 'high')" in out[0] and out[1] == "False"


def test_validation_fraction_holds_rows_out_for_early_stopping():
    """Without validation_data, a tenth of the rows (stratified) is held out: members train
    on the rest and report val_loss on it; validation_data given wins; 0 keeps every row."""
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    clf = DeepEnsembleClassifier(n_members=1, epochs=2, hidden=(8,), random_state=0).fit(X, y)
    assert clf.n_rows_ == {"train": 135, "validation": 15}
    assert clf.history_.val_loss.notna().all()
    given = DeepEnsembleClassifier(n_members=1, epochs=2, hidden=(8,), random_state=0).fit(
        X[::2], y[::2], validation_data=(X[1::2], y[1::2]))
    assert given.n_rows_ == {"train": 75, "validation": 75}
    every = DeepEnsembleClassifier(n_members=1, epochs=2, hidden=(8,), random_state=0,
                                   validation_fraction=0).fit(X, y)
    assert every.n_rows_ == {"train": 150} and every.history_.val_loss.isna().all()
    with pytest.raises(ValueError, match=r"validation_fraction=1\.5"):
        DeepEnsembleClassifier(validation_fraction=1.5).fit(X, y)
