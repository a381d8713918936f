"""The host side of training: each call's batches gathered into reused aligned buffers and handed
to TensorFlow without a copy, gathered one call ahead across epochs, and the call size (K)
chosen from calls that did not trace the graph."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

from ensemble.replication import early_stopping, feed, training
from ensemble.replication.training import Schedule, train_loop

TASK = SimpleNamespace(score_names=("val_loss",),
                       validation_scores=lambda y, v: {"val_loss": float(np.mean(v))})


def test_gather_cycles_two_aligned_buffers():
    x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    g = feed.Gather(x, np.arange(40), np.int32)
    idx = np.array([[[5, 1], [39, 0]], [[2, 2], [7, 8]]])  # [n_members, steps, batch]
    first = g(idx)
    kept = [a.copy() for a in first]
    second = g(idx[:, :1])
    third = g(idx)
    for a in (*first, *second, *third):
        assert a.ctypes.data % feed.ALIGN == 0 and a.flags.c_contiguous
    assert not np.shares_memory(first[0], second[0])
    assert np.shares_memory(first[0], third[0])  # the slot of two gathers ago, reused
    np.testing.assert_array_equal(third[0], x[idx])
    np.testing.assert_array_equal(third[1], idx)
    np.testing.assert_array_equal(kept[0], x[idx])
    np.testing.assert_array_equal(second[0], x[idx[:, :1]])


def test_a_larger_call_gets_a_larger_buffer():
    x = np.random.default_rng(0).random((100, 4)).astype(np.float32)
    g = feed.Gather(x, np.zeros(100), np.float32)
    small = np.zeros((2, 1, 3), int)
    big = np.random.default_rng(1).integers(0, 100, (2, 50, 3))
    g(small), g(small)
    xb, yb = g(big)  # slot 0 again, too small for this call: grown
    np.testing.assert_array_equal(xb, x[big])
    assert yb.dtype == np.float32 and yb.shape == big.shape


def test_plan_calls_bounds_a_call_by_bytes_and_by_the_epoch(monkeypatch):
    g = feed.Gather(np.zeros((10, 4), np.float32), np.zeros(10), np.int32)  # 20 B a row
    monkeypatch.setattr(feed, "CALL_BYTES", 20 * 2 * 3 * 7)  # 7 steps of 2 members x 3 rows
    assert g.plan_calls(2, 3) == 7 and g.call_rows == 42
    assert g.plan_calls(2, 3, n_steps=4) == 4 and g.call_rows == 24
    assert g.plan_calls(2, 1000) == 1  # a step larger than the bound: still one


def test_buffers_are_made_once_at_the_largest_calls_size():
    x = np.random.default_rng(0).random((100, 4)).astype(np.float32)
    g = feed.Gather(x, np.zeros(100), np.int32)
    assert g.plan_calls(2, 3, n_steps=50) == 50 and g.call_rows == 2 * 50 * 3
    small, big = np.zeros((2, 1, 3), int), np.random.default_rng(1).integers(0, 100, (2, 50, 3))
    first = g(small)[0]
    g(small)
    xb = g(big)[0]  # slot 0 again: the memory of the first gather, large enough already
    assert np.shares_memory(first, xb)
    np.testing.assert_array_equal(xb, x[big])


def test_a_map_larger_than_half_the_memory_is_read_in_file_order(tmp_path, monkeypatch):
    x = np.random.default_rng(0).random((5000, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    idx = np.random.default_rng(1).integers(0, 5000, (3, 40, 16))
    assert not feed.Gather(mapped, np.arange(5000), np.int32).in_file_order  # fits: one pass
    monkeypatch.setattr(feed.memory, "available", lambda: (2 * mapped.nbytes - 1, "a cgroup"))
    monkeypatch.setattr(feed, "GATHER_BYTES", 1000)  # several blocks
    g = feed.Gather(mapped, np.arange(5000), np.int32)
    assert g.in_file_order
    xb, yb = g(idx)
    np.testing.assert_array_equal(xb, x[idx])
    np.testing.assert_array_equal(yb, idx)


def _gathered(a):
    return feed.Gather(a, np.zeros(len(a)), np.int32)(np.arange(len(a))[None, None])[0][0, 0]


def _read_only(a):
    assert a.ctypes.data % feed.ALIGN == 0
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("make", [
    _gathered,
    lambda a: a[1:],  # unaligned: copied
    lambda a: a[:, ::2],  # not contiguous: copied
    lambda a: a[:0],  # no rows
    lambda a: _read_only(_gathered(a)),  # aligned, but NumPy exports no read-only array
])
def test_to_tensor_holds_the_arrays_values(make):
    a = make(np.random.default_rng(0).random((9, 6)).astype(np.float32))
    np.testing.assert_array_equal(feed.to_tensor(a).numpy(), a)


def _loop(n_train, batch, epochs, run_steps, **kw):
    return train_loop(run_steps, [0, 1], Schedule(0, epochs, batch, kw.pop("k", 0)), n_train,
                    TASK, **kw)


def test_the_next_epochs_first_batches_are_gathered_during_validation():
    n_calls_epoch0 = 4  # 10 rows, batch 3, K 3: steps 0-3 one at a time, the ragged one last
    calls, seen_during_validation = [], []

    def gather(idx):
        calls.append(idx.copy())
        return idx

    def predict_val():  # epoch 0's validation waits (10 s at most) for epoch 1's first gather
        deadline = time.monotonic() + 10
        while len(calls) <= n_calls_epoch0 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen_during_validation.append(len(calls))
        return np.zeros((2, 3, 1))

    records = _loop(10, 3, 2, lambda b, total, active: total + 1, k=1, gather=gather,
                    predict_val=predict_val, y_val=np.zeros(3))
    assert seen_during_validation[0] == n_calls_epoch0 + 1
    assert [r["epoch"] for r in records] == [0, 0, 1, 1]
    assert len(calls) == 2 * n_calls_epoch0
    for e in range(2):  # each member sees each row once an epoch
        rows = np.concatenate([c.reshape(2, -1) for c in calls[4 * e:4 * e + 4]], axis=1)
        assert all(sorted(r) == list(range(10)) for r in rows)


def test_the_call_that_traces_does_not_size_the_next_calls(monkeypatch):
    monkeypatch.setattr(training, "CALL_SECONDS", 0.05)
    sizes = []

    def run_steps(idx, total, active):
        sizes.append(idx.shape[1])
        if len(sizes) == 1:
            time.sleep(0.5)  # tracing: 62 ms a step would have made K 1
        return total

    _loop(32 * 300, 32, 1, run_steps)
    assert sizes[0] == training.FIRST_CALL_STEPS
    assert min(sizes[:-1]) >= training.FIRST_CALL_STEPS  # the last call may be short
    assert max(sizes) > 4 * training.FIRST_CALL_STEPS  # then K grows with fast calls
    assert sum(sizes) == 300


def test_early_stopping_counts_only_drops_larger_than_min_delta():
    """Keras's `min_delta`: a validation loss creeping towards 0 (every validation row right)
    stops the member and restores the epoch of its last real improvement; with 0 it never
    stops. A member still training at the end gets its best epoch back unless that epoch is
    its last (its weights are the best already). `Schedule.of` takes it from
    `training.min_delta`."""
    creeping = [0.5, 0.01, 0.005, 0.0045, 0.0042, 0.004, 0.0038, 0.0036, 0.0034]
    rising = creeping[:8] + [0.0037]  # the last epoch no better: epoch 7 is restored
    for losses, min_delta, stopped, best, restores in (
            (creeping, 1e-3, True, 2, [0]), (creeping, 0.0, False, 8, []),
            (rising, 0.0, False, 7, [0])):
        restored = []
        stop = early_stopping.EarlyStopping(3, 1, lambda k: None, restored.append, min_delta)
        for epoch, loss in enumerate(losses):
            if stop.active[0]:
                stop.update(0, epoch, loss)
        stop.finish()
        assert (not stop.active[0]) == stopped and stop.best_epoch[0] == best
        assert restored == restores
    t = SimpleNamespace(seed=0, epochs=5, batch_size=8, steps_per_execution=0,
                        checkpoint_every=1, early_stopping=3, min_delta=0.01)
    assert Schedule.of(t).min_delta == 0.01
