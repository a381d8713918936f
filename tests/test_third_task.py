"""A task is one place: a third task defined in this file alone (binary classification with ONE
logit and a sigmoid head), named by its spec in the config, trains in both replication modes
with identical members, predicts, evaluates (table and plots), aggregates post hoc and exports,
without a line of it anywhere else.

The head turns the one logit `z` into the two class probabilities `(1 - sigmoid(z),
sigmoid(z))` with standard layers only (a fixed, non-trainable `Dense` to `[0, z]`, then
softmax: `softmax([0, z]) = (1 - sigmoid(z), sigmoid(z))`), so the saved members load under
Keras's `safe_mode` in any process, including a between-graph client's.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ensemble.tasks.classification.task import Classification


def run_cli(*argv) -> int:  # not conftest's: a between-graph client imports this file too
    from pipelines.cli import main

    return main([str(a) for a in argv])


class BinarySigmoid(Classification):
    """Binary classification from one logit: the builder returns `[batch, 1]`."""

    def n_outputs(self, n_classes: int) -> int:
        if n_classes != 2:
            raise ValueError(f"BinarySigmoid needs 2 classes; the data has {n_classes}")
        return 1

    def head(self, logits, name: str = "probabilities"):
        import keras

        pair = keras.layers.Dense(2, use_bias=False, trainable=False, name=f"{name}_pair",
                                  kernel_initializer=keras.initializers.Constant([[0.0, 1.0]]))
        return keras.layers.Softmax(name=name)(pair(logits))

    def serving_outputs(self, stacked, name, params, classes):
        """The exported signature also answers the positive class's probability alone: the
        export asks the run's task, not one inferred from its classes."""
        out = super().serving_outputs(stacked, name, params, classes)
        return {**out, "p_positive": out["probabilities"][:, 1]}


SPEC = f"{os.path.abspath(__file__)}:BinarySigmoid"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("third")
    cfg = base / "binary.toml"
    cfg.write_text(f'[data]\nsource = "breast_cancer"\ntask = "{SPEC}"\n'
                   "[members]\ncount = 2\nhidden = [16]\n"
                   "[training]\nepochs = 6\nbatch_size = 64\nlearning_rate = 0.01\nseed = 5\n"
                   '[placement]\ndevices = "cpu:2"\n')
    # between-graph: one client trains both members in turn (the client count is
    # test_between_graph's and test_parity_cnn's; each client process is a TensorFlow start)
    for mode, jobs in (("in-graph", []), ("between-graph", ["--jobs", "1"])):
        assert run_cli("train", "--config", cfg, "--mode", mode, *jobs, "--run-dir", base / mode,
                       "--quiet") == 0
    return base


def _probs(path, model: str) -> np.ndarray:
    t = pq.read_table(path)
    t = t.filter(pc.equal(t.column("model"), model))
    return np.column_stack([t.column(c).to_numpy() for c in t.column_names if c.startswith("p_")])


def test_both_modes_train_identical_one_logit_members(runs):
    import keras

    from ensemble.core import artifacts

    manifest = artifacts.read_manifest(runs / "between-graph")
    assert manifest["task"] == SPEC  # the clients imported the task by its spec
    member = keras.saving.load_model(runs / "in-graph" / "members" / "member-0.keras",
                                     safe_mode=True)
    assert member.layers[-1].name == "probabilities"
    assert member.get_layer("probabilities_pair").input.shape[-1] == 1  # ONE logit
    for model in ("member-0", "member-1", "ensemble-mean"):
        a = _probs(runs / "in-graph" / "predictions.parquet", model)
        b = _probs(runs / "between-graph" / "predictions.parquet", model)
        assert a.shape[1] == 2 and np.allclose(a.sum(axis=1), 1, atol=1e-5)
        assert np.abs(a - b).max() <= 1e-5, model


def test_predict_evaluate_aggregate_and_export(runs, tmp_path, capsys, plain_tf):
    run = runs / "in-graph"
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", run, "--data", "breast_cancer", "--out", out, "--quiet",
                   "--layout", "long") == 0
    want = _probs(run / "predictions.parquet", "ensemble-mean")
    rows = pq.read_table(run / "predictions.parquet").filter(
        pc.equal(pc.field("model"), "ensemble-mean")).column("source_row").to_numpy()
    got = _probs(out, "ensemble-mean")[rows]
    assert np.abs(got - want).max() <= 1e-5
    capsys.readouterr()
    assert run_cli("evaluate", "--run", run, "--plots") == 0
    text = capsys.readouterr().out
    assert "ensemble-mean" in text and "reliability.png" in text
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    test = next(r for r in metrics if r["model"] == "ensemble-mean" and r["split"] == "test")
    assert test["accuracy"] > 0.85  # the one-logit members learned the task
    assert (run / "reliability.png").stat().st_size > 0
    assert run_cli("aggregate", "--run", run, "--aggregators", "mean,vote,temperature") == 0
    assert "ensemble-temperature" in set(pq.read_table(run / "predictions.parquet")
                                         .column("model").to_pylist())
    models = tmp_path / "models"
    assert run_cli("export", "--run", run, "--out", models, "--aggregator", "mean") == 0
    from sklearn.datasets import load_breast_cancer

    np.save(tmp_path / "x.npy", load_breast_cancer().data[rows].astype(np.float32))
    code = ("import sys, numpy as np, tensorflow as tf\n"
            "m = tf.saved_model.load(sys.argv[1])\n"
            "p = m.signatures['serving_default'](features=tf.constant(np.load(sys.argv[2])))\n"
            "np.save(sys.argv[3], p['probabilities'].numpy())\n"
            "np.save(sys.argv[3] + '.positive.npy', p['p_positive'].numpy())\n")
    proc = plain_tf.run(code, models / "1", tmp_path / "x.npy", tmp_path / "served.npy",
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    served = np.load(tmp_path / "served.npy")
    aggregated = _probs(run / "predictions.parquet", "ensemble-mean")
    assert np.abs(served - aggregated).max() <= 1e-5
    positive = np.load(tmp_path / "served.npy.positive.npy")  # the task's own output
    assert np.abs(positive - aggregated[:, 1]).max() <= 1e-5
