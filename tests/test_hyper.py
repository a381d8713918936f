"""Hyperparameter ensembles: members of different architectures in both modes, balanced
placement, per-member overrides in the config and the manifest."""

import pyarrow.parquet as pq
import pytest
from conftest import run_cli

from ensemble import tasks
from ensemble.core import artifacts
from ensemble.config import schema
from ensemble.core.errors import UsageError

HETERO = """
[data]
source = "digits"
[members]
count = 3
hidden = [32]
[[members.override]]
index = 1
hidden = [48, 16]
activation = "tanh"
learning_rate = 0.003
[[members.override]]
index = 2
dropout = 0.0
l2 = 0.001
[training]
epochs = 2
batch_size = 64
seed = 1
[placement]
devices = "cpu:2"
strategy = "balanced"
"""


@pytest.fixture(scope="module")
def hetero(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hetero")
    path = tmp / "hetero.toml"
    path.write_text(HETERO)
    runs = {}
    for mode in ("in-graph", "between-graph"):
        runs[mode] = tmp / mode
        assert run_cli("train", "--config", path, "--mode", mode, "--run-dir", runs[mode]) == 0
    return path, runs


def test_overrides_resolve_per_member(hetero):
    cfg = schema.load(hetero[0])
    assert schema.member_hparams(cfg, 0) == {
        "builder": "mlp", "learning_rate": 0.001,
        "params": {"hidden": [32], "activation": "relu", "dropout": 0.1, "l2": 0.0}}
    assert schema.member_hparams(cfg, 1) == {
        "builder": "mlp", "learning_rate": 0.003,
        "params": {"hidden": [48, 16], "activation": "tanh", "dropout": 0.1, "l2": 0.0}}
    assert schema.member_hparams(cfg, 2)["params"]["dropout"] == 0.0
    assert schema.member_hparams(cfg, 2)["params"]["l2"] == 0.001


def test_heterogeneous_members_same_in_both_modes(hetero):
    _, runs = hetero
    a, b = (pq.read_table(runs[m] / "predictions.parquet").to_pandas() for m in runs)
    cols = [c for c in a.columns if c.startswith("p_")]
    assert (a.model == b.model).all()
    assert abs(a[cols].to_numpy() - b[cols].to_numpy()).max() <= 1e-6
    manifest = artifacts.read_manifest(runs["in-graph"])
    members = manifest["members"]
    assert [m["hparams"]["params"]["hidden"] for m in members] == [[32], [48, 16], [32]]
    # FLOPs per row: 2 * (64*32 + 32*10) = 4736 and 2 * (64*48 + 48*16 + 16*10) = 8000:
    # balanced placement gives the costliest member a device of its own
    assert [m["flops_per_row"] for m in members] == [4736, 8000, 4736]
    assert [m["device"] for m in members] == ["/device:CPU:1", "/device:CPU:0",
                                              "/device:CPU:1"]
    assert manifest["placement"] == {"strategy": "balanced", "replicas": 1}


def test_heterogeneous_members_on_their_devices_in_the_traced_graph(hetero):
    from test_in_graph import _ops_by_member

    from ensemble.replication.in_graph import InGraphEnsemble

    cfg = schema.load(hetero[0], overrides={"training.early_stopping": 0})
    devs = ["/device:CPU:1", "/device:CPU:0", "/device:CPU:1"]
    ens = InGraphEnsemble.build(cfg, 64, 10, devs, task=tasks.get())
    # the builder's network (dense+dropout per layer, logits) under the softmax head
    assert [len(m.layers[1].layers) for m in ens.models] == [3, 5, 2]
    found = _ops_by_member(ens.predict_fn.get_concrete_function().graph, 3)
    assert found == {0: {devs[0]}, 1: {devs[1]}, 2: {devs[2]}}


def test_l2_penalty_is_added_to_the_step_loss():
    import numpy as np
    import tensorflow as tf

    from ensemble import tasks
    from ensemble.models.members import build_member
    from ensemble.models.optimizer import build_optimizer
    from ensemble.replication.training import train_step

    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(16, 5)), tf.float32)
    y = tf.constant(rng.integers(0, 3, 16), tf.int32)
    losses = {}
    for l2 in (0.0, 0.5):
        task = tasks.get()
        model = build_member("mlp", {"hidden": [4], "dropout": 0.0, "l2": l2}, (5,), 3,
                             seed=7, name="m", task=task)
        kernels = sum(float(tf.reduce_sum(tf.square(v))) for v in model.trainable_variables
                      if len(v.shape) == 2)
        losses[l2] = (float(train_step(model, build_optimizer(model, 1e-3), x, y, task)),
                      kernels)
    (plain, kernels), (penalised, _) = losses[0.0], losses[0.5]
    assert penalised == pytest.approx(plain + 0.5 * kernels, rel=1e-5)


@pytest.mark.parametrize("override, match", [
    ({"index": 5}, r"override\[0\]\.index"),
    ({"index": 0, "epochs": 3}, "shared by every member"),
    ({"index": 0, "batch_size": 3}, "shared by every member"),
    ({"index": 0, "dropout": 1.5}, r"override\[0\]\.dropout"),
    ({"index": 0, "hidden": [0]}, r"override\[0\]\.hidden\[0\]"),
    ({"index": 0, "activation": "soft"}, r"override\[0\]\.activation"),
    ({"index": 0, "l1": 0.1}, r"members\.override\[0\]\.l1"),
    ({"index": 0, "l2": -0.1}, r"override\[0\]\.l2"),
])
def test_bad_overrides(override, match):
    with pytest.raises(UsageError, match=match):
        schema.from_dict({"members": {"count": 2, "override": [override]}})
