"""`ensemble compare`: train and predict the same ensemble in both replication modes, several
times, measure each mode's cost (wall time, throughput, peak memory of all its processes,
start-up on the critical path) and the parity of their predictions (after training: the
members' test probabilities; after prediction: the prediction files), and say which mode is
better on this machine, or that neither is clearly better (with one repeat: that one sample
gives no spread). Parity is on when the config keeps it (`parity_setting`); the verdict says
when it is off or not met.

Every phase runs as its own `ensemble` process so that its memory is its own. Each phase of
each mode runs `repeats` times, the mode order alternating between repeats (in-graph first, then
between-graph first, ...), so that a warming machine favours neither mode.

Columns (also printed under the table):
- `wall_seconds`: the phase's whole process, spawn to exit (what a user waits).
- `startup_seconds`: time on the critical path before the first training (or prediction) step:
  the driver process's start-up (spawn until TensorFlow is loaded and arguments are read), data
  preparation, and for between-graph the start-up of the first client to begin work (clients
  start in parallel, so their start-ups are not summed).
- `work_seconds`: `wall_seconds - startup_seconds`: training or prediction, writing artifacts
  and (between-graph) aggregation.
- `member_rows_per_second`: rows times members (times the epochs each trained, when training)
  per wall second.
- `peak_rss_bytes`: the driver's peak resident memory plus, between-graph, the `jobs` largest
  client peaks (clients that can run at once; an upper bound).
- training only: `fixed_seconds`, `epoch_seconds` (marginal seconds of one more epoch) and
  `row_epoch_us` (an epoch's microseconds per training row): `compare_cost` (null with
  `--epochs 1`: no epoch past the first is measured).
- training only: the task's test metrics `test_<metric>` (nll and accuracy, nll and rmse).

The predict phase predicts the rows training used (`labelled_rows`). A phase that fails keeps
the phases that finished (`runs.parquet`) and says how to continue. The summary and the text:
`compare_report`; the chart: `compare_chart`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.core import artifacts
from ensemble.replication import devices
from ensemble.tasks import of_file, tables
from ensemble.config.schema import Config
from ensemble.replication.modes import Mode
from ensemble.runs import builtin_modes
from ensemble.core.errors import UsageError
from ensemble.core.notices import notice
from ensemble.data.settings import names_a_path
from ensemble.runs.between import checked, last_report, run_process
from ensemble.runs.prepare import check_data
from ensemble.core.manifest import Manifest
from ensemble.runs.context import config_of
from pipelines import compare_chart
from pipelines import compare_cost
from pipelines.compare_report import (  # noqa: F401 (the module's public names)
    DIGITS, MEASURES, PARITY_BOUND, PHASES, summarise, verdict)

CLI = "pipelines.cli"  # every phase runs as its own `ensemble` process
PREDICT_INPUT = "predict-input.parquet"  # the rows training used, when the file has others


def client_processes(per_member: dict) -> list[dict]:
    """One entry per client process from a `{member: measurements}` record
    (`timings.clients`, a prediction report's `clients`): a long-lived client trains or
    predicts several members, and its process figures (wall, start-up, peak) are its own."""
    return list({c.get("client", i): c for i, c in per_member.items()}.values())


def concurrent_peak(own: int, clients: list[dict], jobs: int) -> int:
    """Peak resident bytes of a mode: its driver process plus, for between-graph, the `jobs`
    largest client peaks (clients that can run at once; an upper bound); `clients` holds one
    entry per client process (`client_processes`)."""
    return own + sum(sorted((c["peak_rss_bytes"] for c in clients), reverse=True)[:jobs])


def _first_client_startup(clients: list[dict]) -> float:
    """Start-up of the first client to begin work (0 without clients): parallel clients'
    start-ups overlap, so only the shortest is on the critical path to the first step."""
    return min((c["startup_seconds"] for c in clients), default=0.0)


def test_metrics(run_dir: Path, manifest: Manifest) -> dict[str, float | None]:
    """`{"test_<metric>": value}` of a run's answer on the test split: the metrics its task
    names (`member_score_names` without `val_`: nll and accuracy, nll and rmse), of the
    ensemble row of its default aggregator (`tasks.choice.default_aggregator`) in
    `metrics.parquet`; None where the table lacks one."""
    from ensemble.runs.posthoc import run_aggregators
    from ensemble.tasks.choice import default_aggregator
    from ensemble.tasks.registry import for_run

    names = [n.removeprefix("val_") for n in for_run(manifest).member_score_names]
    answer = default_aggregator(*run_aggregators(run_dir, manifest))
    metrics = artifacts.read_parquet(run_dir / artifacts.METRICS).to_pylist()
    row = next((r for r in metrics if r["model"] == f"ensemble-{answer}"
                and r["split"] == "test"), {})
    return {f"test_{n}": row.get(n) for n in names}


def _train_row(mode: Mode, run_dir: Path, res: dict) -> dict:
    m = Manifest.load(run_dir)
    t = m.timings
    clients = client_processes(t.get("clients", {}))
    startup = (t["process_ready_unix"] - res["spawned_unix"] + t.get("prepare_seconds", 0.0)
               + _first_client_startup(clients))
    n_train = m.dataset.rows["train"]
    history = artifacts.read_parquet(run_dir / artifacts.HISTORY).to_pylist()
    rows = n_train * len(history)  # a record per member and epoch trained (early stopping)
    per_epoch, epochs = compare_cost.epoch_seconds(mode, history, t, n_train)
    return {"mode": mode.name, "phase": "train", "wall_seconds": res["seconds"],
            "startup_seconds": startup, "work_seconds": res["seconds"] - startup,
            "member_rows_per_second": rows / res["seconds"],
            "peak_rss_bytes": concurrent_peak(t["process_peak_rss_bytes"], clients, t.get("jobs", 1)),
            "processes": 1 + len(clients) + bool(clients),
            "devices": len(set(x.device for x in m.members)),
            "train_rows": n_train, "epochs": epochs,
            **compare_cost.split_cost(res["seconds"], per_epoch, epochs, n_train),
            **test_metrics(run_dir, m)}


def _predict_row(mode: str, res: dict, n_members: int, n_devices: int) -> dict:
    report = last_report(res)
    clients = client_processes(report.get("clients") or {})
    startup = report["ready_unix"] - res["spawned_unix"] + _first_client_startup(clients)
    return {"mode": mode, "phase": "predict", "wall_seconds": res["seconds"],
            "startup_seconds": startup, "work_seconds": res["seconds"] - startup,
            "member_rows_per_second": n_members * report["rows"] / res["seconds"],
            "peak_rss_bytes": concurrent_peak(report["peak_rss_bytes"], clients, report.get("jobs") or 1),
            "processes": 1 + len(clients), "devices": n_devices, "train_rows": None,
            "epochs": None, **dict.fromkeys(compare_cost.COST_MEASURES)}


def parity_setting(cfg: Config) -> str:
    """`"on"` when `cfg` makes the two modes' members equal (op determinism, and the same
    threads per op in every process: `training.intra_op_threads` > 0), else `"off: "` and
    the settings that trade it away."""
    off = [reason for bad, reason in (
        (not cfg.training.deterministic, "training.deterministic = false"),
        (not cfg.training.intra_op_threads,
         "training.intra_op_threads = 0 (each process runs an op on TensorFlow's default "
         "threads, so convolutions sum in another order)")) if bad]
    return "off: " + "; ".join(off) if off else "on"


def members_test(table: pa.Table) -> pa.Table:
    """The member rows of the test split of a run's `predictions.parquet`, in (member, row)
    order: what parity compares after training."""
    keep = pc.and_(pc.is_valid(table.column("member")), pc.equal(table.column("split"), "test"))
    return table.filter(keep).sort_by([("member", "ascending"), ("row", "ascending")])


def parity(a: pa.Table, b: pa.Table) -> tuple[float, float]:
    """(max abs probability difference, share of identical predicted labels) of two
    predictions tables with the same rows (regression: the members' mean and variance,
    `Task.outputs_of`, and the share of predicted means equal within 1e-5 relative:
    float32 sums in another order differ in the last digits)."""
    classes = tables.classes_from(a)
    task = of_file(a.schema.metadata)
    diff = np.abs(task.outputs_of(a, classes) - task.outputs_of(b, classes)).max()
    ya, yb = a.column("y_pred"), b.column("y_pred")
    if pa.types.is_floating(ya.type):  # predicted numbers: equal to float32 precision
        same = np.isclose(ya.to_numpy(), yb.to_numpy(), rtol=1e-5, atol=0.0)
    else:  # predicted labels
        same = pc.equal(ya, yb).to_numpy(zero_copy_only=False)
    return float(diff), float(same.mean())


def check_folder(base: Path, overwrite: bool, names: Sequence[str] = builtin_modes.names()
                 ) -> None:
    """Refuse a comparison folder that already holds something, unless `overwrite`.

    Raises:
        UsageError: `base` is a file, or a non-empty folder without `overwrite`.
    """
    if base.exists() and not base.is_dir():
        raise UsageError(f"Comparison folder {base} is a file; expected a folder.")
    if base.is_dir() and any(base.iterdir()):
        if not overwrite:
            raise UsageError(f"Comparison folder {base} already exists; pass --overwrite to "
                             "replace it or choose another --run-dir.")
        for mode in names:  # the compared modes' run folders
            shutil.rmtree(base / mode, ignore_errors=True)
        (base / PREDICT_INPUT).unlink(missing_ok=True)  # written again when needed


def compare(cfg: Config, base: Path, repeats: int = 3, overwrite: bool = False,
            cluster_file: str | None = None, modes: Sequence[Mode | str] = builtin_modes.names()
            ) -> tuple[pa.Table, pa.Table]:
    """Run both modes `repeats` times (train, then predict on the config's data source; mode
    order alternated between repeats) and write `base/runs.parquet` (one row per mode, phase and
    repeat), `base/comparison.parquet` (the summary: median, min and max per mode and phase,
    rounded as printed) and `base/comparison.png`. With `cluster_file`, both modes run on that
    TensorFlow cluster. `modes`: the modes compared (mode objects, names or specs,
    `ensemble.runs.builtin_modes.get`), in-graph and between-graph by default; each phase runs
    in a process of its own, which finds the mode by its `Mode.spec`.

    Returns:
        (summary table, runs table).

    Raises:
        UsageError: an existing folder without `overwrite`, bad data, or a phase that failed on
        bad input.
    """
    strategies = [builtin_modes.get(m) for m in modes]
    check_folder(base, overwrite, [m.name for m in strategies])
    check_data(cfg)  # every data problem now, before any process starts
    if isinstance(cfg.training.epochs, int) and cfg.training.epochs < 2:
        notice("--epochs 1: compare measures no per-epoch train cost (n/a) and no crossover "
               "epoch count; --epochs 2 or more measures them")
    table = cfg.to_dict()
    source = Path(cfg.data.source)
    if names_a_path(cfg.data.source):  # the config is written elsewhere: absolute path
        table["data"]["source"] = str(source.resolve())
    base.mkdir(parents=True, exist_ok=True)
    cfg_file = base / "config.toml"
    artifacts.write_text(cfg_file, _to_toml(table))
    predict_source = labelled_rows(table["data"]["source"], cfg.data.target, base)
    on = ["--cluster", str(cluster_file)] if cluster_file else []
    runs, preds = [], {}
    for repeat in range(repeats):
        for position, mode in enumerate(mode_order(repeat, strategies)):
            run_dir = base / mode.name
            out = base / f"{mode.name}.predictions.parquet"
            with _keeping(runs, base, [m.name for m in strategies], predict_source):
                res = checked(run_process(["train", "--config", str(cfg_file), "--mode",
                                           mode.spec(), "--run-dir", str(run_dir),
                                           "--overwrite", *on],
                                          module=CLI), f"{mode.name} training")
                runs.append(_train_row(mode, run_dir, res) | {"repeat": repeat,
                                                              "position": position})
                res = checked(run_process(["predict", "--run", str(run_dir), "--data",
                                          predict_source, "--mode", mode.spec(), "--out",
                                          str(out), *on, *_predict_devices(mode, cfg, on)],
                                          module=CLI), f"{mode.name} prediction")
                runs.append(_predict_row(mode.name, res, cfg.members.count, runs[-1]["devices"])
                            | {"repeat": repeat, "position": position})
            preds[mode.name] = (artifacts.read_parquet(run_dir / artifacts.PREDICTIONS),
                           artifacts.read_parquet(out))
    parities = {ph: worst_parity([members_test(p[k]) if ph == "train" else p[k]
                                  for p in preds.values()]) for k, ph in enumerate(PHASES)}
    summary = summarise(runs, parities, parity_setting(cfg))
    runs_table = _runs_table(runs)
    context = _context(cfg, base / strategies[0].name, repeats)
    summary_table = pa.Table.from_pylist(summary).replace_schema_metadata(
        {b"context": json.dumps(context).encode()})
    artifacts.write_parquet(base / "runs.parquet", runs_table)
    artifacts.write_parquet(base / "comparison.parquet", summary_table)
    compare_chart.chart(summary, context, base / "comparison.png")
    return summary_table, runs_table


def _context(cfg: Config, first_run: Path, repeats: int) -> dict:
    """What a comparison in `base` ran (the chart's title, `comparison.parquet`'s metadata):
    data, members, epochs (`"auto"` as the runs resolved it for their training rows),
    devices, cores, repeats."""
    epochs = cfg.training.epochs
    if not isinstance(epochs, int):
        epochs = config_of(Manifest.load(first_run)).training.epochs
    return {"data": Path(cfg.data.source).name, "members": cfg.members.count,
            "epochs": epochs, "devices": cfg.placement.devices,
            "cores": devices.cpu_count(), "repeats": repeats}


def labelled_rows(source: str, target: str, base: Path) -> str:
    """The input of compare's predict phase: the rows training uses. Training drops the rows
    of a table whose label is missing (and predict refuses missing feature values, which such
    rows may hold), so when `source` (a `.csv` or `.parquet` file) has rows without a label,
    the labelled ones are written to `base/predict-input.parquet` (one notice) and that file
    is returned; otherwise `source` itself (built-in sets, arrays, image folders too).

    Raises:
        UsageError: the file cannot be read.
    """
    path = Path(source)
    from ensemble.data import csv_format

    if csv_format.table_format(path) is None or not path.is_file():
        return source
    import pyarrow.parquet as pq

    try:  # read as training reads it (ensemble.data.sources)
        if csv_format.table_format(path) == "parquet":
            names = pq.read_schema(path).names
            if target not in names:
                return source
            data = pq.read_table(path)
        else:
            data = csv_format.read_csv(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UsageError(f"Cannot read {source}: {str(exc).splitlines()[0]}") from None
    if target not in data.column_names or not data.column(target).null_count:
        return source
    kept = data.filter(pc.is_valid(data.column(target)))
    out = base / PREDICT_INPUT
    artifacts.write_parquet(out, kept)
    notice(f"compare predicts the {kept.num_rows:,} rows of {source} that training uses "
           f"({data.num_rows - kept.num_rows:,} without a label {target!r} left out): {out}")
    return str(out)


def _runs_table(runs: list[dict]) -> pa.Table:
    """The runs rows as one table, every row with every column (null where a phase has none)."""
    keys = list(dict.fromkeys(k for r in runs for k in r))
    return pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in runs])


@contextlib.contextmanager
def _keeping(runs: list[dict], base: Path, names: Sequence[str], predict_source: str):
    """A failed phase keeps what finished: the runs measured so far are written to
    `base/runs.parquet` and the error says so and how to continue."""
    try:
        yield
    except (UsageError, RuntimeError) as exc:
        kept = [str(base / m) for m in names if (base / m / artifacts.MANIFEST).is_file()]
        if runs:
            artifacts.write_parquet(base / "runs.parquet", _runs_table(runs))
        text = (f"{exc} Kept: {len(runs)} finished phase{'s' * (len(runs) != 1)} in "
                f"{base / 'runs.parquet'}" if runs else f"{exc} Kept: no finished phase")
        if kept:
            text += (f"; the trained runs {', '.join(kept)} (predict with one: ensemble predict"
                     f" --run {kept[0]} --data {predict_source} --out FILE)")
        text += (". To continue: fix the cause, then run the same `ensemble compare` with "
                 "--overwrite (it measures every phase again).")
        raise type(exc)(text) from None


def mode_order(repeat: int, modes: Sequence = builtin_modes.names()) -> tuple:
    """The order `modes` (the built-in modes' names by default) run in at `repeat`
    (0-based): as given (in-graph first) on even repeats, reversed on odd ones, so no
    mode always meets a warm or a cold machine."""
    names = tuple(modes)
    return names if repeat % 2 == 0 else names[::-1]


def _predict_devices(mode: Mode, cfg: Config, cluster_args: list[str]) -> list[str]:
    """`--devices` of a mode's predict phase: the config's devices, unless on a cluster or the
    mode refuses the option (its clients predict on the members' devices)."""
    if cluster_args or mode.refusal("predict", ["devices"]):
        return []
    return ["--devices", cfg.placement.devices]


def worst_parity(tables_: list[pa.Table]) -> tuple[float, float]:
    """`parity` of every mode's table against the first mode's (in-graph): the largest
    difference and the smallest share of identical labels."""
    pairs = [parity(tables_[0], t) for t in tables_[1:]] or [(0.0, 1.0)]
    return max(p[0] for p in pairs), min(p[1] for p in pairs)


def _to_toml(d: dict, prefix: str = "") -> str:
    """Minimal TOML writer for a resolved config (tables of scalars and lists)."""
    scalars = [f"{k} = {json.dumps(v)}" for k, v in d.items() if not isinstance(v, dict)]
    text = (f"[{prefix}]\n" if prefix and scalars else "") + "".join(s + "\n" for s in scalars)
    for k, v in d.items():
        if isinstance(v, dict):
            text += _to_toml(v, f"{prefix}.{k}" if prefix else k)
    return text
