"""The in-graph builder: placement read from the traced graph, and members that depend only on
(run seed, member index)."""

import re

import numpy as np
import pytest

from ensemble.core import artifacts
from ensemble.config import schema
from ensemble.replication import devices
from ensemble.replication.modes import TrainRequest
from ensemble.runs.builtin_modes import InGraph
from ensemble.runs import prepare
from ensemble.replication.placement import place

CFG = schema.from_dict({"members": {"count": 4, "hidden": [16], "dropout": 0.1},
                        "training": {"epochs": 2, "batch_size": 64, "seed": 5,
                                     "early_stopping": 0}})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("prepared")
    prepare.prepare(TrainRequest(CFG, run_dir), InGraph(), ["/device:CPU:0"])
    return {s: artifacts.read_split(run_dir, s) for s in artifacts.SPLITS}


def _build(devs, indices=None):
    from ensemble import tasks
    from ensemble.replication.in_graph import InGraphEnsemble

    return InGraphEnsemble.build(CFG, 64, 10, devs, indices, task=tasks.get())


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


def test_each_devices_loop_takes_its_inputs_on_its_device(prepared):
    """A loop's frame nodes are placed beside its inputs: inputs on the client device made
    every step of a member on another device wait on a cross-device send (seen in a
    profile: one `_Send` per step of each member on CPU:1; unmasked loops, which are not
    inside a condition). There is one loop per device, and every input of a loop
    but the variables' handles comes from the loop's device."""
    devs = place(4, devices.split_cpu(2))
    ens = _build(devs)
    x, y, _ = prepared["train"]
    graph = ens.make_train_steps(x, y).get_concrete_function().graph
    loops = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    assert sorted(op.device for op in loops) == sorted(set(devs))  # one loop per device
    for op in loops:
        fed = [i.op for i in op.inputs if i.op.type not in COLOCATED]
        assert fed and all(i.device == op.device for i in fed), \
            [(i.name, i.device) for i in fed if i.device != op.device]


def _loops(graph):
    return [d for _, kind, d in _all_ops(graph) if kind in ("While", "StatelessWhile")]


def test_members_sharing_a_device_step_in_one_loop_as_each_would_alone(prepared):
    """Two members on one device train in one loop (each iteration a step of both) and end
    with the weights each gets alone, bit for bit. Once one of them stops, the call is traced
    masked (a loop per member, each inside a condition) and the stopped member stays put."""
    from ensemble.replication.steps import StepsCall
    from ensemble.replication.training import Schedule

    (x, y, _), (xv, yv, _) = prepared["train"], prepared["validation"]
    schedule = Schedule.of(CFG.training)
    pair = _build(["/device:CPU:0", "/device:CPU:0"], [0, 1])
    assert len(_loops(pair.make_train_steps(x, y).get_concrete_function().graph)) == 1
    masked = pair.make_train_steps(x, y, masked=True).get_concrete_function().graph
    assert len(_loops(masked)) == 2
    pair.fit(x, y, (xv, yv), schedule)
    for k in (0, 1):
        alone = _build(["/device:CPU:0"], [k])
        alone.fit(x, y, (xv, yv), schedule)
        for a, b in zip(alone.models[0].get_weights(), pair.models[k].get_weights()):
            np.testing.assert_array_equal(a, b)

    call = StepsCall(lambda m: pair.make_train_steps(x, y, masked=m))
    xb = np.stack([x[None, :64], x[None, 64:128]])  # [2 members, 1 step, 64 rows, features]
    yb = np.stack([y[None, :64], y[None, 64:128]]).astype(pair.task.target_dtype)
    before = [m.get_weights() for m in pair.models]
    call.prepare(np.array([True, True]))  # the unmasked form is left to the first call
    assert call.traced == {}
    call.prepare(np.array([True, False]))  # between epochs: the masked form is traced there
    assert list(call.traced) == [True]
    sums = call((xb, yb), np.zeros(2, np.float32), np.array([True, False]))
    assert list(call.traced) == [True] and call.traced[True].experimental_get_tracing_count() == 1
    assert sums[0] > 0 and sums[1] == 0
    assert not np.array_equal(pair.models[0].get_weights()[0], before[0][0])
    for a, b in zip(pair.models[1].get_weights(), before[1]):
        np.testing.assert_array_equal(a, b)


def test_fit_keeps_the_last_epochs_validation_outputs_while_they_are_the_members(prepared):
    """The evaluation after training reuses the last epoch's validation outputs
    (`validation_outputs`) instead of predicting the split again: they are the final weights'
    outputs bit for bit (the same `predict` calls), and early stopping's restore of other
    weights drops them."""
    from ensemble.replication.training import Schedule

    (x, y, _), (xv, yv, _) = prepared["train"], prepared["validation"]
    ens = _build(["/device:CPU:0", "/device:CPU:0"], [0, 3])
    ens.fit(x, y, (xv, yv), Schedule.of(CFG.training))
    assert ens.validation_outputs.shape == (2, len(xv), 10)
    assert np.array_equal(ens.validation_outputs, ens.predict(xv)[0])
    ens.keep_best_weights()
    ens.restore_best(1)
    assert ens.validation_outputs is None


def test_validation_outputs_go_to_one_memory_map_for_every_epoch(prepared, tmp_path):
    """With `allocate` (a run's `OutputFiles.new`), every epoch's validation outputs are
    written into the one memory map the first epoch asked for: nothing in memory grows with
    the validation rows, and the disk holds one epoch's outputs; the values are the
    in-memory prediction's."""
    from ensemble.replication.training import Schedule
    from ensemble.tasks.eval_writer import OutputFiles

    (x, y, _), (xv, yv, _) = prepared["train"], prepared["validation"]
    files, asked = OutputFiles(tmp_path), []

    def allocate(shape, dtype):
        asked.append(shape)
        return files.new(shape, dtype)

    ens = _build(["/device:CPU:0", "/device:CPU:0"], [0, 3])
    history = ens.fit(x, y, (xv, yv), Schedule.of(CFG.training), allocate=allocate)
    assert len({r["epoch"] for r in history}) == CFG.training.epochs > 1
    assert asked == [(2, len(xv), 10)] and len(list(tmp_path.glob("*.npy"))) == 1
    assert isinstance(ens.validation_outputs, np.memmap)
    np.testing.assert_array_equal(ens.validation_outputs, ens.predict(xv)[0])
