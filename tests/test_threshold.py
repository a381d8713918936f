"""The decision threshold of a binary task (`--threshold`, `training.threshold`): picked on
validation, recorded in `aggregators.json`, and `y_pred = p_positive >= t` in every surface
(train's tables and metrics, predict's file, the exported SavedModel, serve's response), on
one tiny imbalanced table trained once; the refusals (exit 2) of a bad value and a task that
is not binary."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score, matthews_corrcoef

from conftest import run_cli
from ensemble.core.errors import UsageError
from ensemble.tasks.classification import threshold as T

FEATURES = ["a", "b", "c"]


def _table(n: int = 400, seed: int = 0) -> pd.DataFrame:
    """About 12% positives ("yes"), mostly explained by `a` and `b`."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    p = 1 / (1 + np.exp(-(-3.0 + 2.0 * x[:, 0] + 1.0 * x[:, 1])))
    y = np.where(rng.random(n) < p, "yes", "no")
    return pd.DataFrame({**dict(zip(FEATURES, x.T)), "label": y})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("threshold")
    _table().to_csv(base / "imb.csv", index=False)
    assert run_cli("train", "--data", base / "imb.csv", "--target", "label",
                   "--threshold", "auto:f1", "--members", "2", "--epochs", "2",
                   "--set", "members.hidden=[8]", "--set", "training.learning_rate=0.02",
                   "--devices", "cpu:1", "--run-dir", base / "run", "--quiet") == 0
    fit = json.loads((base / "run" / "aggregators.json").read_text())
    return base, fit["params"]["mean"]["threshold"], fit


def _model(table, model: str, split: str):
    t = table.filter(pc.and_(pc.equal(table.column("model"), model),
                             pc.equal(table.column("split"), split)))
    return t.to_pandas().sort_values("row")


@pytest.mark.parametrize("metric, library", [
    ("f1", f1_score), ("balanced_accuracy", balanced_accuracy_score),
    ("mcc", matthews_corrcoef), ("accuracy", lambda y, p: np.mean(y == p))])
def test_pick_maximises_the_metric_over_the_distinct_probabilities(metric, library):
    rng = np.random.default_rng(1)
    y = (rng.random(300) < 0.1).astype(int)
    p = np.clip(0.3 * y + rng.uniform(0, 0.7, 300), 0, 1).astype(np.float32)
    t = T.pick(metric, y, p)
    scores = {float(v): library(y, (p >= v).astype(int)) for v in np.unique(p)}
    best = max(scores.values())
    assert scores[t] == pytest.approx(best)
    assert t == max(v for v, s in scores.items() if s == pytest.approx(best))  # ties: highest


@pytest.mark.parametrize("value, expected", [
    ("none", None), (None, None), ("auto:f1", "f1"), ("AUTO:mcc", "mcc"), (0.3, 0.3),
    ("0.25", 0.25)])
def test_parse(value, expected):
    assert T.parse(value) == expected


@pytest.mark.parametrize("value", ["auto:recall", 0, 1.0, "1.5", "f1", True, "auto:"])
def test_parse_refuses_a_bad_value_naming_it(value):
    with pytest.raises(UsageError, match=r"training\.threshold.*\(0, 1\).*auto:f1.*"
                                         r"Received: " + repr(value).replace(".", r"\.")):
        T.parse(value)


def test_train_picks_on_validation_and_every_table_applies_it(run):
    base, t, fit = run
    preds = pq.read_table(base / "run" / "predictions.parquet")
    val = _model(preds, "ensemble-mean", "validation")
    y_val = (val["y_true"] == "yes").to_numpy()
    assert fit["params"]["mean"]["threshold_metric"] == "f1"
    best = max(f1_score(y_val, val["p_yes"] >= v) for v in np.unique(val["p_yes"]))
    assert f1_score(y_val, val["p_yes"] >= np.float32(t)) == pytest.approx(best)
    assert "vote" not in fit["params"]  # vote shares: the majority label
    metrics = pq.read_table(base / "run" / "metrics.parquet").to_pandas()
    for split in ("validation", "test"):
        ens = _model(preds, "ensemble-mean", split)
        decided = np.where(ens["p_yes"] >= np.float32(t), "yes", "no")
        assert (ens["y_pred"].to_numpy() == decided).all()
        row = metrics[(metrics.model == "ensemble-mean") & (metrics.split == split)].iloc[0]
        assert row["accuracy"] == pytest.approx(np.mean(decided == ens["y_true"]))
        truth = ens["y_true"].to_numpy()
        assert row["recall_yes"] == pytest.approx(np.mean(decided[truth == "yes"] == "yes"))
        assert row["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(truth, decided))
        member = _model(preds, "member-0", split)  # members keep the argmax
        assert (member["y_pred"] == np.where(member["p_yes"] > member["p_no"], "yes", "no")).all()
    assert (val["y_pred"] == "yes").mean() > (val["p_yes"] > 0.5).mean()  # t < 0.5 here


def test_predict_and_evaluate_of_the_file_apply_it(run, capsys):
    base, t, _ = run
    _table(120, seed=7).to_csv(base / "new.csv", index=False)
    assert run_cli("predict", "--run", base / "run", "--data", base / "new.csv",
                   "--out", base / "new.parquet", "--quiet") == 0
    out = pq.read_table(base / "new.parquet")
    assert json.loads(out.schema.metadata[b"thresholds"]) == {"mean": t}
    d = out.to_pandas()
    assert (d["y_pred"] == np.where(d["p_yes"] >= np.float32(t), "yes", "no")).all()
    assert run_cli("evaluate", "--predictions", base / "new.parquet") == 0
    m = pq.read_table(base / "new.metrics.parquet").to_pandas()
    assert m[m.model == "ensemble-mean"]["accuracy"].iloc[0] == pytest.approx(
        np.mean(d["y_pred"] == d["y_true"]))


def test_export_and_serve_apply_it(run):
    import tensorflow as tf

    base, t, _ = run
    assert run_cli("export", "--run", base / "run", "--out", base / "models" / "imb") == 0
    x = _table(60, seed=9)[FEATURES].to_numpy(np.float32)
    out = tf.saved_model.load(str(base / "models" / "imb" / "1")).signatures[
        "serving_default"](features=tf.constant(x))
    p = out["probabilities"].numpy()
    assert (out["class_index"].numpy() == (p[:, 1] >= np.float32(t))).all()
    assert ([v.decode() for v in out["labels"].numpy()]
            == np.where(p[:, 1] >= np.float32(t), "yes", "no").tolist())
    assert (out["class_index"].numpy() != p.argmax(axis=1)).any()  # the threshold mattered

    starlette = pytest.importorskip("starlette.testclient")
    from ensemble.serving.prometheus import Metrics
    from ensemble.serving.servables import Batching, ModelManager, Watch
    from pipelines.serve import build_app

    metrics = Metrics()
    manager = ModelManager(base / "models" / "imb", "imb", ["/CPU:0"],
                           Batching(1, 0.0, metrics.batch), Watch(settle=0.0),
                           log=lambda _: None)  # the export is complete: no settling
    manager.start()
    try:
        client = starlette.TestClient(build_app(manager, metrics))
        got = client.post("/v1/models/imb:predict", json={"instances": x.tolist()}).json()
    finally:
        manager.stop()
    rows = got["predictions"]
    served_p = np.array([r["probabilities"] for r in rows], np.float32)
    assert [r["labels"] for r in rows] == np.where(served_p[:, 1] >= np.float32(t), "yes",
                                                   "no").tolist()


@pytest.mark.parametrize("args, words", [
    (["--data", "breast_cancer", "--threshold", "1.5"], "Received: '1.5'"),
    (["--data", "iris", "--threshold", "auto:f1"], "Received: 3 classes"),
    (["--data", "{csv}", "--target", "a", "--task", "regression", "--threshold", "0.3"],
     "Received: a regression target"),
])
def test_refusals_exit_2_naming_the_value(run, tmp_path, capsys, args, words):
    base, _, _ = run
    args = [a.replace("{csv}", str(base / "imb.csv")) for a in args]
    assert run_cli("train", *args, "--members", "1", "--epochs", "1",
                   "--run-dir", tmp_path / "r", "--quiet") == 2
    err = capsys.readouterr().err
    assert words in err and "threshold" in err and "Traceback" not in err


def test_the_loaded_estimator_applies_it(run):
    from ensemble.sklearn import DeepEnsembleClassifier

    base, t, _ = run
    est = DeepEnsembleClassifier.load(base / "run")
    x = _table(80, seed=11)[FEATURES]
    p = est.predict_proba(x)
    assert (est.predict(x) == np.where(p[:, 1] >= np.float32(t), "yes", "no")).all()
