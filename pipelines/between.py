"""Between-graph pipelines: the launcher, the aggregator run and between-graph prediction.

The launcher prepares the run directory once (data split, preprocessing, placement), then runs
one `ensemble client` process per member through a joblib pool, each with its own TensorFlow
runtime, its own device and a share of the cores, and finally the aggregator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ensemble import artifacts, devices, run, tables
from ensemble.between_graph import aggregate_files, local_device
from ensemble.config import Config
from ensemble.errors import UsageError
from ensemble.placement import place


def default_jobs(n_members: int, devs: list[str]) -> int:
    """As many concurrent clients as members, devices (GPUs) or cores allow."""
    n_gpus = sum("GPU" in d for d in set(devs))
    return max(1, min(n_members, n_gpus or devices.cpu_count()))


def run_process(argv: list[str], env: dict | None = None,
                module: str = "pipelines.cli") -> dict:
    """Run `python -m MODULE ARGV...` (default: the `ensemble` CLI) and measure it.

    The process writes its machine-readable report (peak memory, work time) to the file named
    by `$ENSEMBLE_REPORT`, which this sets to a fresh temporary file, so the user's stdout
    never carries it.

    Returns:
        `{"returncode", "seconds" (wall), "spawned_unix" (time.time() at spawn), "stdout",
        "stderr", "report" (the process's JSON report, or None)}`.
    """
    fd, report_path = tempfile.mkstemp(prefix="ensemble-report-", suffix=".json")
    os.close(fd)
    env = dict(os.environ if env is None else env, ENSEMBLE_REPORT=report_path)
    try:
        start, spawned = time.perf_counter(), time.time()
        proc = subprocess.run([sys.executable, "-m", module, *argv], env=env,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        text = Path(report_path).read_text()
    finally:
        os.unlink(report_path)
    return {"returncode": proc.returncode, "seconds": seconds, "spawned_unix": spawned,
            "stdout": proc.stdout, "stderr": proc.stderr,
            "report": json.loads(text) if text.strip() else None}


def last_report(res: dict) -> dict:
    """The JSON report of a measured process: its `$ENSEMBLE_REPORT` file, or (for workers
    that print it) its last stdout line."""
    if res.get("report") is not None:
        return res["report"]
    return json.loads(res["stdout"].strip().splitlines()[-1])


def checked(res: dict, what: str) -> dict:
    """`res` of `run_process`, or raise naming `what` and the process's last error line:
    UsageError for exit status 2 (bad input), RuntimeError otherwise."""
    if res["returncode"] != 0:
        last = (res["stderr"].strip().splitlines() or ["(no output)"])[-1]
        err = UsageError if res["returncode"] == 2 else RuntimeError
        raise err(f"{what} failed (exit {res['returncode']}): {last}")
    return res


def run_clients(run_dir: Path, commands: dict[int, list[str]], devs: dict[int, str],
                jobs: int, on_exit=None) -> dict[int, dict]:
    """Run one client process per member, `jobs` at a time (joblib thread pool of launchers).
    A failed client does not stop the others: every client runs, then failures are raised.

    Args:
        commands: member index -> `ensemble` CLI arguments of its client.
        devs: member index -> the member's device in the run.
        on_exit: optional callback `on_exit(index, ok)` when a client ends.

    Returns:
        member index -> `{"seconds": process wall time, "work_seconds": the client's own
        training/prediction time, "startup_seconds": the difference, "peak_rss_bytes"}`.

    Raises:
        UsageError / RuntimeError: a client failed (bad input / internal); names every failed
        member and its last error line.
    """
    from joblib import Parallel, delayed

    threads = max(1, devices.cpu_count() // jobs)

    def launch(index: int) -> tuple[int, dict]:
        env = dict(os.environ, **local_device(devs[index])[0])
        res = run_process([*commands[index], "--threads", str(threads)], env)
        if on_exit is not None:
            on_exit(index, res["returncode"] == 0)
        if res["returncode"] != 0:
            last = (res["stderr"].strip().splitlines() or ["(no output)"])[-1]
            return index, {"returncode": res["returncode"], "error": last}
        report = last_report(res)
        return index, {"seconds": res["seconds"], "work_seconds": report["work_seconds"],
                       "startup_seconds": res["seconds"] - report["work_seconds"],
                       "peak_rss_bytes": report["peak_rss_bytes"]}

    results = dict(Parallel(n_jobs=jobs, prefer="threads")(delayed(launch)(i) for i in commands))
    failed = {i: r for i, r in results.items() if "error" in r}
    if failed:
        text = "; ".join(f"client of member {i} failed (exit {r['returncode']}): {r['error']}"
                         for i, r in sorted(failed.items()))
        usage = all(r["returncode"] == 2 for r in failed.values())
        raise (UsageError if usage else RuntimeError)(text)
    return results


def aggregate_run(run_dir: Path, min_members: int | None = None) -> dict:
    """`ensemble aggregate`: combine the member prediction files of a run into the run's
    predictions, metrics and history, then mark the run completed.

    Args:
        min_members: aggregate a partial ensemble when at least this many members have
            predictions; the manifest and the predictions' metadata record which were used.

    Raises:
        UsageError: not a run, a damaged member file, or members missing (names them).
    """
    start = time.perf_counter()
    manifest = artifacts.read_manifest(run_dir)
    indices = [m["index"] for m in manifest["members"]]
    have = [i for i in indices if artifacts.member_predictions_path(run_dir, i).is_file()
            and manifest["members"][i].get("status") != "failed"]
    missing = sorted(set(indices) - set(have))
    if missing and (min_members is None or len(have) < min_members):
        need = f"at least {min_members}" if min_members else "all"
        raise UsageError(
            f"Members {missing} have no predictions ("
            f"{artifacts.member_predictions_path(run_dir, missing[0])} missing or failed); "
            f"the aggregator needs {need} of {len(indices)} members. Run their clients "
            "(`ensemble client --run RUN --member I`) or pass --min-members K.")
    for i in have:
        for path in run.member_files(run_dir, i)[1:]:
            artifacts.verify(run_dir, manifest, path)
    preds = aggregate_files([artifacts.member_predictions_path(run_dir, i) for i in have],
                            manifest["config"]["aggregation"]["aggregators"])
    preds = preds.replace_schema_metadata({**preds.schema.metadata,
                                           b"members": json.dumps(have).encode()})
    history = [r for i in have
               for r in artifacts.read_parquet(artifacts.member_history_path(run_dir, i))
               .to_pylist()]
    tables.write_outputs(run_dir, preds, tables.history_table(history))
    for i in have:
        manifest["members"][i]["status"] = "completed"
    manifest["aggregated_members"] = have
    run.finish(run_dir, manifest, "completed", aggregate_seconds=time.perf_counter() - start)
    return manifest


def train_between_graph(cfg: Config, run_dir: Path, jobs: int | None = None,
                        overwrite: bool = False, prepare_only: bool = False,
                        resume: bool = False, cluster: dict | None = None) -> dict:
    """Prepare the run, train every member in its own client process, then aggregate.

    Args:
        prepare_only: stop after preparing the run directory, so that a scheduler can launch
            `ensemble client --run RUN --member I` for each member and then `ensemble aggregate`.
        resume: continue an interrupted or failed run: only members not completed run, each
            from its own newest checkpoint.
        cluster: a cluster spec: members go round robin over its tasks' devices; each client
            connects to the cluster and runs its member on its task.

    Returns:
        The final manifest.

    Raises:
        RuntimeError / UsageError: a client failed; the members that finished are kept and
        recorded as completed, the failed ones as failed.
    """
    if resume:
        cluster = cluster or artifacts.read_manifest(run_dir).get("cluster")
    devs = devices.resolve(cfg.placement.devices, cfg.members.count, cluster)
    if resume:
        manifest = run.reopen(run_dir, cfg, "between-graph")
    else:
        manifest = run.prepare(cfg, run_dir, "between-graph", devs, overwrite, cluster)
    if prepare_only:
        return manifest
    todo = {m["index"]: m["device"] for m in manifest["members"]
            if m["status"] != "completed"
            or not all(p.is_file() for p in run.member_files(run_dir, m["index"]))}
    jobs = jobs or default_jobs(max(1, len(todo)), devs)
    lock = threading.Lock()

    def record(index: int, ok: bool) -> None:
        with lock:
            entry = manifest["members"][index]
            entry["status"] = "completed" if ok else "failed"
            if ok:
                entry["sha256"] = {os.path.relpath(p, run_dir): artifacts.sha256_file(p)
                                   for p in run.member_files(run_dir, index)}
            artifacts.write_manifest(run_dir, manifest)

    start = time.perf_counter()
    try:
        commands = {i: ["client", "--run", str(run_dir), "--member", str(i)] for i in todo}
        clients = run_clients(run_dir, commands, todo, jobs, record)
    except BaseException:
        manifest["status"] = "failed"
        artifacts.write_manifest(run_dir, manifest)
        raise
    manifest["timings"].update(train_seconds=time.perf_counter() - start, jobs=jobs,
                               clients={str(i): c for i, c in clients.items()})
    artifacts.write_manifest(run_dir, manifest)
    res = checked(run_process(["aggregate", "--run", str(run_dir)]), "aggregator")
    manifest = artifacts.read_manifest(run_dir)
    manifest["timings"]["aggregator_peak_rss_bytes"] = last_report(res)["peak_rss_bytes"]
    artifacts.write_manifest(run_dir, manifest)
    return manifest


def predict_between_graph(run_dir: Path, source: str, out: Path, target: str | None = None,
                          jobs: int | None = None, cluster_file: str | None = None,
                          strict_columns: bool = False):
    """One client process per member predicts `source`, then the aggregator combines them.
    With `cluster_file`, members go round robin over that cluster's devices instead of the
    devices they were trained on.

    Returns:
        (the predictions table, also written to `out` with split `predict`;
        `{"jobs": N, "clients": run_clients' measurements}`).
    """
    from pipelines.predict import check_out, load_input

    check_out(out)
    manifest, _, x, y = load_input(run_dir, source, target, strict_columns)
    member_devs = {m["index"]: m["device"] for m in manifest["members"]}
    extra = []
    if cluster_file is not None:
        from ensemble.cluster import load_spec

        devs = devices.resolve("auto", len(member_devs), load_spec(cluster_file))
        member_devs = dict(enumerate(place(len(member_devs), devs)))
        extra = ["--cluster", str(cluster_file)]
    with tempfile.TemporaryDirectory(prefix="ensemble-predict-") as tmp:
        x_path = Path(tmp) / "input.npz"
        np.savez(x_path, x=x, **({} if y is None else {"y": y}))
        paths = {i: Path(tmp) / f"member-{i}.parquet" for i in member_devs}
        commands = {i: ["client", "--run", str(run_dir), "--member", str(i), "--predict",
                        str(x_path), "--out", str(paths[i]), "--device", d, *extra]
                    for i, d in member_devs.items()}
        jobs = jobs or default_jobs(len(member_devs), list(member_devs.values()))
        clients = run_clients(run_dir, commands, member_devs, jobs)
        table = aggregate_files([paths[i] for i in member_devs],
                                manifest["config"]["aggregation"]["aggregators"])
    artifacts.write_parquet(out, table)
    return table, {"jobs": jobs, "clients": {str(i): c for i, c in clients.items()}}
