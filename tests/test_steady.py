"""Steady-state rates: when a process's steady calls ran (`SteadyState.spans`), and the rate of
several processes over the time when all of them were training (`benchmarks.benchmark`)."""
from types import SimpleNamespace

import pytest

from ensemble.replication.steady import SteadyState
from benchmarks.benchmark import _clients_steady, concurrent_flops_rate


def test_the_rate_counts_only_the_time_when_every_process_trains():
    # A: 100 FLOPs over [0, 10] (10/s); B: 50 over [5, 15] (5/s); both train in [5, 10]
    assert concurrent_flops_rate([[(0, 10, 100)], [(5, 15, 50)]]) == pytest.approx((15, 5))
    # A pauses in [4, 6] (validation, say): B alone there does not count
    a, b = [(0, 4, 40), (6, 10, 40)], [(0, 10, 100)]
    assert concurrent_flops_rate([a, b]) == pytest.approx((20, 8))
    # A's members one after another, B's one span: the seam does not matter
    assert concurrent_flops_rate([[(0, 5, 50), (5, 10, 100)], [(0, 10, 10)]]) == \
        pytest.approx(((50 + 100 + 10) / 10, 10))
    assert concurrent_flops_rate([[(0, 1, 5)], [(2, 3, 5)]]) is None  # never at once
    assert concurrent_flops_rate([[(0, 2, 5)], [(3, 1, 5)]]) is None  # a clock step back


def _client(member, rows, seconds, spans):
    return {"steady": {str(member): [rows, seconds]}, "spans": {str(member): spans}}


MANIFEST = SimpleNamespace(members=[SimpleNamespace(flops_per_row=1 / 3)] * 2)  # 1 FLOP a row


def test_between_graph_steady_rate_is_the_clients_rate_while_both_train():
    # each trains 100 rows: alone at 20 rows/s, together at 10/s each; each client's own rate
    # (100 rows in 7.5 s) summed says 26.7 rows/s, while both trained they did 20
    a = _client(0, 100, 7.5, [(0, 2.5, 50), (2.5, 7.5, 50)])
    b = _client(1, 100, 7.5, [(2.5, 7.5, 50), (7.5, 10, 50)])
    got = _clients_steady(MANIFEST, [a, b])
    assert got["steady_rows"] * 2 == pytest.approx(20.0)  # rows per member, 2 members
    assert got["steady_sum_rows"] * 2 == pytest.approx(2 * 100 / 7.5)


def test_between_graph_steady_rate_falls_back_to_the_sum():
    a = _client(0, 100, 10.0, [(0, 10, 100)])
    brief = _client(1, 100, 10.0, [(9, 19, 100)])  # together for 1 s of each client's 10
    no_spans = {"steady": {"1": [100, 10.0]}}
    for other in (brief, no_spans):
        assert _clients_steady(MANIFEST, [a, other]) == {"steady_rows": 10.0,
                                                         "steady_seconds": 1.0}
    assert _clients_steady(MANIFEST, [a]) == {"steady_rows": 5.0, "steady_seconds": 1.0}
    assert _clients_steady(MANIFEST, [{"steady": {}}]) == {}


def test_steady_spans_join_the_calls_of_an_epoch(monkeypatch):
    clock = iter([100.0, 101.0, 150.0, 151.5])  # time.time() at each counted call's end
    monkeypatch.setattr("ensemble.replication.steady.time.time", lambda: next(clock))
    st = SteadyState(batch_size=10, n_train=95)  # 10 steps an epoch, the last of 5 rows
    st.on_call_end(0, 2, 10, None, 0.5)  # the run's first call: tracing, not counted
    st.on_call_end(0, 6, 10, None, 1.5)  # 40 rows in 1.0 s, ending at 100.0
    st.on_call_end(0, 10, 10, None, 2.5)  # 35 rows in 1.0 s, ending at 101.0
    st.on_call_end(1, 4, 10, None, 1.0)  # epoch 1, after validation: a new span
    st.on_call_end(1, 10, 10, None, 2.5)  # 55 rows in 1.5 s
    assert st.rows == 170 and st.seconds == pytest.approx(4.5)
    assert st.spans == [[99.0, 101.0, 75], [149.0, 151.5, 95]]
