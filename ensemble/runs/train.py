"""`ensemble train`: prepare the run directory, train the members, write the artifacts."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ensemble.config import auto
from ensemble.core import artifacts
from ensemble.replication import devices
from ensemble.replication import divergence
from ensemble.runs import posthoc
from ensemble.replication import progress
from ensemble.core.manifest import Manifest
from ensemble.runs import members_table
from ensemble.runs.context import RunContext
from ensemble.runs import prepare, run_status
from ensemble.tasks import eval_writer, tables
from ensemble.replication.cluster import naming_unreachable_tasks
from ensemble.config.schema import Config
from ensemble.replication.modes import Mode
from ensemble.replication.modes import TrainRequest


def default_run_dir(cfg: Config) -> Path:
    """`artifacts/<run id>` of a new run of `cfg` (`prepare.new_run_id`)."""
    return Path("artifacts") / prepare.new_run_id(cfg)


def run_cluster(request: TrainRequest) -> dict | None:
    """The cluster spec a run trains on: the request's, or on resume the run's own."""
    if request.cluster is None and request.resume:
        return Manifest.load(request.run_dir).cluster
    return request.cluster


def open_run(request: TrainRequest, mode: Mode, devs: list[str], cluster: dict | None
             ) -> RunContext:
    """The context a `mode` run starts from, under the run's writer lock (`prepare.writing`):
    the interrupted run reopened (`request.resume`), or a new run prepared on `devs`."""
    if request.resume:
        return prepare.reopen(request.run_dir, request.cfg, mode)
    return prepare.prepare(request, mode, devs, cluster)


def train_in_graph(request: TrainRequest, mode: Mode, callbacks: Sequence = ()) -> Manifest:
    """Train every member in one graph (in-graph replication) and write the run directory.

    A checkpoint of the whole graph (all members at the same epoch) is saved after every
    epoch; `request.resume` continues an interrupted run from the newest one. With a
    `request.cluster` spec, members are placed on the devices of its tasks and the
    aggregation stays on this client.

    Progress goes to stdout (`progress.for_people(request.verbosity)`); `callbacks` are
    further `training.Callback`s (per call and per epoch). `mode` is the in-graph mode object
    (`ensemble.runs.builtin_modes.InGraph`, or a subclass): its devices and name.

    Returns:
        The final manifest.

    Raises:
        cluster.ClusterError: a task of the cluster is unreachable, before or during the run.
        interrupt.Interrupted: SIGINT/SIGTERM (with signal handling on): training stopped
            after the current call, the run is marked `interrupted` (`.run_dir` set).
        UsageError: another process holds the run (`runlock`), or bad input.
    """
    r = request
    cluster = run_cluster(r)
    devices.configure(r.cfg)  # threads first: resolving named devices initialises TensorFlow
    devs = mode.devices(r.cfg, cluster)
    with prepare.writing(r.run_dir, f"ensemble train --mode {mode.name}"):
        ctx = open_run(r, mode, devs, cluster)
        if r.resume:
            callbacks = [progress.ResumeNotice(), *callbacks]
        if r.verbosity:
            print(auto.describe(ctx.config, ctx.manifest.defaults or {}), flush=True)
        with run_status.recording_outcome(r.run_dir), naming_unreachable_tasks(cluster):
            _train_and_write(ctx, [*progress.for_people(r.verbosity), *callbacks])
    return ctx.manifest


class _FirstEpoch:
    """A `training.Callback` noting when the first epoch this process trained ended (its
    progress line printed): `unix` (`time.time()`), None until then; what a user waits for
    before seeing training work (`benchmarks.benchmark`'s `first epoch s`)."""

    unix: float | None = None

    def on_train_begin(self, start_epoch, epochs, n_steps) -> None:
        pass

    def on_call_end(self, epoch, steps_done, n_steps, mean_losses, seconds) -> None:
        pass

    def on_epoch_end(self, epoch, records) -> None:
        if self.unix is None:
            self.unix = time.time()


def _healthy_outputs(ens, x_val) -> np.ndarray:
    """The validation outputs `[n_healthy, n_val, k]` of the members that have not diverged
    (`ens.divergence`): a diverged member's NaN outputs are left out of the ensemble's
    per-epoch TensorBoard scalars as out of everything else."""
    outputs = np.asarray(ens.predict(x_val)[0])
    return outputs if ens.divergence is None else outputs[ens.divergence.healthy()]


def _keep_healthy(ens, placed: list[str], run_dir: Path, manifest: Manifest, task, files):
    """Save the members that did not diverge (`divergence.settle`: fails when none is left)
    and record every member's status; returns (their `InGraphEnsemble`, their devices), their
    last validation outputs copied into a memory map of `files`."""
    from ensemble.models.members import save_member
    from ensemble.replication.in_graph import InGraphEnsemble

    diverged = ens.divergence.epochs  # {member: epoch}: left out of everything after
    divergence.settle(diverged, len(ens.models), run_dir)
    keep = [k for k, i in enumerate(ens.indices) if i not in diverged]
    for k in keep:
        save_member(ens.models[k], artifacts.member_model_path(run_dir, ens.indices[k]))
        manifest.member(ens.indices[k]).status = "completed"
    ens.divergence.record(manifest.members)
    if len(keep) == len(ens.models):
        return ens, placed
    healthy = InGraphEnsemble([ens.models[k] for k in keep], [placed[k] for k in keep], (),
                              [ens.indices[k] for k in keep], task=task)
    if ens.validation_outputs is not None:
        out = ens.validation_outputs
        healthy.validation_outputs = files.new((len(keep), *out.shape[1:]), out.dtype)
        for j, k in enumerate(keep):
            healthy.validation_outputs[j] = out[k]
    return healthy, [placed[k] for k in keep]


def _train_and_write(ctx: RunContext, callbacks: Sequence) -> None:
    """Build, train (with per-epoch checkpoints), save the members, predict the evaluation
    splits and write the run's tables; updates `ctx.manifest` and finishes the run."""
    from ensemble.replication.in_graph import InGraphEnsemble
    from ensemble.replication.steady import SteadyState
    from ensemble.replication.training import Schedule

    cfg, run_dir, manifest, task = ctx.config, ctx.path, ctx.manifest, ctx.task
    split = {s: artifacts.read_split(run_dir, s, manifest) for s in artifacts.SPLITS}
    classes = np.asarray(manifest.dataset.classes)
    (x_tr, y_tr, _), (x_val, y_val, _) = split["train"], split["validation"]
    placed = [m.device for m in manifest.members]
    start = time.perf_counter()
    ens = InGraphEnsemble.build(cfg, x_tr.shape[1:], len(classes), placed, aggregators=(),
                                n_train=len(x_tr), pre=ctx.preprocessing, task=task)
    if any(len(m.replicas or ()) > 1 for m in manifest.members):  # data parallelism
        ens.train_replicas = [m.replicas for m in manifest.members]
    if cfg.training.tensorboard:  # member scalars, and the in-graph ensemble's per epoch
        from ensemble.replication.tensorboard import EnsembleScalars, MemberScalars

        callbacks = [*callbacks, MemberScalars(run_dir),
                     EnsembleScalars(run_dir, lambda: _healthy_outputs(ens, x_val), y_val,
                                     cfg.aggregation.aggregators, task)]
    steady, first = SteadyState(cfg.training.batch_size, len(x_tr)), _FirstEpoch()
    with eval_writer.output_files(run_dir) as files:  # predictions on disk as predicted
        history = ens.fit(x_tr, y_tr, (x_val, y_val), Schedule.of(cfg.training),
                          run_dir / "checkpoints" / "in-graph", [*callbacks, steady, first],
                          allocate=files.new)
        train_seconds = time.perf_counter() - start
        manifest.timings.update(steady_rows=steady.rows, steady_seconds=steady.seconds,
                                first_epoch_end_unix=first.unix)
        ens, placed = _keep_healthy(ens, placed, run_dir, manifest, task, files)
        start = time.perf_counter()
        history = tables.history_table(history, task.score_names)
        artifacts.write_parquet(run_dir / artifacts.HISTORY, history)
        _evaluate(ens, placed, ctx, split, files, history.to_pylist())
    run_status.finish(run_dir, manifest, "completed", train_seconds=train_seconds,
               predict_seconds=time.perf_counter() - start)


def _evaluate(ens, placed, ctx: RunContext, split: dict, files, history: list[dict]) -> None:
    """Fit the fitted aggregators on the validation members' outputs (those of the last
    epoch, `MemberGroup.validation_outputs`, when its weights are the final ones; else
    predicted), predict the test split's members a chunk of rows at a time into the memory
    maps of `files` (`eval_writer.predict_to`), and write `aggregators.json`,
    `ensemble_size.parquet`, `predictions.parquet`, `metrics.parquet` and `members.parquet`
    (from the `history` records the caller wrote); the ensembles' rows are the numpy
    aggregators' of the members' outputs, as between-graph's aggregator process computes
    them (`eval_writer.write`). The evaluation table `ensemble evaluate` prints is kept for
    `Run.summary` (`evaluate.keep_table`)."""
    from ensemble.runs import evaluate

    cfg, run_dir, manifest, task = ctx.config, ctx.path, ctx.manifest, ctx.task

    names = task.applied_aggregators(cfg.aggregation.aggregators)
    settings = dataclasses.asdict(cfg.aggregation)
    predicted, splits = {}, {}
    for s in artifacts.EVAL_SPLITS:
        x, y, rows = split[s]
        if s == "validation" and ens.validation_outputs is not None:  # on disk already
            member_p, ens.validation_outputs = ens.validation_outputs, None
        else:
            member_p, _ = eval_writer.predict_to(files, ens.predict, x)
        splits[s] = posthoc.SplitMembers(ens.indices, member_p, rows, y)
        predicted[s] = eval_writer.SplitPredictions(dict(zip(ens.indices, member_p)), None,
                                                    rows, y)
    fit = posthoc.fit(task, {"validation": splits["validation"]}, names, settings)
    posthoc.write_fit(run_dir, task, fit, splits, settings)
    classes = np.asarray(manifest.dataset.classes)
    shown = evaluate.ShownRows("test" if len(split["test"][0]) else "validation", task)
    metrics = eval_writer.write(run_dir, predicted, task, classes, names, fit["params"],
                                prior=task.prior(classes, split["train"][1]), on_chunk=shown)
    evaluate.keep_table(run_dir, task.format_table(metrics, fit, shown.lines()))
    members_table.write(ctx, splits["validation"], history, fit)
