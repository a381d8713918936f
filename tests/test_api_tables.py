"""`Run`'s tables as pandas DataFrames with their Parquet dtypes, every method alike:
`metrics`, `evaluate_ood`, `evaluate_shift` and the estimators' `ood_detection` give `member`
as nullable `Int32` (ensemble rows hold none), not float64. And `DeepEnsembleClassifier.load`,
`evaluate_ood` and `evaluate_shift`, first to import TensorFlow in a notebook, print none of its
C++ start-up banners."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import ensemble


def test_member_is_a_nullable_integer_in_every_table(trained, tmp_path):
    run = ensemble.load_run(trained)
    noise = np.random.default_rng(0).uniform(0, 16, (30, len(run.feature_names)))
    pd.DataFrame(noise, columns=run.feature_names).to_csv(tmp_path / "noise.csv", index=False)
    tables = {"metrics": run.metrics, "ood": run.evaluate_ood(noise),
              "ood of a path": run.evaluate_ood(tmp_path / "noise.csv"),
              "shift": run.evaluate_shift()}
    for name, table in tables.items():
        assert table["member"].dtype == pd.Int32Dtype(), name
        assert table["member"].isna().any() and table["member"].max() == 1, name


def test_the_estimators_ood_table_has_the_same_dtypes():
    from ensemble.sklearn import DeepEnsembleClassifier, DeepEnsembleRegressor

    x = np.random.default_rng(0).normal(size=(24, 3))
    far = x * 4 + 10
    for est, y in ((DeepEnsembleClassifier, x[:, 0] > 0), (DeepEnsembleRegressor, x[:, 0])):
        table = est(n_members=2, hidden=(4,), epochs=1, random_state=0).fit(x, y) \
            .ood_detection(x, far)
        assert table["member"].dtype == pd.Int32Dtype(), est.__name__
        assert table["n_in"].dtype == np.int64 and table["member"].isna().any()


def test_loading_an_estimator_first_in_a_process_prints_nothing(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from ensemble.sklearn import DeepEnsembleClassifier

    x = np.random.default_rng(0).normal(size=(20, 2))
    DeepEnsembleClassifier(n_members=2, hidden=(4,), epochs=1).fit(x, x[:, 0] > 0) \
        .save(tmp_path / "clf")
    code = ("import sys; from ensemble.sklearn import DeepEnsembleClassifier as C; "
            f"print(C.load(sys.argv[1]).predict([[0.5, 0.5]]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "clf")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0 and out.stdout.strip() in ("[ True]", "[False]"), out.stderr
    assert [line for line in out.stderr.splitlines() if "cudart_stub" not in line] == []


@pytest.mark.parametrize("call", ["evaluate_ood(np.zeros((5, 64)))", "evaluate_shift()"])
def test_run_evaluations_first_in_a_process_print_nothing(trained, call):
    import os
    import subprocess
    import sys

    from conftest import ROOT

    code = (f"import sys, numpy as np, ensemble; run = ensemble.load_run(sys.argv[1]); "
            f"print(len(run.{call}))")
    out = subprocess.run([sys.executable, "-c", code, str(trained)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0 and int(out.stdout) > 0, out.stderr
    assert [line for line in out.stderr.splitlines()
            if "cudart_stub" not in line and not line.startswith("notice: ")] == []


def test_a_run_saved_by_an_estimator_says_it_has_no_predictions(tmp_path):
    from ensemble.core.errors import UsageError
    from ensemble.sklearn import DeepEnsembleClassifier

    x = np.random.default_rng(0).normal(size=(20, 2))
    DeepEnsembleClassifier(n_members=2, hidden=(4,), epochs=1).fit(x, x[:, 0] > 0) \
        .save(tmp_path / "clf")
    run = ensemble.load_run(tmp_path / "clf")
    for use in (lambda: run.metrics, run.summary, run.evaluate_shift):
        with pytest.raises(UsageError, match=r"has no predictions of its own \(a run saved by "
                                             r"an estimator's save\(\) has no test split\); "
                                             r"evaluate it on labelled rows: `ensemble predict"):
            use()
    assert run.predict(x[:3]).shape[0] == 3


def test_paths_under_the_home_folder_are_expanded(tmp_path, monkeypatch):
    """`~/...` as a notebook user writes it: save, load and load_run use the home folder
    (a folder literally named `~` was made in the working directory, or nothing found)."""
    from ensemble.sklearn import DeepEnsembleClassifier

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    x = np.random.default_rng(0).normal(size=(20, 2))
    clf = DeepEnsembleClassifier(n_members=1, hidden=(4,), epochs=1).fit(x, x[:, 0] > 0)
    clf.save("~/models/clf")
    assert (tmp_path / "home" / "models" / "clf" / "manifest.json").is_file()
    assert not (tmp_path / "~").exists()
    back = DeepEnsembleClassifier.load("~/models/clf")
    np.testing.assert_array_equal(back.predict_proba(x), clf.predict_proba(x))
    assert ensemble.load_run("~/models/clf").path == tmp_path / "home" / "models" / "clf"
