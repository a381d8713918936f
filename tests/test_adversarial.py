"""Adversarial training (`training.adversarial_epsilon`): identical members in both replication
modes, a step in units of the scaled input's range, a changed result, and the bounds."""

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import TINY, run_cli

from ensemble.core.errors import UsageError

ADV = TINY.replace("seed = 3\n", "seed = 3\nadversarial_epsilon = 0.05\n").replace(
    "count = 4", "count = 2")


def _probs(run_dir):
    t = pq.read_table(run_dir / "predictions.parquet")
    return np.column_stack([t.column(f"p_{c}").to_numpy() for c in range(10)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adv")
    (tmp / "adv.toml").write_text(ADV)
    (tmp / "clean.toml").write_text(ADV.replace("adversarial_epsilon = 0.05\n", ""))
    out = {}
    # between-graph: one client trains the members in turn (the client count is
    # test_between_graph's and test_parity_cnn's; each client process is a TensorFlow start)
    for name, cfg, mode in (("in-graph", "adv", "in-graph"),
                            ("between-graph", "adv", "between-graph"),
                            ("clean", "clean", "in-graph")):
        out[name] = tmp / name
        jobs = ["--jobs", "1"] if mode == "between-graph" else []
        assert run_cli("train", "--config", tmp / f"{cfg}.toml", "--mode", mode, *jobs,
                       "--run-dir", out[name], "--quiet") == 0
    return out


def test_adversarial_members_are_identical_in_both_modes(runs):
    assert np.abs(_probs(runs["in-graph"]) - _probs(runs["between-graph"])).max() <= 1e-5
    assert np.abs(_probs(runs["in-graph"]) - _probs(runs["clean"])).max() > 1e-3


def test_step_is_in_units_of_the_scaled_range():
    import keras

    from ensemble.replication.adversarial import input_step

    x = np.array([[0.0, 10.0], [255.0, 20.0]], np.float32)
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    np.testing.assert_allclose(input_step(plain, x, 0.01), [2.55, 2.55])  # range 0..255
    scaled = keras.Sequential([keras.Input((2,)),
                               keras.layers.Rescaling(1 / 255.0, name="scaling"),
                               keras.layers.Dense(1)])
    # scaled range [0, 1]: a step of 0.01 there is 2.55 raw units (slope 1/255)
    np.testing.assert_allclose(input_step(scaled, x, 0.01), [2.55, 2.55], rtol=1e-5)
    norm = keras.Sequential([keras.Input((2,)),
                             keras.layers.Normalization(mean=[0.0, 0.0], variance=[1.0, 4.0],
                                                        name="scaling"),
                             keras.layers.Dense(1)])
    # scaled values: feature 0 in [0, 255], feature 1 in [5, 10]: range 255; slopes 1, 1/2
    np.testing.assert_allclose(input_step(norm, x, 0.01), [2.55, 5.1], rtol=1e-5)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_epsilon_out_of_range_is_refused(value):
    from ensemble.config import schema

    with pytest.raises(UsageError, match="adversarial_epsilon"):
        schema.load(overrides={"training.adversarial_epsilon": value})


def test_evaluate_ood_gives_the_same_table_for_both_modes(runs):
    import ensemble

    rng = np.random.default_rng(0)
    noise = rng.uniform(0, 16, size=(50, 64))  # digits' pixel range, no digit in it
    tables = [ensemble.load_run(runs[m]).evaluate_ood(noise) for m in ("in-graph",
                                                                         "between-graph")]
    assert tables[0].ood_source.iloc[0] == "DataFrame (50 rows)"
    np.testing.assert_allclose(tables[0].auroc.to_numpy(float), tables[1].auroc.to_numpy(float),
                               atol=1e-6, equal_nan=True)
    assert (tables[0].n_out == 50).all()


def test_default_graph_has_no_adversarial_op():
    import keras
    import tensorflow as tf

    from ensemble import tasks
    from ensemble.replication.steps import make_steps_fn

    x = np.random.default_rng(0).random((32, 4)).astype(np.float32)
    y = np.arange(32, dtype=np.int32) % 3

    def sign_ops(adversarial):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        opt = keras.optimizers.SGD(0.1)
        opt.build(model.trainable_variables)
        fn = make_steps_fn([model], [opt], ["/device:CPU:0"], tasks.get(),
                           x.shape[1:], tf.float32, adversarial=adversarial)
        graph = fn.get_concrete_function().graph
        ops = [op for f in [graph, *[g.graph for g in graph._functions.values()
                                     if hasattr(g, "graph")]] for op in f.get_operations()]
        return sum(op.type == "Sign" for op in ops)

    assert sign_ops(None) == 0
    assert sign_ops([np.full(4, 0.1, np.float32)]) > 0


def test_replicas_take_the_same_adversarial_step():
    import keras
    import tensorflow as tf

    from ensemble import tasks
    from ensemble.replication.steps import replicated_train_step
    from ensemble.replication.training import train_step

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 8)).astype(np.float32), (np.arange(64) % 3).astype(np.int32)
    task, idx = tasks.get(), np.arange(0, 64, 2)
    xb, yb = tf.constant(x[idx]), tf.constant(y[idx])
    cpu = "/device:CPU:{}"
    out = []
    for devs in ([cpu.format(0)], [cpu.format(0), cpu.format(1)]):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, "relu"),
                                  keras.layers.Dense(3)])
        opt = keras.optimizers.SGD(0.5)
        opt.build(model.trainable_variables)
        adv = tf.constant(np.full(8, 0.05, np.float32))
        step = (tf.function(lambda a, b: train_step(model, opt, a, b, task, adv))
                if len(devs) == 1 else
                tf.function(lambda a, b: replicated_train_step(model, opt, (a, b), task, devs,
                                                               adv)))
        out.append((step(xb, yb).numpy(), [w.numpy() for w in model.weights]))
    assert abs(out[0][0] - out[1][0]) <= 1e-5
    for a, b in zip(out[0][1], out[1][1]):
        np.testing.assert_allclose(a, b, atol=1e-5)
