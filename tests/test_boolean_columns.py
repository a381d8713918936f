"""A boolean column read from a CSV (`True`/`False`, as pandas writes it) is typed bool by
pyarrow at training, so its categories are `true`/`false`; new rows are matched as booleans at
predict, in the Python API and in the exported graph (`preprocessing.BOOL_WORDS`), not as the
text `True`, which was an unknown category on every row (all-zero encoding, other
probabilities, in silence but for a notice)."""

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
