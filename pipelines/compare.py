"""`ensemble compare`: train and predict the same ensemble in both replication modes, measure
each mode's cost (wall time, throughput, peak memory of all its processes, process start-up)
and the parity of their predictions, and say which mode is better on this machine.

Every phase runs as its own `ensemble` process so that its memory is its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble import artifacts, config, tables
from pipelines.between import checked, last_report, run_process

MODES = ("in-graph", "between-graph")


def concurrent_peak(own: int, clients: list[dict], jobs: int) -> int:
    """Peak resident bytes of a mode: its driver process plus, for between-graph, the `jobs`
    largest client peaks (clients that can run at once; an upper bound)."""
    return own + sum(sorted((c["peak_rss_bytes"] for c in clients), reverse=True)[:jobs])


def _train_row(mode: str, run_dir: Path, res: dict) -> dict:
    m = artifacts.read_manifest(run_dir)
    t, cfg = m["timings"], m["config"]
    clients = list(t.get("clients", {}).values())
    startup = t["process_ready_unix"] - res["spawned_unix"]
    startup += sum(c["startup_seconds"] for c in clients)
    rows = m["dataset"]["rows"]["train"] * cfg["training"]["epochs"] * cfg["members"]["count"]
    metrics = artifacts.read_parquet(run_dir / artifacts.METRICS).to_pylist()
    ens = next(r for r in metrics if r["model"] == "ensemble-mean" and r["split"] == "test")
    return {"mode": mode, "phase": "train", "wall_seconds": res["seconds"],
            "member_rows_per_second": rows / res["seconds"],
            "peak_rss_bytes": concurrent_peak(t["process_peak_rss_bytes"], clients, t.get("jobs", 1)),
            "startup_seconds": startup, "processes": 1 + len(clients) + bool(clients),
            "devices": len(set(x["device"] for x in m["members"])),
            **{f"test_{k}": ens[k] for k in ("accuracy", "nll", "brier", "ece")}}


def _predict_row(mode: str, res: dict, n_members: int, n_devices: int) -> dict:
    report = last_report(res)
    clients = list((report.get("clients") or {}).values())
    startup = report["ready_unix"] - res["spawned_unix"]
    startup += sum(c["startup_seconds"] for c in clients)
    return {"mode": mode, "phase": "predict", "wall_seconds": res["seconds"],
            "member_rows_per_second": n_members * report["rows"] / res["seconds"],
            "peak_rss_bytes": concurrent_peak(report["peak_rss_bytes"], clients, report.get("jobs") or 1),
            "startup_seconds": startup, "processes": 1 + len(clients),
            "devices": n_devices}


def parity(a: pa.Table, b: pa.Table) -> tuple[float, float]:
    """(max abs probability difference, share of identical predicted labels) of two
    predictions tables with the same rows."""
    classes = tables.classes_from(a)
    diff = np.abs(tables.probabilities(a, classes) - tables.probabilities(b, classes)).max()
    same = pc.equal(a.column("y_pred"), b.column("y_pred")).to_numpy(zero_copy_only=False)
    return float(diff), float(same.mean())


def compare(config_path: str | None, base: Path, overrides: dict | None = None,
            cluster_file: str | None = None) -> pa.Table:
    """Run both modes (train, then predict on the config's data source) and write
    `base/comparison.parquet` (one row per mode and phase) and `base/comparison.png`.
    With `cluster_file`, both modes run on that TensorFlow cluster.

    Returns:
        The comparison table.
    """
    cfg = config.load(config_path, overrides)
    base.mkdir(parents=True, exist_ok=True)
    cfg_file = base / "config.toml"
    artifacts.write_text(cfg_file, _to_toml(cfg.to_dict()))
    rows, preds = [], {}
    on = ["--cluster", str(cluster_file)] if cluster_file else []
    for mode in MODES:
        run_dir = base / mode
        res = checked(run_process(["train", "--config", str(cfg_file), "--mode", mode,
                                  "--run-dir", str(run_dir), "--overwrite", *on]),
                     f"{mode} training")
        rows.append(_train_row(mode, run_dir, res))
        out = base / f"{mode}.predictions.parquet"
        res = checked(run_process(["predict", "--run", str(run_dir), "--data", cfg.data.source,
                                  "--mode", mode, "--out", str(out), *on,
                                  *([] if on else ["--devices", cfg.placement.devices])]),
                     f"{mode} prediction")
        rows.append(_predict_row(mode, res, cfg.members.count, rows[-1]["devices"]))
        preds[mode] = (artifacts.read_parquet(run_dir / artifacts.PREDICTIONS),
                       artifacts.read_parquet(out))
    (diff_t, same_t), (diff_p, same_p) = (parity(preds[MODES[0]][k], preds[MODES[1]][k])
                                          for k in (0, 1))
    for r in rows:
        r["parity_max_abs_diff"] = diff_t if r["phase"] == "train" else diff_p
        r["parity_same_labels"] = same_t if r["phase"] == "train" else same_p
    table = pa.Table.from_pylist(rows)
    artifacts.write_parquet(base / "comparison.parquet", table)
    _chart(rows, base / "comparison.png")
    return table


def _to_toml(d: dict, prefix: str = "") -> str:
    """Minimal TOML writer for a resolved config (tables of scalars and lists)."""
    scalars = [f"{k} = {json.dumps(v)}" for k, v in d.items() if not isinstance(v, dict)]
    text = (f"[{prefix}]\n" if prefix and scalars else "") + "".join(s + "\n" for s in scalars)
    for k, v in d.items():
        if isinstance(v, dict):
            text += _to_toml(v, f"{prefix}.{k}" if prefix else k)
    return text


def _chart(rows: list[dict], path: Path) -> None:
    """Bar charts of wall time and peak memory per mode and phase (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install '.[bench]'): no chart written")
        return
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    labels = [f"{r['mode']}\n{r['phase']}" for r in rows]
    colors = ["tab:blue" if r["mode"] == MODES[0] else "tab:orange" for r in rows]
    axes[0].bar(labels, [r["wall_seconds"] for r in rows], color=colors)
    axes[0].set_ylabel("wall seconds")
    axes[1].bar(labels, [r["peak_rss_bytes"] / 2**20 for r in rows], color=colors)
    axes[1].set_ylabel("peak resident memory (MiB)")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle("ensemble compare: in-graph vs between-graph replication")
    fig.tight_layout()
    with artifacts.atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)


def verdict(table: pa.Table) -> str:
    """The printed summary: one line per mode and phase, then the faster mode per phase."""
    lines = [f"{'mode':<15}{'phase':<9}{'wall s':>9}{'rows/s':>12}{'peak MiB':>10}"
             f"{'start-up s':>12}{'test acc':>10}"]
    rows = table.to_pylist()
    for r in rows:
        acc = r.get("test_accuracy")
        lines.append(f"{r['mode']:<15}{r['phase']:<9}{r['wall_seconds']:>9.2f}"
                     f"{r['member_rows_per_second']:>12.0f}{r['peak_rss_bytes'] / 2**20:>10.0f}"
                     f"{r['startup_seconds']:>12.2f}"
                     f"{'' if acc is None or acc != acc else f'{acc:.4f}':>10}")
    for phase in ("train", "predict"):
        a, b = (next(r for r in rows if r["mode"] == m and r["phase"] == phase) for m in MODES)
        fast, slow = (a, b) if a["wall_seconds"] <= b["wall_seconds"] else (b, a)
        lines.append(f"{phase}: {fast['mode']} is {slow['wall_seconds'] / fast['wall_seconds']:.2f}x "
                     f"faster; parity max |dp| = {a['parity_max_abs_diff']:.2e}, "
                     f"identical labels {a['parity_same_labels']:.1%}")
    return "\n".join(lines)
