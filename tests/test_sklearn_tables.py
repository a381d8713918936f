"""The estimators on pandas DataFrames as a notebook passes them (text columns, so the table
path of `ensemble.runs.estimator_tables`): the targets and rows it refuses as scikit-learn's
array path refuses them; a regressor's validation targets, refused the same on either path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ensemble.sklearn import DeepEnsembleClassifier, DeepEnsembleRegressor

TINY = dict(n_members=2, hidden=(4,), epochs=1, random_state=0)


@pytest.fixture
def frame():
    rng = np.random.default_rng(0)
    return pd.DataFrame({"size": rng.normal(size=12), "colour": ["red", "blue"] * 6})


@pytest.mark.parametrize("est, y", [
    (DeepEnsembleClassifier(**TINY), pd.Series(["yes", "no", np.nan] * 4)),
    (DeepEnsembleRegressor(**TINY), pd.Series([1.5, np.nan, 2.0] * 4)),
    (DeepEnsembleRegressor(**TINY), pd.Series([1.5, np.inf, 2.0] * 4)),
    (DeepEnsembleRegressor(**TINY), pd.Series([1.5, None, 2.0] * 4, dtype=object)),
    (DeepEnsembleRegressor(**TINY), [1.5, None, 2.0] * 4),
])
def test_missing_targets_are_refused(frame, est, y):
    with pytest.raises(ValueError, match="Input (y )?contains (NaN|infinity)"):
        est.fit(frame, y)
    assert not hasattr(est, "member_weights_")
    with pytest.raises(ValueError, match="Input (y )?contains (NaN|infinity)"):
        est.fit(frame[["size"]], y)  # the array path


def test_no_rows_are_refused_as_on_the_array_path(frame):
    with pytest.raises(ValueError, match=r"0 sample\(s\).*minimum of 1"):
        DeepEnsembleClassifier(**TINY).fit(frame.head(0), pd.Series([], dtype=object))


@pytest.mark.parametrize("table", [True, False])
def test_missing_validation_targets_of_a_regressor_are_refused(frame, table):
    x = frame if table else frame[["size"]]
    y_val = np.r_[np.nan, np.ones(11)]
    with pytest.raises(ValueError, match="Input y_val contains NaN"):
        DeepEnsembleRegressor(**TINY).fit(x, np.arange(12.0), validation_data=(x, y_val))


@pytest.mark.parametrize("param, value", [
    ("impute", "mean"), ("impute", None), ("categorical", "colour"), ("categorical", None)])
@pytest.mark.parametrize("table", [True, False])
def test_table_parameters_take_the_config_values_only(frame, param, value, table):
    x = frame.assign(size=np.r_[np.nan, frame["size"][1:]]) if table else frame[["size"]]
    est = DeepEnsembleClassifier(**TINY, **{param: value})
    with pytest.raises(ValueError, match=rf"Expected `{param}` to be .*"
                                         rf"Received: {param}={value!r}$"):
        est.fit(x, ["a", "b"] * 6)


def test_rows_without_the_fitted_names_are_read_by_position(frame):
    y = ["a", "b", "b"] * 4
    named = DeepEnsembleClassifier(**TINY).fit(frame, y)
    expected = named.predict_proba(frame)
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        np.testing.assert_array_equal(named.predict_proba(frame.to_numpy()), expected)
    unnamed = DeepEnsembleClassifier(**TINY).fit(frame.to_numpy(), y)
    np.testing.assert_array_equal(unnamed.predict_proba(frame.to_numpy()), expected)
    with pytest.warns(UserWarning, match="fitted without feature names"):
        np.testing.assert_array_equal(unnamed.predict_proba(frame), expected)
    numbered = frame.set_axis([0, 1], axis=1)  # names scikit-learn does not compare
    by_number = DeepEnsembleClassifier(**TINY).fit(numbered, y)
    np.testing.assert_array_equal(by_number.predict_proba(numbered[[1, 0]]), expected)
    np.testing.assert_array_equal(by_number.predict_proba(frame.to_numpy()), expected)


def test_hints_name_columns_with_spaces_in_the_estimators_terms(capsys):
    n = 60
    x = pd.DataFrame({"sepal length (cm)": np.arange(n) * 3.0, "flower colour": ["x", "y"] * 30,
                      "plant name": [f"p{i}" for i in range(n)]})
    DeepEnsembleClassifier(**TINY).fit(x, [0, 1, 1] * 20)
    err = capsys.readouterr().err
    assert "anyway: categorical=['flower colour', 'plant name']\n" in err
    assert "an id?): it is used as a feature; leave it out of X\n" in err
    dates = x.assign(**{"visit date": pd.date_range("2020", periods=n)})
    with pytest.raises(ValueError, match=r"leave it out of X, or convert it") as exc:
        DeepEnsembleClassifier(**TINY).fit(dates, [0, 1] * 30)
    marked = x.assign(**{"blood pressure": ["?"] + ["80"] * (n - 1)})
    hint = r"see impute=\), or one-hot encode every value with categorical=\['flower colour', "
    with pytest.raises(ValueError, match=hint + r"'blood pressure'\]\.$") as exc2:
        DeepEnsembleClassifier(**TINY).fit(marked, [0, 1] * 30)
    assert "--" not in str(exc.value) + str(exc2.value) + err


@pytest.mark.parametrize("as_frame", [True, False])
def test_impute_fills_new_rows_when_training_had_no_missing_value(as_frame):
    x = pd.DataFrame(np.random.default_rng(1).normal(size=(20, 2)), columns=["a", "b"])
    holes = x.head(4).assign(a=np.nan)
    filled = x.head(4).assign(a=x["a"].median())
    if not as_frame:
        x, holes, filled = x.to_numpy(), holes.to_numpy(), filled.to_numpy()
    est = DeepEnsembleClassifier(**TINY, impute="median", validation_fraction=0).fit(
        x, [0, 1] * 10)  # every row: the fill is the median of x
    np.testing.assert_array_equal(est.predict_proba(holes), est.predict_proba(filled))


def test_a_saved_array_table_estimator_reads_arrays_after_load(tmp_path):
    """Fitted on an array (impute set, or text objects), saved and loaded: new arrays are
    read by position as before the save (they were refused as 'columns matched by name')."""
    rng = np.random.default_rng(2)
    numbers = rng.normal(size=(20, 3))
    texts = numbers.astype(object)
    texts[:, 2] = np.where(numbers[:, 2] > 0, "u", "v")
    for x, params in ((numbers, {"impute": "median"}), (texts, {})):
        est = DeepEnsembleClassifier(**TINY, **params).fit(x, [0, 1] * 10)
        est.save(tmp_path / "clf", overwrite=True)
        loaded = DeepEnsembleClassifier.load(tmp_path / "clf")
        np.testing.assert_allclose(loaded.predict_proba(x[:5]), est.predict_proba(x[:5]),
                                   atol=1e-6)


def test_a_row_as_a_series_is_refused_naming_its_shape(frame):
    est = DeepEnsembleClassifier(**TINY).fit(frame, ["a", "b"] * 6)
    with pytest.raises(ValueError, match=r"Expected a 2D table \[n_rows, n_columns\]\. "
                                         r"Received: Series of shape \(2,\) .*X\.iloc\[\[i\]\]"):
        est.predict(frame.iloc[0])
    assert est.predict(frame.iloc[[0]]).shape == (1,)


def test_a_column_of_date_objects_is_named_as_dates(frame):
    import datetime

    days = frame.assign(day=[datetime.date(2024, 1, i + 1) for i in range(12)])
    with pytest.raises(ValueError, match=r"column 'day' holds dates or times \(date32"):
        DeepEnsembleClassifier(**TINY).fit(days, ["a", "b"] * 6)


def test_a_loaded_table_estimator_refuses_an_array_naming_its_columns(frame, tmp_path):
    y = ["a", "b", "b"] * 4
    DeepEnsembleClassifier(**TINY).fit(frame, y).save(tmp_path / "clf")
    loaded = DeepEnsembleClassifier.load(tmp_path / "clf")
    assert loaded.score(frame[["colour", "size"]], y) == loaded.score(frame, y)
    with pytest.raises(ValueError, match=r"predicts DataFrames, columns matched by name "
                                         r"\(size, colour\)\. Received: ndarray"):
        loaded.predict(frame.to_numpy())


def test_a_numeric_array_under_impute_stays_numeric_on_the_table_path():
    from ensemble.runs import estimator_tables

    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    frame = estimator_tables._frame(DeepEnsembleClassifier(impute="median"), x)
    assert list(frame.dtypes) == [np.float32] * 3  # not one Python object per value
    mixed = estimator_tables._frame(DeepEnsembleClassifier(), [[1.5, "red"], [2.0, "blue"]])
    assert mixed["x0"].tolist() == [1.5, 2.0] and mixed["x1"].tolist() == ["red", "blue"]


def test_categorical_takes_any_list_of_names(frame):
    """`df.select_dtypes("object").columns` (a pandas Index), a Series or a set of names, as
    a list of them: the same members (they were refused after the parameter check came)."""
    y = ["a", "b", "b"] * 4
    x = frame.assign(size=np.round(frame["size"]))
    expected = DeepEnsembleClassifier(**TINY, categorical=["colour", "size"]).fit(x, y) \
        .predict_proba(x)
    for names in (x.columns, pd.Series(["colour", "size"]), {"size", "colour"}):
        got = DeepEnsembleClassifier(**TINY, categorical=names).fit(x, y).predict_proba(x)
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match=r"Received: categorical=\{'colour': 1\}"):
        DeepEnsembleClassifier(**TINY, categorical={"colour": 1}).fit(x, y)


def test_a_named_index_of_a_frame_is_never_a_feature(frame):
    """`df.set_index('id')`: the estimators read the frame's columns alone
    (`Table.from_pandas(preserve_index=False)`), as a Parquet file's named index is an
    identifier on the CLI's path."""
    from ensemble.runs import estimator_tables

    indexed = frame.assign(id=np.arange(100, 112)).set_index("id")
    ds = estimator_tables._dataset(DeepEnsembleClassifier(), indexed, None)
    assert ds.columns == ("size", "colour") and ds.identifiers == ()


def test_a_numeric_dataframe_fits_without_a_feature_names_warning():
    """The rows `validation_fraction` carves from a DataFrame's X are X's, already checked:
    checked again as an array they warned 'X does not have valid feature names'."""
    import warnings

    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(120, 3)), columns=["a", "b", "c"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clf = DeepEnsembleClassifier(n_members=2, hidden=(8,), epochs=2).fit(
            X, np.where(X["a"] > 0, "up", "down"))
        reg = DeepEnsembleRegressor(n_members=2, hidden=(8,), epochs=2).fit(X, X["b"] * 2)
        assert clf.predict(X.head()).shape == (5,) and reg.predict(X.head()).shape == (5,)
    assert len(clf.history_) == 2 * 2  # members x epochs, and validation rows were carved
    assert clf.history_["val_loss"].notna().all()
