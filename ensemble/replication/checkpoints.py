"""Per-epoch checkpoints (`tf.train.CheckpointManager`, the last two kept) and resume.

A checkpoint holds every trained variable of the members it covers (weights, optimiser slots
and step counters, dropout seed states, early stopping's best weights) plus the epoch it
closes; `history.json` beside it holds the
history records so far. Restoring tries the newest checkpoint, falls back to the previous one
when it is damaged, and fails with a message naming the file when none can be read: never a
silent restart from scratch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ensemble.core import artifacts
from ensemble.core.errors import UsageError

KEEP = 2
# checkpoint files are read and written by this process, also for variables on a cluster's
# tasks (whose machines may not see the run directory)
IO_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"


def _options():
    import tensorflow as tf

    return tf.train.CheckpointOptions(experimental_io_device=IO_DEVICE)


class EpochCheckpoints:
    """Checkpoints of a group of members (all of an in-graph run, or one client's member).

    Args:
        directory: where the checkpoint files go (created on the first save).
        models: the members' Keras models.
        optimizers: their optimisers (`ensemble.models.optimizer`), same order.
        best: early stopping's copies of each member's best weights (`[n_members]` lists of
            variables), or None.
    """

    def __init__(self, directory: Path, models, optimizers, best=None):
        import tensorflow as tf

        self.directory = Path(directory)
        self.epoch = tf.Variable(-1, dtype=tf.int64, trainable=False)
        groups = {}
        for k, (model, opt) in enumerate(zip(models, optimizers)):
            extra = {"best": list(best[k])} if best is not None else {}
            rng = getattr(model, "_ensemble_rng", None)  # `members.member_rng`'s stream
            if rng is not None:
                extra["rng"] = rng.state
            groups[f"member_{k}"] = tf.train.Checkpoint(
                variables=list(model.variables), optimizer=list(opt.variables), **extra)
        self.checkpoint = tf.train.Checkpoint(epoch=self.epoch, **groups)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(self.directory), KEEP)

    def save(self, epoch: int, history: list[dict]) -> None:
        """Save the history records so far, then the state after `epoch` (0-based).

        History first: a kill between the two leaves history rows of an epoch whose
        checkpoint is missing, which `restore` drops, never a checkpoint without its rows.
        """
        artifacts.write_text(self.directory / "history.json", json.dumps(history))
        self.epoch.assign(epoch)
        self._remove_partial(epoch)
        try:
            self.manager.save(checkpoint_number=epoch, options=_options())
        except Exception:  # a full disk: no partial checkpoint stays behind
            self._remove_partial(epoch)
            raise

    def _remove_partial(self, epoch: int) -> None:
        """Remove TensorFlow's staging folders (`*_temp`) and the files of checkpoint `epoch`
        when the checkpoint state does not list it: leftovers of a save that failed or was
        killed (only the run's lock holder writes here, so none is another's)."""
        import shutil

        listed = {Path(p).name for p in self.manager.checkpoints}
        for p in self.directory.glob("*_temp*"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        if f"ckpt-{epoch}" not in listed:
            for p in self.directory.glob(f"ckpt-{epoch}.*"):
                p.unlink(missing_ok=True)

    def restore(self) -> tuple[int, list[dict]]:
        """Restore the newest readable checkpoint.

        Returns:
            (the first epoch still to train, the history records of the restored epochs);
            `(0, [])` when there is no checkpoint yet.

        Raises:
            UsageError: checkpoints exist but none can be read (names the newest one).
        """
        import tensorflow as tf

        paths = list(reversed(self.manager.checkpoints))
        for path in paths:
            try:
                self.checkpoint.read(path, options=_options()).assert_existing_objects_matched()
            except (tf.errors.OpError, ValueError, AssertionError, IndexError, OSError) as exc:
                print(f"warning: checkpoint {path} is damaged ({type(exc).__name__}); "
                      "trying the previous one", file=sys.stderr)
                continue
            done = int(self.epoch.numpy())
            history = json.loads((self.directory / "history.json").read_text())
            return done + 1, [r for r in history if r["epoch"] <= done]
        if paths:
            raise UsageError(f"Every checkpoint in {self.directory} is damaged (newest: "
                             f"{paths[0]}); cannot resume. Start over with --overwrite.")
        return 0, []
