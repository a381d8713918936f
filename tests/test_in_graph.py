"""The in-graph builder: placement read from the traced graph, and members that depend only on
(run seed, member index)."""

import re

import numpy as np
import pytest

from ensemble.core import artifacts
from ensemble.config import schema
from ensemble.replication import devices
from ensemble.runs import prepare
from ensemble.replication.placement import place

CFG = schema.from_dict({"members": {"count": 4, "hidden": [16], "dropout": 0.1},
                        "training": {"epochs": 2, "batch_size": 64, "seed": 5,
                                     "early_stopping": 0}})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("prepared")
    prepare.prepare(CFG, run_dir, "in-graph", ["/device:CPU:0"])
    return {s: artifacts.read_split(run_dir, s) for s in artifacts.SPLITS}


def _build(devs, indices=None):
    from ensemble.replication.in_graph import InGraphEnsemble

    return InGraphEnsemble.build(CFG, 64, 10, devs, indices)


# Variable reads and captured resource handles carry no device in the graph: the runtime
# colocates them with their variable, whose device the test checks separately.
COLOCATED = {"Placeholder", "ReadVariableOp"}


def _all_ops(graph):
    """(name, type, device) of the graph's ops and of the ops inside its functions (the
    bodies of the training call's `tf.while_loop`)."""
    ops = [(op.name, op.type, op.device) for op in graph.get_operations()]
    for fn in graph.as_graph_def().library.function:
        ops += [(n.name, n.op, n.device) for n in fn.node_def]
    return ops


def _ops_by_member(graph, n_members):
    found = {k: set() for k in range(n_members)}
    for name, kind, device in _all_ops(graph):
        m = re.match(r"(?:while(?:_\d+)?/)?member_(\d+)(?:_\d+)?/", name)
        if m and kind not in COLOCATED:
            found[int(m.group(1))].add(device)
    return found


def test_traced_training_graph_pins_each_member_to_its_device(prepared):
    devs = place(4, devices.split_cpu(2))
    assert devs == ["/device:CPU:0", "/device:CPU:1", "/device:CPU:0", "/device:CPU:1"]
    ens = _build(devs)
    x, y, _ = prepared["train"]
    graph = ens.make_train_steps(x, y).get_concrete_function().graph
    found = _ops_by_member(graph, 4)
    for k in range(4):
        assert found[k] == {devs[k]}, f"member {k} ops on {found[k]}"
    # the backward pass (MatMul gradients) is split evenly over the two devices too
    matmuls = [device for _, kind, device in _all_ops(graph) if kind == "MatMul"]
    assert matmuls.count("/device:CPU:0") == matmuls.count("/device:CPU:1") > 0
    # member variables live on the member's device
    for k, model in enumerate(ens.models):
        assert all(v.value.device.endswith(devs[k][len("/device"):])
                   for v in model.trainable_variables)


def test_aggregation_ops_run_on_the_client_device():
    devs = ["/device:CPU:1", "/device:CPU:2"]
    ens = _build(devs, [0, 1])
    graph = ens.predict_fn.get_concrete_function().graph
    found = _ops_by_member(graph, 2)
    assert found[0] == {devs[0]} and found[1] == {devs[1]}
    stacks = [op for op in graph.get_operations() if op.type in ("Pack", "Mean", "OneHot")]
    assert stacks and all(op.device == "/device:CPU:0" for op in stacks)


def test_member_alone_equals_member_in_ensemble(prepared):
    (x, y, _), (xv, yv, _) = prepared["train"], prepared["validation"]
    from ensemble.replication.training import Schedule

    schedule = Schedule.of(CFG.training)
    full = _build(["/device:CPU:0", "/device:CPU:1", "/device:CPU:2", "/device:CPU:3"])
    full.fit(x, y, (xv, yv), schedule)
    alone = _build(["/device:CPU:3"], [2])
    alone.fit(x, y, (xv, yv), schedule)
    for a, b in zip(alone.models[0].get_weights(), full.models[2].get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    other = full.models[1].get_weights()[0]
    assert not np.allclose(other, full.models[2].get_weights()[0])
    xt = prepared["test"][0]
    np.testing.assert_allclose(alone.predict(xt)[0][0], full.predict(xt)[0][2], atol=1e-6)


def test_each_cpu_member_loops_on_the_single_threaded_executor(prepared):
    """Each member's loop is a call of its own on TensorFlow's single-threaded executor (its
    ops never change threads, as in a between-graph client), kept a functional `While`."""
    devs = place(4, devices.split_cpu(2))
    ens = _build(devs)
    x, y, _ = prepared["train"]
    graph = ens.make_train_steps(x, y).get_concrete_function().graph
    calls = [(op.get_attr("executor_type"), op.device) for op in graph.get_operations()
             if op.type == "StatefulPartitionedCall"]
    inner = [(n.op, n.attr["_lower_using_switch_merge"].b)
             for fn in graph.as_graph_def().library.function for n in fn.node_def
             if n.op in ("While", "StatelessWhile")]
    assert sorted(calls) == sorted((b"SINGLE_THREADED_EXECUTOR", d) for d in devs)
    assert len(inner) == 4 and not any(lowered for _, lowered in inner)


@pytest.mark.parametrize("group, expected", [
    (["/device:CPU:0"], True), (["/job:localhost/replica:0/task:0/device:CPU:1"], True),
    (["/job:worker/replica:0/task:1/device:CPU:0"], False), (["/device:GPU:0"], False),
    (["/device:CPU:0", "/device:CPU:1"], False)])
def test_single_threaded_only_for_a_local_cpu_member_of_one_replica(group, expected):
    from ensemble.replication.steps import single_threaded

    assert single_threaded(group) is expected
