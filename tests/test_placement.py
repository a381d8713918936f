import pytest

from ensemble.core.errors import UsageError
from ensemble.replication.placement import RoundRobinPlacement, place

CASES = [
    # n_members, devices, expected
    (1, ["/d:0"], ["/d:0"]),
    (3, ["/d:0"], ["/d:0", "/d:0", "/d:0"]),
    (4, ["/d:0", "/d:1"], ["/d:0", "/d:1", "/d:0", "/d:1"]),
    (5, ["/d:0", "/d:1", "/d:2"], ["/d:0", "/d:1", "/d:2", "/d:0", "/d:1"]),
    (2, ["/d:0", "/d:1", "/d:2"], ["/d:0", "/d:1"]),
]


@pytest.mark.parametrize("n, devices, expected", CASES)
def test_round_robin_table(n, devices, expected):
    assert place(n, devices) == expected


def test_members_share_devices_evenly():
    counts = {}
    for d in RoundRobinPlacement(("a", "b", "c")).assign(10):
        counts[d] = counts.get(d, 0) + 1
    assert sorted(counts.values()) == [3, 3, 4]


@pytest.mark.parametrize("devices", [(), ("a", "a")])
def test_bad_device_lists(devices):
    with pytest.raises(UsageError):
        RoundRobinPlacement(devices)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_bad_member_counts(n):
    with pytest.raises(UsageError, match="n_members"):
        place(n, ["a"])


def test_placement_does_not_import_tensorflow():
    import subprocess
    import sys

    code = "import sys, ensemble.replication.placement; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


BALANCED = [
    # costs, devices, expected (longest first, each to the least-loaded device)
    ([5, 5], ["a", "b"], ["a", "b"]),
    ([1, 9, 1, 1], ["a", "b"], ["b", "a", "b", "b"]),  # 9 alone; the three 1s together
    ([3, 3, 2, 2, 2], ["a", "b"], ["a", "b", "a", "b", "a"]),  # loads 7 and 5
    ([4, 1, 4, 1], ["a", "b", "c"], ["a", "c", "b", "c"]),
    ([2, 2, 2], ["a"], ["a", "a", "a"]),
    ([0, 0], ["a", "b"], ["a", "b"]),  # equal costs: round robin by index
]


@pytest.mark.parametrize("costs, devices, expected", BALANCED)
def test_balanced_table(costs, devices, expected):
    assert place(len(costs), devices, "balanced", costs) == expected


def test_balanced_beats_round_robin_on_mixed_costs():
    costs = [8, 1, 8, 1]  # round robin puts both 8s on the same device of two
    load = {}
    for strategy in ("round-robin", "balanced"):
        devs = place(4, ["a", "b"], strategy, costs)
        load[strategy] = max(sum(c for c, d in zip(costs, devs) if d == x) for x in "ab")
    assert load == {"round-robin": 16, "balanced": 9}


def test_mlp_flops_by_hand():
    from ensemble.models.cost import mlp_flops

    assert mlp_flops(64, [256, 128], 10) == 2 * (64 * 256 + 256 * 128 + 128 * 10)
    assert mlp_flops(4, [], 3) == 24


@pytest.mark.parametrize("strategy, costs, match", [
    ("fastest", None, "placement.strategy"),
    ("balanced", None, "one cost per member"),
    ("balanced", [1, -1], "non-negative"),
])
def test_bad_strategies(strategy, costs, match):
    with pytest.raises(UsageError, match=match):
        place(2, ["a", "b"], strategy, costs)


@pytest.mark.parametrize("devs, jobs, expected", [
    # members of one device stay together; device groups go round robin over the clients
    ({0: "a", 1: "b", 2: "a", 3: "b"}, 2, [[0, 2], [1, 3]]),
    ({0: "a", 1: "b", 2: "a", 3: "b"}, 1, [[0, 2, 1, 3]]),
    ({0: "a", 1: "b", 2: "c"}, 2, [[0, 2], [1]]),
    # more clients than local devices: the members themselves share the devices
    ({0: "a", 1: "b", 2: "a", 3: "b"}, 4, [[0], [2], [1], [3]]),
    ({0: "a", 1: "a", 2: "a"}, 2, [[0, 2], [1]]),
    # a cluster's task gets a client of its own, whatever --jobs says
    ({0: "/job:w/task:0/device:CPU:0", 1: "/job:w/task:1/device:CPU:0"}, 1, [[0], [1]]),
])
def test_client_queues_by_hand(devs, jobs, expected):
    from ensemble.replication.placement import client_queues

    assert client_queues(devs, jobs) == expected
