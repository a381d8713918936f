"""Early stopping: each member of a group stops on its own validation loss and gets its best
epoch's weights back.

`train_loop` (`ensemble.replication.training`) calls `update` with every member's validation
loss after each epoch and `finish` after the last; `group.MemberGroup.early_stopping` builds it
with the group's weight copies.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


class EarlyStopping:
    """Early stopping of each member on its validation loss, restoring its best weights.

    A member whose validation loss has not dropped more than `min_delta` below its best for
    `patience` epochs stops (Keras's `EarlyStopping(min_delta=..., restore_best_weights=True)`):
    its steps are masked from then on and it gets the weights of its best epoch back; members
    still training at the last epoch get theirs back too.

    Args:
        patience: epochs without improvement before a member stops (> 0).
        n: members in the group.
        save, restore: `save(k)` copies member `k`'s weights aside, `restore(k)` puts them
            back (`group.MemberGroup.save_best`, `restore_best`).
        min_delta: the smallest drop below the best validation loss that is an improvement
            (>= 0; the loss's units).
    """

    def __init__(self, patience: int, n: int, save: Callable[[int], None],
                 restore: Callable[[int], None], min_delta: float = 0.0):
        self.patience, self.save, self.restore = patience, save, restore
        self.min_delta = min_delta
        self.best = [float("inf")] * n
        self.best_epoch = [-1] * n
        self.last_epoch = [-1] * n  # the epoch of each member's latest `update`
        self.active = np.ones(n, bool)

    def update(self, k: int, epoch: int, val_loss: float, live: bool = True) -> None:
        """Record member `k`'s validation loss of `epoch`; `live`: act on the weights (False
        when replaying restored history, whose weights the checkpoint holds)."""
        self.last_epoch[k] = epoch
        if val_loss < self.best[k] - self.min_delta:
            self.best[k], self.best_epoch[k] = val_loss, epoch
            if live:
                self.save(k)
        elif epoch - self.best_epoch[k] >= self.patience:
            self.active[k] = False
            if live and self.best_epoch[k] >= 0:
                self.restore(k)

    def finish(self) -> None:
        """At the end of training: members still active get their best weights back (those
        whose best epoch is their last have them already: nothing is restored)."""
        for k in np.flatnonzero(self.active):
            if 0 <= self.best_epoch[k] != self.last_epoch[k]:
                self.restore(int(k))
