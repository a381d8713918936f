"""Steady-state rates: when a process's steady calls ran (`SteadyState.spans`), and the rate of
several processes over the time when all of them were training (`pipelines.benchmark`)."""
import pytest

from ensemble.replication.training import SteadyState
from pipelines.benchmark import concurrent_flops_rate


def test_the_rate_counts_only_the_time_when_every_process_trains():
    # A: 100 FLOPs over [0, 10] (10/s); B: 50 over [5, 15] (5/s); both train in [5, 10]
    assert concurrent_flops_rate([[(0, 10, 100)], [(5, 15, 50)]]) == pytest.approx(15.0)
    # A pauses in [4, 6] (validation, say): B alone there does not count
    a, b = [(0, 4, 40), (6, 10, 40)], [(0, 10, 100)]
    assert concurrent_flops_rate([a, b]) == pytest.approx(20.0)
    # A's members one after another, B's one span: the seam does not matter
    assert concurrent_flops_rate([[(0, 5, 50), (5, 10, 100)], [(0, 10, 10)]]) == \
        pytest.approx((50 + 100 + 10) / 10)
    assert concurrent_flops_rate([[(0, 1, 5)], [(2, 3, 5)]]) is None  # never at once


def test_the_sum_of_own_rates_overstates_processes_that_partly_ran_alone():
    # each trains 100 FLOPs: alone at 20/s, together at 10/s each
    a, b = [(0, 2.5, 50), (2.5, 7.5, 50)], [(2.5, 7.5, 50), (7.5, 10, 50)]
    together = concurrent_flops_rate([a, b])
    own = sum(sum(f for *_, f in p) / (p[-1][1] - p[0][0]) for p in (a, b))
    assert together == pytest.approx(20.0) and own == pytest.approx(2 * 100 / 7.5)


def test_steady_spans_join_the_calls_of_an_epoch(monkeypatch):
    clock = iter([100.0, 101.0, 150.0, 151.5])  # time.time() at each counted call's end
    monkeypatch.setattr("ensemble.replication.training.time.time", lambda: next(clock))
    st = SteadyState(batch_size=10, n_train=95)  # 10 steps an epoch, the last of 5 rows
    st.on_call_end(0, 2, 10, None, 0.5)  # the run's first call: tracing, not counted
    st.on_call_end(0, 6, 10, None, 1.5)  # 40 rows in 1.0 s, ending at 100.0
    st.on_call_end(0, 10, 10, None, 2.5)  # 35 rows in 1.0 s, ending at 101.0
    st.on_call_end(1, 4, 10, None, 1.0)  # epoch 1, after validation: a new span
    st.on_call_end(1, 10, 10, None, 2.5)  # 55 rows in 1.5 s
    assert st.rows == 170 and st.seconds == pytest.approx(4.5)
    assert st.spans == [[99.0, 101.0, 75], [149.0, 151.5, 95]]
