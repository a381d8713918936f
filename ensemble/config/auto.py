"""Defaults that follow the data: `training.epochs`, `training.batch_size` and
`training.early_stopping` = "auto".

A run whose config leaves these keys at `"auto"` (the defaults) gets concrete values once its
training rows are known (`resolve`), before anything trains; the concrete values are what the
run's manifest records as its config (its `defaults` entry says which keys were chosen and by
which rule), so every process of the run, and a `--resume`, sees the same numbers. The rules
are functions of the row counts and the config only, never of timing or the mode, so both
replication modes train identical members.

- batch size: the power of two nearest `sqrt(n_train)` (`2 ** floor(log2(n_train) / 2 + 1/2)`),
  within [32, 1024]: about as many steps per epoch as rows per step (32 below 2,048 training
  rows, 64 from 2,048, 128 from 8,192, 256 from 32,768, 512 from 131,072, 1024 from 524,288). Small tables keep Keras's 32; large
  ones stop paying per-step overhead for batches that do not improve the result (issue 40: 3.3x
  the time at 32 rows for the same log loss on 229k rows). RealMLP (Holzmueller et al. 2024)
  and TabM (Gorishniy et al. 2024) use 256 on tables of 10^4-10^5 rows.
- epochs: enough for at least `MIN_STEPS` (2,000) optimizer steps, within [30, 200]:
  `min(200, max(30, ceil(2000 / steps_per_epoch)))` with `steps_per_epoch = ceil(n_train /
  batch_size)`. A fixed epoch count gives a small table few steps (588 rows at batch 32: 19
  steps an epoch, 570 in 30 epochs; statsmodels' `modechoice` members were still improving on
  validation there); early stopping ends the runs that need fewer. Examples (training rows:
  batch, epochs): 240: 32, 200; 588: 32, 106; 1,500: 32, 43; 2,048: 64, 63; from about 4,300
  rows on 30 (an epoch is then 67+ steps; 8,192-8,533 rows, batch 128: 31). Without
  validation rows 30: the step budget is safe only with early stopping.
- early stopping: patience `min(20, max(5, epochs // 5))` epochs on each member's validation
  loss (the task's NLL), the best epoch's weights restored at the end (Keras's
  `EarlyStopping(restore_best_weights=True)`); off (0) without validation rows. The cap of
  20: with 200 epochs, a patience of 40 trained small tables' members 40 epochs past their
  best for nothing (diabetes' best epochs 3-10, stops at 43-79); at 20 the test figures of
  penguins, modechoice, diabetes and breast_cancer (3 split seeds) were the same to the last
  digit and their members trained 2-40% fewer epochs. An epoch
  improves on the best only by more than `training.min_delta` (default 0.001 nats per row,
  Keras's `min_delta`): a table whose validation rows are all classified right (penguins) has
  a validation loss that falls towards 0 forever by ever smaller steps while the members grow
  overconfident on the test rows (200 epochs without it: test log loss .028 -> .055).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ensemble.config.schema import Config

AUTO = "auto"
MIN_BATCH, MAX_BATCH = 32, 1024
MIN_PATIENCE, MAX_PATIENCE = 5, 20  # epochs
MIN_STEPS, MIN_EPOCHS, MAX_EPOCHS = 2000, 30, 200  # optimizer steps; epochs


def batch_size_for(n_train: int) -> int:
    """The automatic batch size for `n_train` training rows (see the module docstring)."""
    if n_train <= 1:
        return MIN_BATCH
    exponent = math.floor(math.log2(n_train) / 2 + 0.5)  # halves round up, not to even
    return int(min(MAX_BATCH, max(MIN_BATCH, 2 ** exponent)))


def epochs_for(n_train: int, batch_size: int, n_validation: int = 1) -> int:
    """The automatic epoch count for `n_train` training rows in batches of `batch_size` rows:
    at least `MIN_STEPS` optimizer steps, within [`MIN_EPOCHS`, `MAX_EPOCHS`]; `MIN_EPOCHS`
    without validation rows (no early stopping then ends the runs that need fewer)."""
    if n_validation <= 0:
        return MIN_EPOCHS
    steps_per_epoch = max(1, math.ceil(n_train / batch_size))
    return int(min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(MIN_STEPS / steps_per_epoch))))


def patience_for(epochs: int, n_validation: int) -> int:
    """The automatic early-stopping patience in epochs (0: off, without validation rows)."""
    return min(MAX_PATIENCE, max(MIN_PATIENCE, epochs // 5)) if n_validation > 0 else 0


def is_auto(value: Any) -> bool:
    """Whether a config value asks for the automatic choice."""
    return value == AUTO


def resolve(cfg: "Config", n_train: int, n_validation: int) -> tuple["Config", dict[str, Any]]:
    """`cfg` with its `"auto"` training keys made concrete for a run of `n_train` training and
    `n_validation` validation rows.

    Returns:
        (the concrete config, `{key: {"value": int, "rule": str}}` for each key chosen here;
        empty when the user set both).
    """
    t = cfg.training
    chosen: dict[str, Any] = {}
    changes: dict[str, int] = {}
    if is_auto(t.batch_size):
        changes["batch_size"] = batch_size_for(n_train)
        chosen["training.batch_size"] = {
            "value": changes["batch_size"],
            "rule": f"power of two nearest sqrt({n_train:,} training rows) in "
                    f"[{MIN_BATCH}, {MAX_BATCH}]"}
    if is_auto(t.epochs):
        batch = changes.get("batch_size", t.batch_size)
        changes["epochs"] = epochs_for(n_train, batch, n_validation)
        chosen["training.epochs"] = {
            "value": changes["epochs"],
            "rule": (f"at least {MIN_STEPS:,} steps of {math.ceil(max(1, n_train) / batch):,} "
                     f"per epoch, within [{MIN_EPOCHS}, {MAX_EPOCHS}]" if n_validation else
                     f"{MIN_EPOCHS}: no validation rows to stop early on")}
    if is_auto(t.early_stopping):
        changes["early_stopping"] = patience_for(changes.get("epochs", t.epochs), n_validation)
        chosen["training.early_stopping"] = {
            "value": changes["early_stopping"],
            "rule": (f"min({MAX_PATIENCE}, max({MIN_PATIENCE}, epochs // 5)) epochs on "
                     "validation loss, best "
                     "weights restored" if n_validation else "off: no validation rows")}
    if not changes:
        return cfg, chosen
    return dataclasses.replace(cfg, training=dataclasses.replace(t, **changes)), chosen


def describe(cfg: "Config", chosen: dict[str, Any]) -> str:
    """One line for the start of a run: epochs, batch size and early stopping, marking the values
    chosen automatically (`chosen` from `resolve`)."""
    t = cfg.training
    mark = {k.rpartition(".")[2]: " (auto)" for k in chosen}
    stop = (f"early stopping after {t.early_stopping} epochs without a better validation loss"
            f", best epoch kept{mark.get('early_stopping', '')}" if t.early_stopping
            else f"no early stopping{mark.get('early_stopping', '')}")
    n = cfg.members.count
    return (f"training {n} member{'s' * (n != 1)} for up to {t.epochs} "
            f"epoch{'s' * (t.epochs != 1)}{mark.get('epochs', '')}: batch size "
            f"{t.batch_size}{mark.get('batch_size', '')}, {stop}")
