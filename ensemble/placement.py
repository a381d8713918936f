"""Device placement: which device each member runs on. Pure; does not import TensorFlow.

Modelled on adanet's `RoundRobinStrategy`: members go over the devices in turn, so member `i`
lands on `devices[i % len(devices)]` and members outnumbering devices share them evenly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ensemble.errors import UsageError


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
        if not self.devices:
            raise UsageError("Expected at least one device. Received: devices=[]")
        if len(set(self.devices)) != len(self.devices):
            raise UsageError(f"Expected distinct device names. Received: {list(self.devices)}")

    def assign(self, n_members: int) -> list[str]:
        """Return the device of every member: a list of length `n_members`.

        Raises:
            UsageError: `n_members` is not a positive integer.
        """
        if isinstance(n_members, bool) or not isinstance(n_members, int) or n_members < 1:
            raise UsageError(
                f"Expected `n_members` to be a positive integer. Received: n_members={n_members!r}"
            )
        return [self.devices[i % len(self.devices)] for i in range(n_members)]


def place(n_members: int, devices: Sequence[str]) -> list[str]:
    """Shorthand for `RoundRobinPlacement(tuple(devices)).assign(n_members)`."""
    return RoundRobinPlacement(tuple(devices)).assign(n_members)
