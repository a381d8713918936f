"""Data-parallel members (issue #24): a member trained as replicas over several devices is the
unreplicated member up to float summation order, in both modes and on a cluster; placement
read from the traced graph; uneven batches weighted by rows; resume; bad values."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_cli

from ensemble import tasks
from ensemble.core import artifacts
from ensemble.core.manifest import Manifest
from ensemble.config import schema
from ensemble.replication import placement_log
from ensemble.runs import run_status

CONFIG = """
[data]
source = "digits"
[members]
count = 2
hidden = [32]
dropout = 0.0
[training]
epochs = 3
batch_size = 64
seed = 3
"""
CPU = "/device:CPU:{}"


@pytest.fixture(scope="module")
def cfg_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("dp") / "dp.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def plain(cfg_path):
    run_dir = cfg_path.parent / "plain"
    assert run_cli("train", "--config", cfg_path, "--devices", "cpu:2", "--run-dir", run_dir,
                   "--quiet") == 0
    return run_dir


@pytest.fixture(scope="module")
def replicated(cfg_path):
    run_dir = cfg_path.parent / "replicated"
    assert run_cli("train", "--config", cfg_path, "--devices", "cpu:4", "--replicas", "2",
                   "--run-dir", run_dir, "--quiet") == 0
    return run_dir


def _probs(run_dir):
    t = pq.read_table(run_dir / "predictions.parquet")
    return t, np.column_stack([t.column(f"p_{c}").to_numpy() for c in range(10)])


def _same_members(a, b, atol=1e-4):
    (ta, pa), (tb, pb) = _probs(a), _probs(b)
    assert np.abs(pa - pb).max() <= atol
    assert ta.column("y_pred").equals(tb.column("y_pred"))


def test_in_graph_replicas_give_the_unreplicated_members(plain, replicated):
    _same_members(replicated, plain)
    manifest = artifacts.read_manifest(replicated)
    assert manifest["devices"] == [CPU.format(i) for i in range(4)]
    assert manifest["placement"]["replicas"] == 2
    assert [m["replicas"] for m in manifest["members"]] == [[CPU.format(0), CPU.format(2)],
                                                           [CPU.format(1), CPU.format(3)]]
    assert [m["device"] for m in manifest["members"]] == [CPU.format(0), CPU.format(1)]
    assert [m["replicas"] for m in artifacts.read_manifest(plain)["members"]] == \
        [[CPU.format(0)], [CPU.format(1)]]


def test_between_graph_clients_train_replicated_members(plain, cfg_path, capsys):
    run_dir = cfg_path.parent / "between"
    assert run_cli("train", "--config", cfg_path, "--mode", "between-graph", "--devices",
                   "cpu:4", "--replicas", "2", "--run-dir", run_dir, "--quiet", "--jobs", "1",
                   "--log-device-placement") == 0
    _same_members(run_dir, plain)
    # the one client split its CPU into 4 logical devices: member 0's ops on its 2 replicas'
    # (TensorFlow logs placement only in a fresh process: the first member of a client)
    lines = (run_dir / "placement" / "member-0.log").read_text().splitlines()
    used = placement_log.summary(lines)[0]
    assert {d.rpartition("device:")[2] for d in used} == {"CPU:0", "CPU:1"}, used
    assert "member 0: " in capsys.readouterr().out


def _group(devs, replicas=None, dropout=0.0):
    from ensemble.replication.in_graph import InGraphEnsemble

    cfg = schema.from_dict({"members": {"count": 2, "hidden": [16], "dropout": dropout},
                            "training": {"epochs": 1, "batch_size": 64, "seed": 5,
                                         "early_stopping": 0}})
    ens = InGraphEnsemble.build(cfg, 64, 10, devs, list(range(len(devs))), aggregators=(),
                                task=tasks.get())
    ens.train_replicas = replicas
    return ens, cfg


@pytest.fixture(scope="module")
def digits(plain):
    return {s: artifacts.read_split(plain, s) for s in artifacts.SPLITS}


def _ops(graph):
    ops = [(op.name, op.type, op.device) for op in graph.get_operations()]
    for fn in graph.as_graph_def().library.function:
        ops += [(n.name, n.op, n.device) for n in fn.node_def]
    return ops


def test_one_replica_keeps_the_graph_of_today(digits):
    x, y, _ = digits["train"]
    graphs = []
    for replicas in (None, [[CPU.format(0)], [CPU.format(1)]]):
        ens, _ = _group([CPU.format(0), CPU.format(1)], replicas)
        graph = ens.make_train_steps(x, y).get_concrete_function().graph
        graphs.append(sorted((t, d) for _, t, d in _ops(graph)))
    assert graphs[0] == graphs[1]


def test_traced_graph_puts_each_replica_on_its_device_and_the_update_home(digits):
    x, y, _ = digits["train"]
    reps = [[CPU.format(1), CPU.format(3)], [CPU.format(2), CPU.format(0)]]
    ens, _ = _group([r[0] for r in reps], reps)
    ops = _ops(ens.make_train_steps(x, y).get_concrete_function().graph)
    for k, devs in enumerate(reps):
        for j, dev in enumerate(devs):
            mine = [(n, t, d) for n, t, d in ops if f"replica_{j}_member_{k}/" in n
                    and t not in ("Placeholder", "ReadVariableOp")]
            forward = [d for n, t, d in mine if t == "MatMul" and "gradient" not in n]
            backward = [d for n, t, d in mine if t == "MatMul" and "gradient_tape/" in n]
            assert len(forward) == 2 and len(backward) == 3, (k, j, mine)
            assert {d for _, _, d in mine} == {dev}, (k, j, {d for _, _, d in mine})
        # the average and the optimiser's update on the member's home device, its variables too
        home = [(t, d) for n, t, d in ops if f"replica_mean_member_{k}/" in n]
        assert {t for t, _ in home} >= {"AddN", "ResourceApplyAdam"}
        assert {d for _, d in home} == {devs[0]}
        assert all(v.value.device.endswith(devs[0][len("/device"):])
                   for v in ens.models[k].trainable_variables)


@pytest.mark.parametrize("rows, n_replicas", [(7, 3), (2, 3), (64, 4)])
def test_uneven_batches_are_weighted_by_rows(digits, rows, n_replicas):
    import keras
    import tensorflow as tf

    from ensemble import tasks
    from ensemble.replication.steps import replicated_train_step
    from ensemble.replication.training import train_step

    x, y, _ = digits["train"]
    task = tasks.get()
    idx = np.arange(rows) * 5
    xb, yb = tf.constant(x[idx], tf.float32), tf.constant(y[idx], tf.int32)
    out = []
    for devs in ([CPU.format(0)], [CPU.format(j) for j in range(n_replicas)]):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(8, "relu"),
                                  keras.layers.Dense(10)])
        opt = keras.optimizers.SGD(0.5)
        opt.build(model.trainable_variables)
        step = (tf.function(lambda a, b: train_step(model, opt, a, b, task))
                if len(devs) == 1 else
                tf.function(lambda a, b: replicated_train_step(model, opt, (a, b), task, devs)))
        loss = step(xb, yb).numpy()
        out.append((loss, [w.numpy() for w in model.weights]))
    assert np.isfinite(out[1][0]) and abs(out[0][0] - out[1][0]) <= 1e-5
    for a, b in zip(out[0][1], out[1][1]):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_dropout_masks_per_replica_are_deterministic(digits):
    from ensemble.replication.training import Schedule

    (x, y, _), (xv, yv, _) = digits["train"], digits["validation"]
    x, y, xv, yv = x[:320], y[:320], xv[:64], yv[:64]
    reps = [[CPU.format(0), CPU.format(2)], [CPU.format(1), CPU.format(3)]]
    weights = []
    for replicas in (reps, reps, None):
        ens, cfg = _group([CPU.format(0), CPU.format(1)], replicas, dropout=0.3)
        ens.fit(x, y, (xv, yv), Schedule.of(cfg.training))
        weights.append(ens.models[0].get_weights()[0])
    np.testing.assert_array_equal(weights[0], weights[1])
    assert not np.allclose(weights[0], weights[2], atol=1e-4)  # own masks, not today's


class _StopAfter:
    """A `training.Callback` that stops training after epoch `epoch` (its checkpoint saved)."""

    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_begin(self, *a):
        pass

    def on_call_end(self, *a):
        pass

    def on_epoch_end(self, epoch, records):
        if epoch == self.epoch:
            raise RuntimeError("stop here")


def test_resume_of_a_replicated_run_is_exact(replicated, cfg_path, tmp_path):
    from ensemble.replication.modes import TrainRequest
    from ensemble.runs.builtin_modes import InGraph
    from ensemble.runs.train import train_in_graph

    cfg = schema.load(cfg_path, overrides={"placement.devices": "cpu:4",
                                           "placement.replicas": 2})
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="stop here"):
        train_in_graph(TrainRequest(cfg, run_dir, verbosity=0), InGraph(),
                       callbacks=[_StopAfter(0)])
    assert run_status.effective_status(Manifest.load(run_dir), run_dir) == "failed"
    assert run_cli("train", "--resume", "--run-dir", run_dir, "--quiet") == 0
    _same_members(run_dir, replicated, atol=1e-6)


@pytest.mark.parametrize("argv, says", [
    (["--replicas", "0"], "placement.replicas"),
    (["--replicas", "two"], "placement.replicas"),
    (["--devices", "cpu:4", "--replicas", "5"], "--replicas"),
    (["--devices", "cpu:2", "--replicas", "3"], "1..2"),
])
def test_bad_replicas_exit_2_with_one_line(cfg_path, tmp_path, capsys, argv, says):
    assert run_cli("train", "--config", cfg_path, *argv, "--run-dir", tmp_path / "r") == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r" / "manifest.json").exists()


def test_replicas_span_the_tasks_of_a_cluster(plain, cfg_path, tmp_path):
    from test_cluster import WORKER, Servers

    servers = Servers(tmp_path)
    try:
        run_dir = tmp_path / "cluster"
        res = subprocess.run([sys.executable, "-m", "pipelines.cli", "train", "--config",
                              str(cfg_path), "--members", "1", "--cluster", str(servers.file),
                              "--devices", "auto", "--replicas", "2", "--run-dir",
                              str(run_dir), "--quiet"], capture_output=True, text=True,
                             timeout=240)
        assert res.returncode == 0, res.stderr
    finally:
        servers.stop()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["members"][0]["replicas"] == [WORKER.format(0), WORKER.format(1)]
    # member 0 depends only on (run seed, member index): the local member 0
    (t, p), (tp, pp) = _probs(run_dir), _probs(plain)
    mine = p[np.asarray(t.column("model").to_pylist()) == "member-0"]
    local = pp[np.asarray(tp.column("model").to_pylist()) == "member-0"]
    assert np.abs(mine - local).max() <= 1e-4
