"""`members.parquet`: one row per member of a run, its hyperparameters next to its cost and
its validation scores, and its weight in the greedy selection.

Built from the run's context (`RunContext`: manifest, config, task) and its validation
predictions, history and fitted aggregators (held by the writer that computed them, else read
from `predictions.parquet`, `history.parquet` and `aggregators.json`), so both replication
modes, `ensemble aggregate` and `ensemble search` write the same table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from ensemble.core import artifacts
from ensemble.core.manifest import MemberRecord
from ensemble.config.schema import member_hparams
from ensemble.tasks.classification import fitted
from ensemble.runs import posthoc
from ensemble.models.cost import mlp_flops

if TYPE_CHECKING:
    from ensemble.runs.context import RunContext

MEMBERS_TABLE = "members.parquet"


def parameter_count(n_features: int, hidden: list[int], n_classes: int) -> int:
    """Trainable parameters of an MLP: `sum(w_in * w_out + w_out)` over its Dense layers."""
    widths = [n_features, *hidden, n_classes]
    return int(sum(a * b + b for a, b in zip(widths, widths[1:])))


def _of(value, kind):
    """`value` when it fits the column (`list` of ints, `str`, `float`), else None: other
    builders' parameters of the same names may be anything."""
    if kind is list:
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(w, int) and not isinstance(w, bool) for w in value)
        return list(value) if ok else None
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else None
    return value if isinstance(value, kind) else None


def _hparams(entry: MemberRecord, cfg) -> dict:
    """A member's `{"builder", "params", "learning_rate"}`: its manifest entry's, or for
    runs from before builders (flat MLP keys), or without any, from the config."""
    h = entry.hparams or member_hparams(cfg, entry.index)
    if "builder" not in h:
        h = {"builder": "mlp", "learning_rate": h["learning_rate"],
             "params": {k: v for k, v in h.items() if k != "learning_rate"}}
    return h


def table(ctx: RunContext, val: "posthoc.SplitMembers | None" = None,
          history: list[dict] | None = None, fit: dict | None = None) -> pa.Table:
    """The members table of a run whose predictions, history and aggregators are written.

    Columns: `member`, `seed`, `builder`, `params` (the builder's parameters as JSON),
    `hidden` (list of widths), `activation`, `dropout`, `l2` (the MLP's; null for other
    builders that do not take them), `learning_rate`, `flops_per_row` (`cost.member_flops`),
    `parameters` (trainable, the MLP's by formula; null for other builders), `device`,
    `train_seconds` (sum of its epochs' wall seconds; in-graph the members of the one graph
    share them), the task's member scores on the validation split (`Task.member_scores`:
    `val_nll`, `val_accuracy` for classification; `val_nll` (Gaussian), `val_rmse` for
    regression),
    `weight` (its weight in the `greedy` selection, 0 when not selected; null when the run
    fits no `greedy`), `status` (the manifest's: `completed`, `diverged`, ...),
    `diverged_epoch` (the epoch from 0 in which a diverged member's loss or outputs turned
    non-finite; null otherwise; such a member has no validation metrics) and, in a
    stratified search run, `candidate` (the candidate whose
    hyperparameters it repeats with a new seed).

    `val`: the members' validation predictions when the caller holds them (the same as the
    member rows of `predictions.parquet`'s validation split), `history` the records of
    `history.parquet` and `fit` the content of `aggregators.json` when the caller wrote them:
    what the caller holds is not read back.
    """
    run_dir, manifest = ctx.path, ctx.manifest
    if val is None:
        preds = artifacts.read_parquet(run_dir / artifacts.PREDICTIONS)
        val = posthoc.by_split(posthoc.member_rows(preds), ctx.task).get(
            "validation")
    if history is None:
        history = artifacts.read_parquet(run_dir / artifacts.HISTORY).to_pylist()
    fit = (fitted.read(run_dir) if fit is None else fit) or {}
    task, cfg = ctx.task, ctx.config
    greedy = task.selected(fit)
    weights = dict(zip(fit.get("members", []), greedy["weights"])) if greedy else {}
    source = (manifest.search or {}).get("candidate")
    rows = []
    for m in manifest.members:
        i = m.index
        pos = val.members.index(i) if val is not None and i in val.members else None
        row = {"member": i, "seed": m.seed, **_hparam_columns(m, cfg, manifest, task),
               "device": m.device,
               "train_seconds": sum(r["seconds"] for r in history if r["member"] == i),
               **(dict.fromkeys(task.member_score_names) if pos is None
                  else task.member_scores(val.y, val.probs[pos])),
               "weight": weights.get(i, 0.0) if greedy else None,
               "status": m.status, "diverged_epoch": m.diverged_epoch}
        if source is not None:
            row["candidate"] = source[i]
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=_schema(task, source is not None))


def _hparam_columns(m, cfg, manifest, task) -> dict:
    """Member `m`'s hyperparameter and size columns of `table` (`builder` to
    `parameters`)."""
    n_features = len(manifest.dataset.feature_names)
    n_out = task.n_outputs(len(manifest.dataset.classes))
    h = _hparams(m, cfg)
    p, mlp = h["params"], h["builder"] == "mlp"
    hidden = _of(p.get("hidden", () if mlp else None), list)
    return {"builder": h["builder"], "params": json.dumps(p, sort_keys=True), "hidden": hidden,
            "activation": _of(p.get("activation"), str),
            "dropout": _of(p.get("dropout"), float),
            "learning_rate": h["learning_rate"],
            "l2": _of(p.get("l2", 0.0 if mlp else None), float),
            "flops_per_row": m.flops_per_row if m.flops_per_row is not None
            else mlp_flops(n_features, hidden, n_out) if mlp else None,
            "parameters": parameter_count(n_features, hidden, n_out) if mlp else None}


def _schema(task, search: bool) -> pa.Schema:
    """The members table's columns (`table`); `search`: with `candidate`."""
    schema = [("member", pa.int32()), ("seed", pa.int64()), ("builder", pa.string()),
              ("params", pa.string()), ("hidden", pa.list_(pa.int64())),
              ("activation", pa.string()), ("dropout", pa.float64()),
              ("learning_rate", pa.float64()), ("l2", pa.float64()),
              ("flops_per_row", pa.int64()), ("parameters", pa.int64()), ("device", pa.string()),
              ("train_seconds", pa.float64()),
              *((name, pa.float64()) for name in task.member_score_names),
              ("weight", pa.float64()), ("status", pa.string()), ("diverged_epoch", pa.int32())]
    if search:
        schema.append(("candidate", pa.int32()))
    return pa.schema(schema)


def write(ctx: RunContext, val: "posthoc.SplitMembers | None" = None,
          history: list[dict] | None = None, fit: dict | None = None) -> Path:
    """Write the run's `members.parquet` (atomically; `val`, `history` and `fit` as in
    `table`). Returns its path."""
    path = ctx.path / MEMBERS_TABLE
    artifacts.write_parquet(path, table(ctx, val, history, fit))
    return path
