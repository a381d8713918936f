"""`members.parquet`: one row per member of a run, its hyperparameters next to its cost and
its validation scores, and its weight in the greedy selection.

Built from the run's own files (manifest, `predictions.parquet`, `history.parquet`,
`aggregators.json`), so both replication modes and `ensemble aggregate` write the same table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from ensemble import artifacts, config, fitted, metrics, posthoc
from ensemble.placement import mlp_flops

MEMBERS_TABLE = "members.parquet"


def parameter_count(n_features: int, hidden: list[int], n_classes: int) -> int:
    """Trainable parameters of an MLP: `sum(w_in * w_out + w_out)` over its Dense layers."""
    widths = [n_features, *hidden, n_classes]
    return int(sum(a * b + b for a, b in zip(widths, widths[1:])))


def members_table(run_dir: str | Path, manifest: dict[str, Any]) -> pa.Table:
    """The members table of a run whose predictions, history and aggregators are written.

    Columns: `member`, `seed`, `hidden` (list of widths), `activation`, `dropout`,
    `learning_rate`, `l2`, `flops_per_row` (`placement.mlp_flops`), `parameters`, `device`,
    `train_seconds` (sum of its epochs' wall seconds; in-graph the members of the one graph
    share them), `val_nll`, `val_accuracy` (the trained member on the validation split),
    `weight` (its weight in the `greedy` selection, 0 when not selected; null when the run
    fits no `greedy`) and, in a stratified search run, `candidate` (the candidate whose
    hyperparameters it repeats with a new seed).
    """
    run_dir = Path(run_dir)
    preds = artifacts.read_parquet(run_dir / artifacts.PREDICTIONS)
    val = posthoc.by_split(posthoc.member_rows(preds)).get("validation")
    history = artifacts.read_parquet(run_dir / artifacts.HISTORY).to_pylist()
    fit = fitted.read(run_dir) or {}
    greedy = fit.get("params", {}).get("greedy")
    weights = dict(zip(fit.get("members", []), greedy["weights"])) if greedy else {}
    n_features = len(manifest["dataset"]["feature_names"])
    n_classes = len(manifest["dataset"]["classes"])
    source = (manifest.get("search") or {}).get("candidate")
    cfg = config.from_dict(manifest["config"])
    rows = []
    for m in manifest["members"]:
        i = m["index"]
        h = m.get("hparams") or config.member_hparams(cfg, i)  # older runs: from the config
        pos = val.members.index(i) if val is not None and i in val.members else None
        row = {"member": i, "seed": m["seed"], "hidden": h["hidden"],
               "activation": h["activation"], "dropout": h["dropout"],
               "learning_rate": h["learning_rate"], "l2": h.get("l2", 0.0),
               "flops_per_row": m.get("flops_per_row",
                                      mlp_flops(n_features, h["hidden"], n_classes)),
               "parameters": parameter_count(n_features, h["hidden"], n_classes),
               "device": m["device"],
               "train_seconds": sum(r["seconds"] for r in history if r["member"] == i),
               "val_nll": None if pos is None else metrics.nll(val.y, val.probs[pos]),
               "val_accuracy": None if pos is None else metrics.accuracy(val.y, val.probs[pos]),
               "weight": weights.get(i, 0.0) if greedy else None}
        if source is not None:
            row["candidate"] = source[i]
        rows.append(row)
    schema = [("member", pa.int32()), ("seed", pa.int64()), ("hidden", pa.list_(pa.int64())),
              ("activation", pa.string()), ("dropout", pa.float64()),
              ("learning_rate", pa.float64()), ("l2", pa.float64()),
              ("flops_per_row", pa.int64()), ("parameters", pa.int64()), ("device", pa.string()),
              ("train_seconds", pa.float64()), ("val_nll", pa.float64()),
              ("val_accuracy", pa.float64()), ("weight", pa.float64())]
    if source is not None:
        schema.append(("candidate", pa.int32()))
    return pa.Table.from_pylist(rows, schema=pa.schema(schema))


def write_members(run_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """Write the run's `members.parquet` (atomically). Returns its path."""
    path = Path(run_dir) / MEMBERS_TABLE
    artifacts.write_parquet(path, members_table(run_dir, manifest))
    return path
