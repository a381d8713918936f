"""Entity embeddings of high-cardinality categorical columns: the index encoding (vocabulary,
infrequent and out-of-vocabulary indices), and train, predict, export and serve agreeing on
unseen and infrequent categories; members identical in both replication modes."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import run_cli

TINY = ["--members", "2", "--epochs", "2", "--set", "members.hidden=[8]"]


def _table(n=400, seed=0):
    """A table whose `city` column (60 categories, a few of them seen once) carries the
    label, beside a numeric column and a 3-category column (one-hot)."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(size=60) * 2
    city = rng.integers(0, 55, n)
    city[:5] = np.arange(55, 60)  # seen once each: infrequent (min_frequency 2)
    x = rng.normal(size=n)
    y = (effect[city] + x + rng.normal(size=n) * 0.3 > 0).astype(int)
    return pd.DataFrame({"x": x, "city": [f"c{v}" for v in city],
                         "small": rng.choice(list("abc"), n), "label": y})


def test_index_encoding_counts_vocabulary_infrequent_and_unknown():
    from ensemble.data.embedding import width
    from ensemble.data.preprocessing import Preprocessing
    from ensemble.data.sources import Dataset
    from ensemble.data.table_stats import TableStats

    cats = np.array(["a"] * 3 + ["b"] * 2 + ["c"] + [f"z{i}" for i in range(20)] * 2,
                    dtype=object)
    ds = Dataset("t", np.zeros((len(cats), 0), np.float32), None, (), {"k": cats})
    stats = TableStats((), ("k",), "error", 64, 0, embed_above=16, min_frequency=2)
    stats.update(ds)
    pre = Preprocessing(**stats.fitted(np.array([0, 1])))
    assert pre.embedded == ("k",) and pre.rare == {"k": ["c"]}
    assert pre.output_names == ["k:index"]
    new = Dataset("n", np.zeros((4, 0), np.float32), None, (),
                  {"k": np.array(["a", "c", "never", "z3"], dtype=object)})
    vocab = pre.categories["k"]
    np.testing.assert_array_equal(pre.transform(new)[:, 0],
                                  [2 + vocab.index("a"), 1, 0, 2 + vocab.index("z3")])
    assert (width(24), width(10_002)) == (9, 278)  # fastai: round(1.6 * n ** 0.56)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(base folder, in-graph run, between-graph run, new rows) on `_table()`."""
    base = tmp_path_factory.mktemp("embed")
    _table().to_csv(base / "train.csv", index=False)
    new = _table(40, seed=1)
    new.loc[0, "city"], new.loc[1, "city"] = "never-seen", "c57"  # unknown, infrequent
    new.drop(columns="label").to_csv(base / "new.csv", index=False)
    # between-graph: one client trains the members in turn (the client count is
    # test_between_graph's and test_parity_cnn's; each client process is a TensorFlow start)
    for mode, jobs in (("in-graph", []), ("between-graph", ["--jobs", "1"])):
        assert run_cli("train", "--data", base / "train.csv", "--target", "label",
                       "--mode", mode, *jobs, "--run-dir", base / mode, *TINY) == 0
    return base, base / "in-graph", base / "between-graph", new


def test_members_embed_the_column_identically_in_both_modes(runs):
    base, ig, bg, _ = runs
    pre = json.loads((ig / "preprocessing.json").read_text())
    assert pre["embedded"] == ["city"] and pre["output_names"][-1] == "city:index"
    assert "small=a" in pre["output_names"]  # a small column stays one-hot
    a, b = (pq.read_table(r / "predictions.parquet").to_pandas() for r in (ig, bg))
    key = ["model", "split", "row"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    np.testing.assert_allclose(a[["p_0", "p_1"]], b[["p_0", "p_1"]], atol=1e-6)


EXPORTED = """
import json, sys
import tensorflow as tf
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
rows = json.load(open(sys.argv[2]))
out = fn(x=tf.constant(rows["x"], tf.float32), city=tf.constant(rows["city"]),
         small=tf.constant(rows["small"]))
json.dump(out["probabilities"].numpy().tolist(), open(sys.argv[3], "w"))
"""


def test_predict_export_and_serve_agree_on_unseen_and_infrequent(runs, plain_tf):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    from test_serve_http import serving

    base, ig, _, new = runs
    assert run_cli("predict", "--run", ig, "--data", base / "new.csv",
                   "--out", base / "p.csv") == 0
    predicted = pd.read_csv(base / "p.csv")[["p_0", "p_1"]].to_numpy()
    assert run_cli("export", "--run", ig, "--out", base / "models" / "embed") == 0
    rows = {"x": new.x.tolist(), "city": new.city.tolist(), "small": new.small.tolist()}
    (base / "rows.json").write_text(json.dumps(rows))
    proc = plain_tf.run(EXPORTED, base / "models/embed/1", base / "rows.json",
                        base / "out.json", cwd=base)
    assert proc.returncode == 0, proc.stderr[-2000:]
    exported = np.asarray(json.loads((base / "out.json").read_text()))
    np.testing.assert_allclose(exported, predicted, atol=1e-5)
    with serving(base / "models" / "embed", base / "serve.err", "--replicas", "1",
                 name="embed") as (_, url):
        instances = [dict(zip(rows, v)) for v in zip(*rows.values())]
        r = httpx.post(f"{url}/v1/models/embed:predict", json={"instances": instances},
                       timeout=60)
        assert r.status_code == 200, r.text
        served = np.asarray([p["probabilities"] for p in r.json()["predictions"]])
    np.testing.assert_allclose(served, predicted, atol=1e-5)
    # the unknown city embeds as zeros, the infrequent one as the shared infrequent vector:
    # both differ from a frequent city's answer on the same row
    assert not np.allclose(predicted[0], predicted[1])


def test_a_builder_naming_embedded_receives_the_index_columns(tmp_path):
    (tmp_path / "own.py").write_text('''
import keras

SEEN = []

def build(input_shape, n_outputs, *, seed, embedded):
    SEEN.append(embedded)
    x = inp = keras.Input(input_shape)
    pos = embedded[0]["position"]
    dense = keras.layers.Dense(4)(x[:, :pos])
    index = keras.layers.Embedding(embedded[0]["n_indices"], 3)(
        keras.ops.cast(x[:, pos], "int32"))
    out = keras.layers.Dense(n_outputs)(keras.ops.concatenate([dense, index], axis=-1))
    return keras.Model(inp, out)
''')
    _table(200).to_csv(tmp_path / "t.csv", index=False)
    assert run_cli("train", "--data", tmp_path / "t.csv", "--target", "label", "--model",
                   f"{tmp_path / 'own.py'}:build", "--members", "1", "--epochs", "1",
                   "--run-dir", tmp_path / "run") == 0
    pre = json.loads((tmp_path / "run" / "preprocessing.json").read_text())
    assert pre["embedded"] == ["city"]


def test_evaluate_scores_what_predict_writes_and_labelled_new_data(runs, capsys):
    """`evaluate --predictions` takes predict's wide layout (one row column) when y_true is
    filled, and `evaluate --run --data` predicts and scores in one command: the same NLL as
    scikit-learn's log loss of the wide file's probabilities."""
    from sklearn.metrics import log_loss

    base, ig, _, _ = runs
    labelled = _table(120, seed=2)
    labelled.to_csv(base / "labelled.csv", index=False)
    assert run_cli("predict", "--run", ig, "--data", base / "labelled.csv",
                   "--out", base / "wide.parquet", "--quiet") == 0
    wide = pq.read_table(base / "wide.parquet").to_pandas()
    assert "row" in wide.columns and "source_row" not in wide.columns
    p = wide[["p_0", "p_1"]].to_numpy(np.float64)
    nll = log_loss(wide.y_true.astype(int), p / p.sum(1, keepdims=True))
    capsys.readouterr()
    assert run_cli("evaluate", "--predictions", base / "wide.parquet") == 0
    scored = pq.read_table(base / "wide.metrics.parquet").to_pandas()
    assert scored.split.tolist() == ["predict"] and abs(scored.nll[0] - nll) < 1e-5
    capsys.readouterr()
    assert run_cli("evaluate", "--run", ig, "--data", base / "labelled.csv") == 0
    out = capsys.readouterr().out
    assert "predict (120 rows)" in out and "member-1" in out
    line = next(t for t in out.splitlines() if t.strip().startswith("ensemble-mean"))
    assert abs(float(line.split()[2]) - nll) < 1e-4
    assert run_cli("evaluate", "--data", base / "labelled.csv") == 2
