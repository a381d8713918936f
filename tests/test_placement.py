import pytest

from ensemble.errors import UsageError
from ensemble.placement import RoundRobinPlacement, place

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

    code = "import sys, ensemble.placement; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
