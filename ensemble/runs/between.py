"""Between-graph pipelines: the launcher, the aggregator run and between-graph prediction.

The launcher prepares the run directory once (data split, preprocessing, placement), then starts
at most `--jobs` long-lived client processes (`python -m ensemble.replication.client`), each
pinned to its device(s) with its share of the cores and its queue of members (each member in its
own graph), and finally the aggregator (`python -m ensemble.runs.aggregator`). Process launching
and measuring lives in `ensemble.replication.processes`; no process started here runs a
`pipelines` module.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from ensemble.config import auto
from ensemble.core import artifacts
from ensemble.replication import devices
from ensemble.replication import divergence
from ensemble.core import faults
from ensemble.core import interrupt
from ensemble.core import staging
from ensemble.runs import prepare, run_status
from ensemble.core.manifest import Manifest
from ensemble.core.errors import ClientFailed, UsageError
from ensemble.replication.placement import client_queues, default_jobs, place
from ensemble.replication import processes, protocol
from ensemble.replication.processes import checked, last_error, last_report, run_process
from ensemble.replication.modes import Mode, PredictRequest, TrainRequest
from ensemble.replication.protocol import ClientRequest
from ensemble.runs import aggregator

__all__ = ["checked", "last_report",
           "predict_between_graph", "run_clients", "run_process", "train_between_graph"]


class _Listener:
    """What a launcher hears from its clients (`protocol` messages on their stderr, from
    several threads): members done (`done`: member -> work seconds), members interrupted
    (`stopped`: member -> (epoch in progress, epochs)), progress printed when `verbosity`."""

    def __init__(self, on_member, verbosity: int):
        self.on_member, self.verbosity = on_member, verbosity
        self.lock = threading.Lock()
        self.done: dict[int, float] = {}
        self.stopped: dict[int, tuple[int, int]] = {}

    def __call__(self, line: str) -> bool | str:
        """Take `line` if it is a message (True; or the text before the message, another
        writer's, to keep as the client's output), else leave it as the client's output."""
        from ensemble.replication.progress import format_report

        message = protocol.decode(line)
        if message is None:
            return False
        before = line[:line.find(protocol.PREFIX)]
        if isinstance(message, protocol.Interrupted):
            with self.lock:
                self.stopped[message.member] = (message.epoch, message.epochs)
        elif isinstance(message, protocol.MemberDone):
            with self.lock:
                self.done[message.member] = message.work_seconds
            if self.on_member is not None:
                self.on_member(message.member, True)
        elif self.verbosity > 0:
            text = format_report(message, verbose=self.verbosity >= 2)
            if text:
                with self.lock:
                    print(text, flush=True)
        return before or True


def _run_client(request: ClientRequest, listener: _Listener, extra_env: dict) -> dict:
    """Run one client process (`python -m ensemble.replication.client`) to its end, with
    `extra_env` in its environment; returns its measurements, or `{"returncode", "error"}`
    when it failed (its unfinished members reported to `listener.on_member` as not ok)."""
    env = {**os.environ, **extra_env}  # the client maps its GPUs onto CUDA_VISIBLE_DEVICES
    res = run_process(request.argv(), env, module=protocol.CLIENT_MODULE,
                      on_stderr_line=listener)
    if res["returncode"] != 0:
        for i in request.members:
            if i not in listener.done and listener.on_member is not None:
                listener.on_member(i, False)
        return {"returncode": res["returncode"], "error": last_error(res)}
    report = last_report(res)
    return {"seconds": res["seconds"], "peak_rss_bytes": report["peak_rss_bytes"],
            "startup_seconds": report["ready_unix"] - res["spawned_unix"],
            "tensorflow_build": report.get("tensorflow_build"),
            # member -> [rows, seconds] of its steady-state training calls
            **({"steady": report["steady"]} if report.get("steady") else {}),
            **({"spans": report["spans"]} if report.get("spans") else {})}


def _raise_failures(queues: list[list[int]], results: dict[int, dict], done: dict) -> None:
    """Raise for the failed clients among `results` (queue -> `_run_client`'s), naming their
    unfinished members and last error lines: UsageError when every one failed on bad input
    (exit 2), `faults.ResourceFault` when each hit a resource fault, else `ClientFailed`."""
    failed = {q: r for q, r in results.items() if "error" in r}
    if not failed:
        return
    text = "; ".join(
        f"client of members {[i for i in queues[q] if i not in done]} failed "
        f"(exit {r['returncode']}): {r['error']}" for q, r in sorted(failed.items()))
    usage = all(r["returncode"] == 2 for r in failed.values())
    if not usage and all(faults.is_fault_line(r["error"]) for r in failed.values()):
        raise faults.ResourceFault(text)  # a full disk in the clients: one line, exit 1
    raise (UsageError if usage else ClientFailed)(text)


def run_clients(run_dir: Path, queues: list[list[int]], command: Callable[[list[int]], ClientRequest],
                devs: dict[int, str], on_member=None, verbosity: int = 1) -> dict[int, dict]:
    """Run one long-lived client process per queue, all at once; each trains (or predicts)
    its members one after another. A failed client does not stop the others: every client
    runs, then failures are raised. Clients' progress reports are printed as
    `member I: epoch E/N - ...` lines on stdout (none when `verbosity` is 0).

    Args:
        queues: member indices per client (`client_queues`).
        command: a queue -> its client's `protocol.ClientRequest` (`threads` and `progress`
            are set here).
        devs: member index -> the member's device in the run (the client pins itself to
            its members' devices, `visible.local_devices`).
        on_member: optional callback `on_member(index, ok)` when a member is done (ok) or its
            client ended without finishing it.

    Returns:
        member index -> `{"client": queue number, "seconds": the client's process wall time,
        "work_seconds": the member's own training/prediction time, "startup_seconds": the
        client's start-up (spawn to ready), "peak_rss_bytes": the client's peak, "steady"
        (training): `{member: [rows, seconds]}` of each of the client's members' steady-state
        training calls and `"spans"`, when they ran (`steady.SteadyState`)}`.

    Signals: while the clients run, SIGINT/SIGTERM to this process are forwarded to them
    (each stops after its current call, keeping its checkpoint); every client is reaped
    before this returns or raises, none is left running.

    Raises:
        UsageError / RuntimeError: a client failed (bad input / internal); names the failed
            members and each client's last error line.
        interrupt.Interrupted: this process got SIGINT/SIGTERM (`epoch`: the lowest epoch in
            progress among the interrupted members).
    """
    threads = max(1, devices.cpu_count() // max(1, len(queues)))
    listener = _Listener(on_member, verbosity)
    # OpenMP's threads as Ray sets them in its workers (its CPUs): the same in both engines
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}

    def launch(q: int) -> tuple[int, dict]:
        request = dataclasses.replace(command(queues[q]), threads=threads, progress="report")
        return q, _run_client(request, listener, env)

    pool = ThreadPoolExecutor(max_workers=max(1, len(queues)))
    try:
        with interrupt.deferred(), interrupt.on_signal(processes.forward):
            results = dict(pool.map(launch, range(len(queues))))
    finally:
        processes.kill_children()
        pool.shutdown(wait=True)
    if interrupt.requested() is not None:
        epochs = [e for e in listener.stopped.values() if e[0] is not None]  # None: untrained
        raise interrupt.Interrupted(interrupt.requested(), *(min(epochs) if epochs else
                                                              (None, None)))
    _raise_failures(queues, results, listener.done)
    done = listener.done
    return {i: {"client": q, "work_seconds": done.get(i), **results[q]}
            for q, queue in enumerate(queues) for i in queue}


def train_between_graph(request: TrainRequest, mode: Mode,
                        prepared: Manifest | None = None) -> Manifest:
    """Prepare the run, train every member in its own client process, then aggregate.

    Args:
        request: `request.prepare_only` stops after preparing the run directory, so that a
            scheduler can launch `ensemble client --run RUN --member I` for each member and
            then `ensemble aggregate`; `request.resume` continues an interrupted or failed
            run: only members not completed run, each from its own newest checkpoint;
            `request.cluster`: members go round robin over its tasks' devices, each client
            connects to it; `request.verbosity`: 0 quiet, 1 a line per member and epoch, 2
            also within epochs.
        prepared: the manifest of a run directory the caller prepared itself (its `data/`
            splits, `preprocessing.json` and placement written, as `DeepEnsembleClassifier`
            does from arrays); training starts from it instead of `run.prepare`.

    Returns:
        The final manifest.

    Raises:
        RuntimeError / UsageError: a client failed; the members that finished are kept and
        recorded as completed, the failed ones as failed.
    """
    from ensemble.runs.train import open_run, run_cluster

    from ensemble.replication import ray_engine

    r = request
    ray_engine.check(r, mode.name)
    cluster = run_cluster(r)
    devs = mode.devices(r.cfg, cluster)
    with prepare.writing(r.run_dir, f"ensemble train --mode {mode.name}"):
        ctx = None if prepared is not None and not r.resume else open_run(r, mode, devs, cluster)
        manifest = prepared if ctx is None else ctx.manifest
        cfg = prepare.run_config(r.cfg, manifest) if ctx is None else ctx.config
        if not r.resume and prepared is None and r.verbosity:
            print(auto.describe(cfg, manifest.defaults or {}), flush=True)
        if r.prepare_only:  # the clients, started by hand or a scheduler, take over
            return run_status.set_status(r.run_dir, "prepared")
        with run_status.recording_outcome(r.run_dir):
            final = _launch(r.run_dir, manifest, devs, r.jobs, r.verbosity, cfg.placement)
    if r.cfg.training.tensorboard:
        from ensemble.replication.tensorboard import write_ensemble_metrics

        metrics = artifacts.read_parquet(r.run_dir / artifacts.METRICS)  # the aggregator's
        epochs = cfg.training.epochs  # "auto": as resolved
        write_ensemble_metrics(r.run_dir, metrics.to_pylist(), epochs - 1)
    return final


def _launch(run_dir: Path, manifest: Manifest, devs: list[str], jobs: int | None,
            verbosity: int, placement) -> Manifest:
    """Run the clients of the members not completed on the `placement.engine`, then the
    aggregator; the manifest is changed by read-modify-write only (local clients record
    their members themselves, the driver those of Ray's tasks)."""
    todo = {m.index: m.device for m in manifest.members
            if m.status != divergence.STATUS and (
                m.status != "completed"
                or not all(p.is_file() for p in artifacts.member_files(run_dir, m.index)))}
    if placement.engine == "ray":
        start = time.perf_counter()
        clients, at_once = _run_on_ray(run_dir, manifest, sorted(todo), jobs, verbosity,
                                       placement.address)
        return _aggregate(run_dir, start, clients, at_once)
    jobs = jobs or default_jobs(max(1, len(todo)), devs)

    def record(index: int, ok: bool) -> None:  # a client ended without finishing `index`
        if not ok and interrupt.requested() is None:  # Ctrl-C: the queue's rest never ran
            def change(m: Manifest) -> None:
                if m.member(index).status != "interrupted":
                    m.member(index).status = "failed"
            Manifest.update(run_dir, change)

    start = time.perf_counter()
    queues = client_queues(todo, jobs)
    clients = run_clients(run_dir, queues, lambda q: ClientRequest(str(run_dir), q),
                          todo, record, verbosity)
    return _aggregate(run_dir, start, clients, len(queues))


def _aggregate(run_dir: Path, start: float, clients: dict[int, dict], jobs: int) -> Manifest:
    """Record the clients' measurements (`clients`: member -> its client's) and the training
    time since `start` (`time.perf_counter()`), settle diverged members, run the aggregator."""
    builds = [c.pop("tensorflow_build", None) for c in clients.values()]

    def timings(m: Manifest) -> None:  # the launcher never loads TensorFlow: the clients tell
        m.tensorflow_build = m.tensorflow_build or next((b for b in builds if b), None)
        m.timings.update(train_seconds=time.perf_counter() - start, jobs=jobs,
                         clients={str(i): c for i, c in clients.items()})

    final = Manifest.update(run_dir, timings)
    divergence.settle(final.diverged(), len(final.members), run_dir)
    res = checked(run_process([str(run_dir)], module=aggregator.MODULE), "aggregator")
    return Manifest.update(run_dir, lambda m: m.timings.update(
        aggregator_peak_rss_bytes=last_report(res)["peak_rss_bytes"]))


def _run_on_ray(run_dir: Path, manifest: Manifest, todo: list[int], jobs: int | None,
                verbosity: int, address: str) -> dict[int, dict]:
    """Train members `todo` as Ray tasks (`ray_engine.train_members`): the prepared splits
    and preprocessing go to the workers through the object store, and this process writes
    each member's files and record (status, node) as its result arrives.

    Returns:
        (member index -> its measurements, as `run_clients`'s, `client` being the queue it
        joins: the k-th member of `todo` the (k mod tasks at once)-th; the tasks the
        cluster runs at once: its CPUs over each task's, `jobs` at most).

    Raises:
        interrupt.Interrupted, UsageError, ClientFailed: as `ray_engine.train_members`;
            the members not finished are recorded as interrupted or failed.
    """
    from ensemble.data import kinds
    from ensemble.replication import ray_engine
    from ensemble.replication.client_work import record_member

    ray_engine.connect(address or None)
    submitted = time.time()
    payload = {"manifest": manifest.to_dict(),
               "split": {s: tuple(np.ascontiguousarray(a) for a in
                                  artifacts.read_split(run_dir, s, manifest))
                         for s in artifacts.SPLITS},
               "pre": kinds.run_preprocessing(run_dir, manifest)}
    threads = max(1, manifest.config["training"].get("intra_op_threads") or 1)
    at_once = ray_engine.tasks_at_once(threads, len(todo), jobs)
    listener = _Listener(None, verbosity)
    clients: dict[int, dict] = {}

    def done(index: int, result: dict) -> None:
        outputs = result.pop("outputs")
        if isinstance(outputs, int):  # diverged in that epoch: no files
            record_member(run_dir, index, "diverged", outputs)
        else:
            outputs.write(run_dir, index)
            record_member(run_dir, index, "completed")
        node = {"id": result["node"], "ip": result["node_ip"], "device": result["device"],
                "gpus": result["gpus"]}
        Manifest.update(run_dir, lambda m: setattr(m.member(index), "node", node))
        clients[index] = {
            "client": todo.index(index) % at_once, "seconds": time.time() - submitted,
            "work_seconds": result["work_seconds"],
            "startup_seconds": result["ready_unix"] - submitted,
            "peak_rss_bytes": result["peak_rss_bytes"],
            "tensorflow_build": result["tensorflow_build"],
            "steady": {str(index): result["steady"]},
            **({"spans": {str(index): result["spans"]}} if result["spans"] else {})}

    try:
        ray_engine.train_members(payload, todo, threads, listener, done, verbosity, jobs)
    except BaseException as exc:
        status = "interrupted" if isinstance(exc, interrupt.Interrupted) else "failed"

        def unfinished(m: Manifest) -> None:
            for i in todo:
                if i not in clients and m.member(i).status != "completed":
                    m.member(i).status = status
        Manifest.update(run_dir, unfinished)
        raise
    return clients, at_once


def predict_between_graph(request: PredictRequest) -> tuple[dict, dict]:
    """One client process per member (queue) streams `request.source` and writes its members'
    outputs; then the aggregator streams those files, batch by batch, into `request.out`.
    With `request.cluster_file`, members go round robin over that cluster's devices instead
    of the devices they were trained on.

    Returns:
        (the prediction's manifest, also written to `<out>.manifest.json`;
        `{"jobs": N, "clients": run_clients' measurements}`).
    """
    from ensemble.core.outputs import writes_through
    from ensemble.runs.predict import open_prediction
    from ensemble.replication.progress import RowProgress

    r = request
    job = open_prediction(r)
    job.stream.survey()  # the whole input checked once, notices once: clients stream it quietly
    member_devs = {m.index: m.device for m in job.manifest.members if m.index in job.used}
    if r.cluster_file is not None:
        from ensemble.replication.cluster import load_spec

        devs = devices.resolve("auto", len(member_devs), load_spec(r.cluster_file))
        member_devs = dict(zip(job.used, place(len(member_devs), devs)))
    start = time.monotonic()  # the prediction's wall time: clients and aggregation
    Path(r.out).parent.mkdir(parents=True, exist_ok=True)
    source = str(Path(r.source).resolve()) if Path(r.source).exists() else r.source
    # the members' files in an owned staging folder beside the output, which the next predict
    # there sweeps if this one is killed (`staging`); a FIFO's or /dev/stdout's folder is not
    # ours: the system's temporary folder then
    beside = Path(tempfile.gettempdir()) / "ensemble-predict" if writes_through(r.out) \
        else Path(r.out)
    tmp = str(staging.new_path(beside, ".members", folder=True))
    try:
        queues = client_queues(member_devs, r.jobs or default_jobs(
            len(member_devs), list(member_devs.values())))
        clients = run_clients(r.run_dir, queues, lambda q: ClientRequest(
            str(r.run_dir), q, predict=source, out=tmp, devices=[member_devs[i] for i in q],
            cluster=r.cluster_file and str(r.cluster_file), batch_size=job.batch_rows,
            target=r.target), member_devs, verbosity=0)
        progress = RowProgress(None, verbosity=r.verbosity, start=start)
        rows = aggregate_stream(job, {i: Path(tmp) / f"member-{i}.parquet"
                                      for i in sorted(member_devs)}, progress.update)
        seconds = progress.end()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for c in clients.values():
        c.pop("tensorflow_build", None)
    rec = job.finish("between-graph", rows, seconds, {i: [d] for i, d in member_devs.items()})
    return rec, {"jobs": len(queues), "clients": {str(i): c for i, c in clients.items()}}


def aggregate_stream(job, paths: dict[int, Path], on_rows=None) -> int:
    """The aggregator of a streamed between-graph prediction: read the members' output files
    (`paths`, member -> its file of `ensemble.replication.client.predict_client`) batch by
    batch in lockstep and write member and ensemble rows (numpy aggregators, fitted ones with
    the job's parameters) through `job.write` (`ensemble.runs.predict.Prediction`), each
    batch with the input's non-feature columns and ids (`InputStream.passthrough_batches`).

    Returns:
        The number of input rows.

    Raises:
        UsageError: a member file is missing or its row count differs from the others'.
    """
    import types

    import pyarrow.parquet as pq

    from ensemble.data.prediction_io import PredictionWriter

    for path in paths.values():
        if not Path(path).is_file():
            raise UsageError(f"Member predictions missing: {path}")
    files = [pq.ParquetFile(p) for p in paths.values()]
    if len({f.metadata.num_rows for f in files}) != 1:
        raise UsageError(f"Member predictions of {', '.join(map(str, paths.values()))} differ "
                         "in rows.")
    first = 0
    passthrough = job.stream.passthrough_batches()
    with PredictionWriter(job.request.out,
                          {"prediction": json.dumps({"mode": "between-graph"})}) as writer:
        for parts in zip(*(f.iter_batches(batch_size=job.batch_rows) for f in files)):
            n = parts[0].num_rows
            probs = {m: np.column_stack([rb.column(c).to_numpy() for c in rb.schema.names
                                         if c[:1] == "c" and c[1:].isdigit()])  # c0.. outputs
                     for m, rb in zip(paths, parts)}
            y = parts[0].column("y")
            extra, ids = next(passthrough, (None, None))
            job.write(writer, probs, None, types.SimpleNamespace(
                rows=np.arange(first, first + n, dtype=np.int64), first_row=first,
                y=None if y.null_count else y.to_numpy(), extra=extra, ids=ids))
            first += n
            if on_rows is not None:
                on_rows(n)
    return first
