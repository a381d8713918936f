"""Device placement: which device each member runs on, and which between-graph client runs it.

Pure; does not import TensorFlow.

Two small strategy objects, modelled on adanet's `RoundRobinStrategy`:

- `RoundRobinPlacement`: member `i` lands on `devices[i % len(devices)]`, so members
  outnumbering devices share them evenly by count.
- `BalancedPlacement`: members of different cost (FLOPs per row, for hyperparameter
  ensembles) go to devices by the longest-processing-time rule (Graham 1969): the most costly
  member first, each to the device with the least cost so far (ties to the device with fewer
  members, then the lower position). A 4/3-approximation of the best makespan; a dozen lines, so no library.

Between-graph's clients: `default_jobs` (one per core or GPU, one per member at most),
`client_queues` (which members each client trains, members of a device together) and
`client_count` (how many the launcher starts: the memory budget's count of processes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ensemble.core.errors import UsageError
from ensemble.replication import devices as _devices

STRATEGIES = ("round-robin", "balanced")


def _check_devices(devices: tuple[str, ...]) -> None:
    if not devices:
        raise UsageError("Expected at least one device. Received: devices=[]")
    if len(set(devices)) != len(devices):
        raise UsageError(f"Expected distinct device names. Received: {list(devices)}")


def _check_count(n_members: int) -> None:
    if isinstance(n_members, bool) or not isinstance(n_members, int) or n_members < 1:
        raise UsageError(
            f"Expected `n_members` to be a positive integer. Received: n_members={n_members!r}"
        )


@dataclass(frozen=True)
class RoundRobinPlacement:
    """Round-robin placement of `n_members` members over `devices`.

    Args:
        devices: device names, e.g. `["/device:CPU:0", "/device:CPU:1"]`; at least one.

    Raises:
        UsageError: empty device list or duplicated names.
    """

    devices: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_devices(self.devices)

    def assign(self, n_members: int) -> list[str]:
        """Return the device of every member: a list of length `n_members`.

        Raises:
            UsageError: `n_members` is not a positive integer.
        """
        _check_count(n_members)
        return [self.devices[i % len(self.devices)] for i in range(n_members)]


@dataclass(frozen=True)
class BalancedPlacement:
    """Longest-processing-time placement of members with costs over `devices`.

    Raises:
        UsageError: empty device list or duplicated names.
    """

    devices: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_devices(self.devices)

    def assign(self, costs: Sequence[float]) -> list[str]:
        """Return the device of every member given its cost (e.g. FLOPs per row).

        Args:
            costs: `[n_members]` non-negative costs.

        Raises:
            UsageError: no members, or a negative cost.
        """
        _check_count(len(costs))
        if any(c < 0 for c in costs):
            raise UsageError(f"Expected non-negative member costs. Received: {list(costs)}")
        load, count = [0.0] * len(self.devices), [0] * len(self.devices)
        out = [""] * len(costs)
        for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
            d = min(range(len(load)), key=lambda d: (load[d], count[d], d))
            out[i], load[d], count[d] = self.devices[d], load[d] + costs[i], count[d] + 1
        return out


def place(n_members: int, devices: Sequence[str], strategy: str = "round-robin",
          costs: Sequence[float] | None = None) -> list[str]:
    """The device of every member by `strategy` (`round-robin`, or `balanced` by `costs`).

    Raises:
        UsageError: unknown strategy, or `costs` not one per member for `balanced`.
    """
    if strategy == "round-robin":
        return RoundRobinPlacement(tuple(devices)).assign(n_members)
    if strategy == "balanced":
        if costs is None or len(costs) != n_members:
            raise UsageError(f"Balanced placement needs one cost per member ({n_members}). "
                             f"Received: {costs!r}")
        return BalancedPlacement(tuple(devices)).assign(list(costs))
    raise UsageError(f"Expected `placement.strategy` to be one of {', '.join(STRATEGIES)}. "
                     f"Received: {strategy!r}")


def replica_devices(n_members: int, devices: Sequence[str], replicas: int | str = "auto"
                    ) -> list[list[str]]:
    """The devices of every member's replicas (data parallelism in training and prediction): replica `j`
    of member `i` on `devices[(i + j * n_members) % len(devices)]`, so replica 0 is the
    round-robin device of `place` and, with `devices // members` replicas each, every device
    works. Where that comes back to the member's first device (`j` a multiple of `cycle =
    devices / gcd(members, devices)`: 3 replicas of 2 members on 4 devices), it moves on by
    `j // cycle` devices, so a member's replicas stay on distinct devices.

    Args:
        replicas: `auto` (`max(1, len(devices) // n_members)`) or a positive integer (or its
            digits), at most
            `len(devices)` (a member's replicas never share a device).

    Returns:
        `[n_members]` lists of `replicas` device names.

    Raises:
        UsageError: `replicas` is neither `auto` nor an integer in 1..len(devices).
    """
    _check_count(n_members)
    _check_devices(tuple(devices))
    if replicas == "auto":
        replicas = max(1, len(devices) // n_members)
    if isinstance(replicas, str) and replicas.isdigit():
        replicas = int(replicas)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or \
            not 1 <= replicas <= len(devices):
        raise UsageError(f"Expected --replicas to be auto or an integer in 1..{len(devices)} "
                         f"(the devices). Received: {replicas!r}")
    cycle = len(devices) // math.gcd(n_members, len(devices))
    return [[devices[(i + j * n_members + j // cycle) % len(devices)] for j in range(replicas)]
            for i in range(n_members)]


def is_remote(device: str) -> bool:
    """Whether `device` is a task of a TensorFlow cluster (`/job:<name>/...`, not
    `/job:localhost`): such a device gets a client of its own."""
    return "/job:" in device and "/job:localhost" not in device


def default_jobs(n_members: int, devs: Sequence[str]) -> int:
    """As many concurrent clients as members, devices (GPUs) or cores allow."""
    n_gpus = sum("GPU" in d for d in set(devs))
    return max(1, min(n_members, n_gpus or _devices.cpu_count()))


def client_queues(devs: dict[int, str], jobs: int) -> list[list[int]]:
    """Split the members into at most `jobs` client queues, members of one device together.

    Device groups (members in index order) go round robin over the queues; when there are
    fewer devices than `jobs` and they are local, the members themselves go round robin, so
    that `jobs` clients share the devices. A member's results never depend on its queue.

    Args:
        devs: member index -> the member's device in the run.

    Returns:
        `[n_queues]` lists of member indices, each non-empty.
    """
    groups: dict[str, list[int]] = {}
    for i in sorted(devs):
        groups.setdefault(devs[i], []).append(i)
    n = max(1, min(jobs, len(devs)))
    remote = any(is_remote(d) for d in groups)
    if len(groups) >= n or remote:
        queues: list[list[int]] = [[] for _ in range(min(n, len(groups)) if not remote
                                                     else len(groups))]
        for g, members in enumerate(groups.values()):
            queues[g % len(queues)].extend(members)
        return queues
    ordered = [i for members in groups.values() for i in members]
    return [ordered[q::n] for q in range(n)]


def client_count(n_members: int, devices: Sequence[str], jobs: int | None = None) -> int:
    """The between-graph clients a launcher starts for `n_members` members placed round robin
    on `devices` with `jobs` clients at once (None: `default_jobs`): `len(client_queues)`.
    The memory budget counts TensorFlow processes with it."""
    devs = dict(enumerate(place(n_members, devices)))
    return len(client_queues(devs, jobs or default_jobs(n_members, list(devs.values()))))
