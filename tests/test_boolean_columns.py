"""A boolean column read from a CSV (`True`/`False`, as pandas writes it) is typed bool by
pyarrow at training, so its categories are `true`/`false`; new rows are matched as booleans at
predict, in the Python API and in the exported graph (`preprocessing.BOOL_WORDS`), not as the
text `True`, which was an unknown category on every row (all-zero encoding, other
probabilities, in silence but for a notice). Numbers in a categorical column likewise: one
category from a CSV's `1935.0`, a Parquet float or int, a DataFrame or a served string
(`ensemble.data.spelling`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import run_cli


@pytest.fixture(scope="module")
def bool_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bools")
    rng = np.random.default_rng(0)
    n = 120
    smoker = rng.random(n) > 0.5
    frame = pd.DataFrame({"age": rng.normal(50, 10, n).round(1), "smoker": smoker,
                          "label": np.where(smoker ^ (rng.random(n) > 0.8), "ill", "well")})
    frame.to_csv(tmp / "train.csv", index=False)  # smoker written True / False
    assert run_cli("train", "--data", tmp / "train.csv", "--target", "label", "--members", "2",
                   "--epochs", "2", "--run-dir", tmp / "run", "--quiet") == 0
    return tmp, frame


def test_the_run_learned_a_boolean_column(bool_run):
    import json

    tmp, _ = bool_run
    pre = json.loads((tmp / "run" / "preprocessing.json").read_text())
    assert pre["categories"] == {"smoker": ["false", "true"]}


def test_predict_matches_a_csv_boolean_as_training_read_it(bool_run, capsys):
    tmp, frame = bool_run
    spelt = {"True": frame.assign(smoker=frame.smoker.map({True: "True", False: "False"})),
             "true": frame.assign(smoker=frame.smoker.map({True: "true", False: "false"})),
             "1": frame.assign(smoker=frame.smoker.astype(int))}
    out = {}
    for name, f in spelt.items():
        f.drop(columns="label").to_csv(tmp / f"new_{name}.csv", index=False)
        capsys.readouterr()
        assert run_cli("predict", "--run", tmp / "run", "--data", tmp / f"new_{name}.csv",
                       "--out", tmp / f"p_{name}.parquet", "--quiet") == 0
        assert "unknown categories" not in capsys.readouterr().err
        out[name] = pq.read_table(tmp / f"p_{name}.parquet").to_pandas()
    for name in ("true", "1"):
        np.testing.assert_array_equal(out[name]["p_ill"], out["True"]["p_ill"])


def test_the_python_api_and_the_exported_graph_match_text_booleans(bool_run):
    import tensorflow as tf

    import ensemble

    tmp, frame = bool_run
    run = ensemble.load_run(tmp / "run")
    rows = frame.drop(columns="label").head(8)
    as_bool = run.predict(rows)
    as_text = run.predict(rows.assign(smoker=rows.smoker.map({True: "True", False: "False"})))
    np.testing.assert_array_equal(np.asarray(as_text["p_ill"]), np.asarray(as_bool["p_ill"]))
    assert run_cli("export", "--run", tmp / "run", "--out", tmp / "model") == 0
    fn = tf.saved_model.load(str(tmp / "model" / "1")).signatures["serving_default"]
    names = sorted(fn.structured_input_signature[1])
    age = tf.constant(rows["age"].to_numpy(np.float32))

    def probabilities(words):
        feed = {n: age if "age" in n else tf.constant(words) for n in names}
        return fn(**feed)["probabilities"].numpy()

    lower = np.where(rows.smoker, "true", "false")
    upper = np.where(rows.smoker, "True", "False")
    np.testing.assert_allclose(probabilities(upper), probabilities(lower), atol=0)
    # classes sorted: `ill` is the first probability
    np.testing.assert_allclose(probabilities(lower)[:, 0], np.asarray(as_bool["p_ill"]),
                               atol=1e-5)


def test_the_whole_input_count_of_unknown_categories_reads_booleans_alike():
    """`whole_input.unknown_categories` (the count before a streamed predict) agrees with the
    encoding: `True`, `0` of a boolean column are known, `maybe` is not."""
    import pyarrow as pa

    from ensemble.data.preprocessing import Preprocessing
    from ensemble.data.whole_input import unknown_categories

    pre = Preprocessing(("age",), np.zeros(3), np.ones(3), np.array(["ill", "well"]),
                        categories={"smoker": ["false", "true"]})
    table = pa.table({"age": [1.0, 2.0, 3.0, 4.0], "smoker": ["True", "0", "false", "maybe"]})
    assert unknown_categories(table, pre) == {"smoker": {"maybe": 1}}


# Numbers in a categorical column: one category whether a CSV's text (`1935.0`, as pandas
# writes a float column), a Parquet float or int column, a DataFrame or a served string holds
# them (`ensemble.data.spelling`); before, a run trained on one format saw every value of the
# other as unknown (all-zero encoding, other probabilities; the exported graph in silence).


def _years(n: int = 120, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    year = rng.integers(1935, 1945, n).astype(np.float64)
    code = rng.choice(["007", "7", "A"], n)  # text in every source: '007' stays '007'
    x = rng.normal(size=n).round(2)
    label = np.where((year > 1939) ^ (rng.random(n) > 0.85), "up", "down")
    return pd.DataFrame({"x": x, "year": year, "code": code, "label": label})


def _train(tmp, frame, fmt: str, name: str):
    data = tmp / f"{name}.{fmt}"
    frame.to_csv(data, index=False) if fmt == "csv" else frame.to_parquet(data, index=False)
    assert run_cli("train", "--data", data, "--target", "label", "--categorical", "year,code",
                   "--members", "2", "--epochs", "2", "--run-dir", tmp / name, "--quiet") == 0
    return tmp / name


@pytest.fixture(scope="module")
def year_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("years")
    frame = _years()
    return tmp, frame, {fmt: _train(tmp, frame, fmt, f"run_{fmt}") for fmt in ("csv", "parquet")}


def _predict(tmp, run, frame, name: str, capsys) -> np.ndarray:
    """`p_up` of `ensemble predict` on `frame` written as `name` (its ending: the format),
    checking that no category was unknown."""
    path = tmp / name
    rows = frame.drop(columns="label")
    rows.to_csv(path, index=False) if name.endswith(".csv") else rows.to_parquet(path)
    capsys.readouterr()
    assert run_cli("predict", "--run", run, "--data", path, "--out", tmp / f"p_{name}.parquet") \
        == 0
    assert "unknown categories" not in capsys.readouterr().err
    return pq.read_table(tmp / f"p_{name}.parquet").column("p_up").to_numpy()


def test_numeric_categories_are_spelt_alike_from_csv_and_parquet(year_runs):
    import json

    runs = year_runs[2]
    for run in runs.values():
        cats = json.loads((run / "preprocessing.json").read_text())["categories"]
        assert cats == {"year": [str(y) for y in range(1935, 1945)], "code": ["007", "7", "A"]}


@pytest.mark.parametrize("trained", ["csv", "parquet"])
def test_a_run_predicts_either_format_alike(year_runs, trained, capsys):
    """Trained on a CSV (`1935.0` text) or a Parquet float column: a CSV, a Parquet float or
    int64 column and a CSV of integers give the same probabilities, no category unknown."""
    tmp, frame, runs = year_runs
    whole = frame.assign(year=frame.year.astype("int64"))
    got = {name: _predict(tmp, runs[trained], f, f"{trained}_{name}", capsys) for name, f in [
        ("float.csv", frame), ("float.parquet", frame), ("int.parquet", whole),
        ("int.csv", whole), ("text.parquet", frame.assign(year=frame.year.map("{:.2f}".format)))]}
    for name, p in got.items():
        np.testing.assert_array_equal(p, got["float.csv"], err_msg=name)


def test_a_run_saved_before_the_canonical_spelling_still_matches(year_runs, capsys):
    """A run trained before the rule stored a CSV's `1935.0` as its categories and fill: read
    respelt (`Preprocessing.from_dict`), it predicts a Parquet file as the CSV it learned."""
    import hashlib
    import json
    import shutil

    tmp, frame, runs = year_runs
    old = tmp / "old_run"
    shutil.copytree(runs["csv"], old)
    pre = json.loads((old / "preprocessing.json").read_text())
    pre["categories"]["year"] = [f"{y}.0" for y in range(1935, 1945)]
    (old / "preprocessing.json").write_text(json.dumps(pre))
    manifest = json.loads((old / "manifest.json").read_text())  # as that run recorded it
    manifest["artifacts"]["preprocessing.json"] = hashlib.sha256(
        (old / "preprocessing.json").read_bytes()).hexdigest()
    (old / "manifest.json").write_text(json.dumps(manifest))
    np.testing.assert_array_equal(_predict(tmp, old, frame, "old.parquet", capsys),
                                  _predict(tmp, runs["csv"], frame, "new.csv", capsys))
    from ensemble.data.preprocessing import Preprocessing

    pre.update(category_fill={"year": "1936.0"}, impute="median")
    pre["categories"]["code"] = ["1", "1.0", "1.50"]  # two spellings of one number learned
    respelt = Preprocessing.from_dict(pre)
    assert respelt.categories["year"][:2] == ["1935", "1936"]
    assert respelt.category_fill == {"year": "1936"}
    assert respelt.categories["code"] == ["1", "1.0", "1.50"]  # `1` is the first: kept


def test_the_exported_graph_spells_numbers_as_training(year_runs):
    import tensorflow as tf

    import ensemble

    tmp, frame, runs = year_runs
    rows = frame.drop(columns="label").head(10)
    expected = np.asarray(ensemble.load_run(runs["csv"]).predict(rows)["p_up"])
    assert run_cli("export", "--run", runs["csv"], "--out", tmp / "model") == 0
    fn = tf.saved_model.load(str(tmp / "model" / "1")).signatures["serving_default"]
    names = sorted(fn.structured_input_signature[1])

    def probabilities(years):
        feed = {"x": tf.constant(rows["x"].to_numpy(np.float32)),
                "year": tf.constant(years), "code": tf.constant(rows["code"].tolist())}
        return fn(**{n: feed[n] for n in names})["probabilities"].numpy()[:, 1]

    spelt = {f: [f.format(y) for y in rows.year] for f in
             ("{:.0f}", "{:.1f}", "{:.3f}", "{:.3e}", "{:.5E}")}  # 1935, 1935.0, 1.935e+03
    for fmt, years in spelt.items():
        np.testing.assert_array_equal(probabilities(years), probabilities(spelt["{:.0f}"]),
                                      err_msg=fmt)
    np.testing.assert_allclose(probabilities(spelt["{:.1f}"]), expected, atol=1e-5)
    unknown = probabilities(["1935.5"] * len(rows))  # not a year of the run: all-zero block
    assert not np.allclose(unknown, probabilities(["1935"] * len(rows)))


def test_the_scikit_learn_estimator_spells_a_dataframe_alike():
    from ensemble.sklearn import DeepEnsembleClassifier

    frame = _years(48)
    x, y = frame.drop(columns="label"), frame["label"]
    est = DeepEnsembleClassifier(n_members=2, hidden=(4,), epochs=1, random_state=0,
                                 categorical=["year", "code"]).fit(x, y)
    assert est.preprocessing_.categories["year"][0] == "1935"
    expected = est.predict_proba(x)
    for year in (x.year.astype("int64"), x.year.map("{:.1f}".format)):
        np.testing.assert_array_equal(est.predict_proba(x.assign(year=year)), expected)


def test_the_canonical_spelling_of_every_source():
    """Numbers of any type and text spelling a whole number are one category; other text (a
    code with leading zeros, `A`, `.5`, a number that is not whole: `3.10`) as written; the whole-input count of unknown categories
    agrees."""
    import pyarrow as pa

    from ensemble.data.preprocessing import Preprocessing
    from ensemble.data.spelling import arrow_text, canonical
    from ensemble.data.whole_input import unknown_categories

    text = ["1935.0", "1935", "1.935E3", "3.10", "3.1", "1.5E-5", "-0.0", "1e+16", "007", "A",
            ".5", None, "9007199254740993"]
    spelt = ["1935", "1935", "1935", "3.10", "3.1", "1.5E-5", "0", "10000000000000000", "007",
             "A", ".5", None, "9007199254740993"]
    assert arrow_text(pa.array(text)).to_pylist() == spelt
    assert [canonical(t) for t in text[:-2]] == spelt[:-2]
    assert arrow_text(pa.array([1935.0, 1.5, 1.5e-5, -0.0, 1e16, None, float("nan")])) \
        .to_pylist() == ["1935", "1.5", "1.5e-05", "0", "10000000000000000", None, "nan"]
    assert arrow_text(pa.array(np.array([0.1, 1935], np.float32))).to_pylist() == ["0.1", "1935"]
    assert arrow_text(pa.chunked_array([[1935], [-7]])).to_pylist() == ["1935", "-7"]
    assert arrow_text(pa.array(["1935.0", "A"]).dictionary_encode()).to_pylist() == ["1935", "A"]
    pre = Preprocessing(("x",), np.zeros(4), np.ones(4), np.array(["down", "up"]),
                        categories={"year": ["1935", "1.5", "007"]})
    table = pa.table({"x": [1.0] * 6, "year": ["1935.0", "1.5", "007", "7", "1936.0", "1.50"]})
    assert unknown_categories(table, pre) == {"year": {"7": 1, "1936": 1, "1.50": 1}}
    floats = pa.table({"x": [1.0, 2.0], "year": [1935.0, 1.5]})
    assert unknown_categories(floats, pre) == {}
