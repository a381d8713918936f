"""Divergence: members whose training loss or validation outputs turn non-finite.

Keras's `TerminateOnNaN` stops a whole fit; an ensemble keeps its healthy members instead. The
training loop (`ensemble.replication.training.train_loop`) already brings two things back to the host: the
running loss sums `[n_members]` after every traced call (many steps), and the validation
outputs `[n_members, n_val, ...]` after every epoch. `Divergence` looks at those, and only
those, so finding a diverged member costs no extra device sync: a member whose loss sum or
outputs hold NaN or an infinity is marked *diverged* with its epoch, its steps are masked from
then on (as early stopping masks a stopped member) and it leaves the ensemble: no aggregate,
metric or table of the run holds its (NaN) predictions. The manifest records it as
`{"status": "diverged", "diverged_epoch": e}`; `members.parquet` as `status`, `diverged_epoch`.
A run whose every member diverged fails (`AllDiverged`, a one-line error).
"""

from __future__ import annotations

import sys

from typing import Sequence

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.tasks.eval_writer import CHUNK_ROWS  # rows of validation outputs checked at a time

STATUS = "diverged"


class AllDiverged(UsageError):
    """Every member of a run diverged: the configuration (learning rate, builder, targets),
    not the program, has to change."""


class Divergence:
    """The diverged members of a group trained together.

    Args:
        indices: `[n_members]` the members' indices in the run (position `k` is member
            `indices[k]`).

    Attributes:
        epochs: `{member index: epoch}` of each diverged member (the epoch, from 0, in which
            its loss or outputs were first non-finite).
        reasons: `{member index: "loss" | "outputs"}`.
    """

    def __init__(self, indices: Sequence[int]):
        self.indices = list(indices)
        self.epochs: dict[int, int] = {}
        self.reasons: dict[int, str] = {}

    def healthy(self) -> np.ndarray:
        """`[n_members]` bool: True for the members that have not diverged."""
        return np.array([i not in self.epochs for i in self.indices], bool)

    def _mark(self, k: int, epoch: int, reason: str) -> bool:
        i = self.indices[k]
        if i in self.epochs:
            return False
        self.epochs[i], self.reasons[i] = int(epoch), reason
        return True

    def check_losses(self, epoch: int, totals: np.ndarray, active: np.ndarray) -> bool:
        """Mark the active members whose running loss sum `totals` `[n_members]` (as a traced
        call returns it) is not finite; returns whether any member was newly marked."""
        bad = active & ~np.isfinite(np.asarray(totals, np.float64))
        return any([self._mark(int(k), epoch, "loss") for k in np.flatnonzero(bad)])

    def check_outputs(self, epoch: int, outputs: np.ndarray, active: np.ndarray) -> bool:
        """Mark the active members whose validation outputs `outputs` `[n_members, n_val,
        ...]` hold a non-finite value; returns whether any member was newly marked."""
        finite = np.ones(len(outputs), bool)
        for lo in range(0, outputs.shape[1], CHUNK_ROWS):  # a memory map: a chunk at a time
            chunk = np.asarray(outputs[:, lo:lo + CHUNK_ROWS]).reshape(len(outputs), -1)
            finite &= np.isfinite(chunk).all(axis=1)
        bad = active & ~finite
        return any([self._mark(int(k), epoch, "outputs") for k in np.flatnonzero(bad)])

    def record(self, members: list) -> None:
        """Set `status` and `diverged_epoch` of the diverged members' records
        (`members`: the manifest's `MemberRecord`s, changed in place)."""
        for i, epoch in self.epochs.items():
            members[i].status = STATUS
            members[i].diverged_epoch = epoch


def describe(epochs: dict[int, int]) -> str:
    """`member 2 (epoch 3), member 5 (epoch 1)` (epochs counted from 1, as progress shows
    them)."""
    return ", ".join(f"member {i} (epoch {e + 1})" for i, e in sorted(epochs.items()))


def notice(epochs: dict[int, int], n_members: int, run_dir) -> str:
    """The line a run prints when some (not all) of its `n_members` members diverged: which
    and how to go on."""
    n = n_members - len(epochs)
    return (f"warning: {describe(epochs)} diverged (non-finite loss or outputs) and "
            f"{'is' if len(epochs) == 1 else 'are'} left out; the ensemble uses the other {n} "
            f"member{'s' if n != 1 else ''}. To keep {'it' if len(epochs) == 1 else 'them'}, "
            "lower its learning rate (`[[members.override]]` learning_rate) or fix its builder "
            f"and train again (`--overwrite --run-dir {run_dir}`); or keep this run as it is.")


def all_diverged(epochs: dict[int, int]) -> AllDiverged:
    """The error of a run whose every member diverged."""
    return AllDiverged(f"every member diverged ({describe(epochs)}: non-finite loss or "
                       "outputs); lower training.learning_rate, check the builder's outputs and "
                       "the targets' scale, then train again with --overwrite.")


def settle(epochs: dict[int, int], n_members: int, run_dir) -> None:
    """What a run does once its members' divergence is known (`epochs`: member -> the epoch it
    diverged in, of `n_members`): fail when every member diverged, else warn (`notice`, on
    stderr) when some did.

    Raises:
        AllDiverged: every member diverged.
    """
    if len(epochs) == n_members:
        raise all_diverged(epochs)
    if epochs:
        print(notice(epochs, n_members, run_dir), file=sys.stderr, flush=True)
