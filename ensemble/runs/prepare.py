"""Preparing a run directory and its first manifest (shared by both replication modes).

`prepare` loads and splits the data, fits the scaler, stores the scaled splits under `data/`,
places the members and writes the first manifest (status `running`); `reopen` marks an
unfinished run running again for `--resume`. Builders then train, and
`ensemble.runs.run_status.finish` records the artifacts' sha256 and the final status.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ensemble.config.changes import resume_changes
from ensemble.config import auto
from ensemble.core import artifacts, background, memory, staging, versions
from ensemble.data import kinds
from ensemble.data import sources
from ensemble.core import runlock
from ensemble.core.manifest import Manifest
from ensemble import tasks
from ensemble.config.schema import Config, member_hparams
from ensemble.replication.devices import build_info
from ensemble.core.errors import UsageError
from ensemble.models.members import member_seed
from ensemble.replication.modes import Mode, TrainRequest
from ensemble.replication.placement import place
from ensemble.data.preprocessing import Preprocessing
from ensemble.data.prepared import SPLITS, prepare_splits
from ensemble.data.splitting import TRAIN
from ensemble.runs.context import RunContext
from ensemble.runs.run_status import effective_status


def run_id_for(run_dir: Path, cfg: Config) -> str:
    """The run id of a run written to `run_dir`: its name when that is a default run id
    (`artifacts/<run_id>`, chosen before the data were read), else a new one."""
    import re

    name = Path(run_dir).name
    return name if re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", name) else new_run_id(cfg)


def new_run_id(cfg: Config) -> str:
    """`YYYYmmdd-HHMMSS-<first 6 hex of the config sha256>` (UTC)."""
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{cfg.sha256()[:6]}"


def check_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Refuse to train into a directory that already holds a run, unless `overwrite`; with
    `overwrite`, remove every file of the old run (`clear_run_dir`). Call it holding the run
    lock.

    Raises:
        UsageError: as `holds_run`.
    """
    if holds_run(run_dir, overwrite):
        clear_run_dir(run_dir)


def holds_run(run_dir: Path, overwrite: bool) -> bool:
    """Whether `run_dir` holds a run that `overwrite` allows to replace (False: no run there).

    Raises:
        UsageError: `run_dir` holds a manifest and not `overwrite` (an interrupted or failed
        run: the message says to `--resume` it first), or is a file.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"Run directory {run_dir} is a file; expected a directory.")
    if not (run_dir / artifacts.MANIFEST).exists():
        return False
    if not overwrite:
        try:
            status = effective_status(Manifest.load(run_dir), run_dir)
        except UsageError:
            status = "damaged"
        if status in ("interrupted", "failed", "prepared"):
            raise UsageError(f"Run directory {run_dir} holds a run that is {status}; continue "
                             f"it with `ensemble train --resume --run-dir {run_dir}`, or pass "
                             "--overwrite to replace it (its checkpoints are lost).")
        raise UsageError(f"Run directory {run_dir} already holds a run; "
                         "pass --overwrite to replace it or choose another --run-dir.")
    return True


def clear_run_dir(run_dir: Path, keep: Sequence[str] = ()) -> None:
    """Remove every file of the run in `run_dir` but its lock and the entries named in `keep`
    (the manifest last, so that a crash midway still leaves a run directory that
    `--overwrite` clears)."""
    for entry in sorted(run_dir.iterdir()):
        if entry.name in (*runlock.LOCK_FILES, artifacts.MANIFEST, *keep):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (run_dir / artifacts.MANIFEST).unlink()
    staging.fsync_dir(run_dir)


@contextmanager
def writing(run_dir: Path, command: str) -> Iterator[None]:
    """Hold the run lock for a training driver (`runlock.writing`); a run directory this call
    created is removed again when the block fails before writing a manifest.

    Raises:
        UsageError: `run_dir` is a file, or another process holds the run (named).
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"Run directory {run_dir} is a file; expected a directory.")
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"Cannot create run directory {run_dir}: {exc.strerror}") from None
    try:
        with runlock.writing(run_dir, command):
            yield
    except BaseException:
        if created and not (run_dir / artifacts.MANIFEST).exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def prepare(request: TrainRequest, mode: Mode, devices: list[str],
            cluster: dict | None = None) -> RunContext:
    """Create the run directory up to training: data splits, preprocessing, placement.

    The source is read a chunk at a time (`kinds.scan`): labels, split, the memory budget,
    then the preprocessing fitted on the training rows and every split encoded and scaled
    into its memory-mapped files (`ensemble.data.prepared.prepare_splits`: one pass over a
    numeric table, two otherwise).

    Args:
        request: the run's `cfg`, `run_dir`, `overwrite`, `jobs` (for the memory estimate).
        mode: the replication mode (its `name` is recorded; its facts size the memory
            estimate).
        devices: canonical device names; members are placed on them round robin.
        cluster: the cluster spec the devices belong to (recorded), or None.

    Returns:
        The run's context (`RunContext`): `cfg` with the `"auto"` keys made concrete
        (`ensemble.config.auto`, listed in the manifest's `defaults`), the manifest (also
        written to `run_dir/manifest.json`), the task, and the fitted preprocessing as
        `preprocessing.json` holds it.

    Raises:
        UsageError: bad data or an existing run (see `holds_run`); a run `overwrite`
            replaces is removed only after the labels, the task and the memory estimate
            passed, so a refused run leaves it whole.
    """
    from ensemble.runs import budget

    start = time.perf_counter()
    cfg, run_dir = request.cfg, Path(request.run_dir)
    replacing = holds_run(run_dir, request.overwrite)  # the old run stays until every check passed
    scan = kinds.scan(cfg.data)  # labels now, feature rows a chunk at a time below
    task, target = resolve_task(cfg, scan.y)
    # each row's split (one byte) and its class code (the smallest type): no index arrays
    which, classes, y = sources.assignment(scan, cfg.data, cfg.data.split_seed, task.stratified)
    scan.y = y  # the labels' codes in their place (the scan reads their count only)
    sizes = dict(zip(SPLITS, np.bincount(which, minlength=len(SPLITS)).tolist()))
    cfg, chosen = auto.resolve(cfg, sizes["train"], sizes["validation"])
    budget.check_run(cfg, mode, devices, sizes, task.n_outputs(len(classes)), request.jobs)
    task, fitted = task.fit_target(y[which == TRAIN])  # e.g. standardisation, train only
    task = task.with_threshold(cfg.training.threshold, len(classes), cfg.data.target)
    if cfg.training.class_weight != "none":
        task, weights = task.with_class_weight(cfg.training.class_weight, y[which == TRAIN],
                                               classes)
        target.update(weights)
    if fitted:
        from ensemble.config.bounds import check_target_scale

        check_target_scale(fitted["target_loc"], fitted["target_scale"], cfg.data.target)
    target.update(fitted)
    if replacing:
        clear_run_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sha256 = background.start(scan.sha256)  # the source's bytes hashed beside the pass(es)
    pre, hashed = prepare_splits(run_dir, scan, which, y, classes)  # `row`: file positions
    del which, y
    memory.release_arrow_pool()  # the pass's buffers: training never reads through pyarrow
    memory.release_heap()  # and the chunks' numpy arrays freed into glibc's arenas
    text = pre.to_json()
    artifacts.write_text(run_dir / artifacts.PREPROCESSING, text)
    pre = kinds.from_json(text)  # as every later reader of the file gets it
    manifest = new_manifest(cfg, mode.name, devices, pre, {
        "name": scan.name, "source": cfg.data.source, "target": cfg.data.target,
        "rows": sizes, "columns": list(scan.columns),
        "sha256": sha256(), **target}, cluster, task)
    manifest.run_id = run_id_for(run_dir, cfg)  # the folder's name for a default run dir
    manifest.defaults = chosen  # the "auto" keys and the values chosen (ensemble.config.auto)
    manifest.timings["prepare_seconds"] = time.perf_counter() - start
    for path, digest in hashed.items():  # the splits, hashed as written: never read again
        artifacts.remember(path, digest)
    manifest.artifacts = artifacts.artifact_hashes(run_dir)
    manifest.save(run_dir)
    return RunContext.create(run_dir, cfg, manifest, pre)


def check_data(cfg: Config) -> None:
    """The problems of the run's data and its task, in one message, before TensorFlow loads
    and before anything is written: its labels and first chunk (`kinds.scan`), then
    `resolve_task`; the later chunks are checked as they are prepared.

    Raises:
        UsageError: as `ensemble.data.sources.load` and `resolve_task`.
    """
    resolve_task(cfg, kinds.scan(cfg.data).y)
    memory.release_arrow_pool()


def resolve_task(cfg: Config, y) -> tuple[Any, dict[str, Any]]:
    """The run's task object for targets `y` (`tasks.resolve` of `[data] task`) and the
    dataset entries it adds to the manifest; checks the aggregators and `training.loss`
    against it.

    Raises:
        UsageError: an ambiguous target, an aggregator or loss of the other task, a target
            transform for classification or a target outside its domain (one line).
    """
    task = tasks.for_target(y, cfg.data.task, cfg.data.source, cfg.training.loss,
                            cfg.aggregation.aggregators)
    transform = cfg.training.target_transform
    if transform != "none":
        if not task.transforms_target:
            raise UsageError(f"Expected a regression target for `training.target_transform = "
                             f"{transform!r}` (--target-transform). Received: a {task.spec} "
                             f"target {cfg.data.target!r}; expected --target-transform none.")
        task = task.with_transform(transform)
        task.transform.check(np.asarray(y, np.float64), cfg.data.target)
    return task, {"task": task.spec}


def new_manifest(cfg: Config, mode: str, devices: list[str], pre: Preprocessing,
                 dataset: dict[str, Any], cluster: dict | None = None,
                 task=None) -> Manifest:
    """The first manifest of a run (status `running`): config, `dataset` (plus the feature
    names, classes and input shape of `pre`), the task, the model (builder, params and the
    sha256 of each builder's source file, None for a built-in), members placed on `devices`
    by `placement.strategy` with their seeds, hyperparameters and FLOPs per row (from the
    built model: `cost.member_costs`, which also checks the builders), versions. Shared by
    `prepare` and runs built from arrays (`ensemble.runs.fit_arrays`).

    Raises:
        UsageError: a bad builder or optimiser.
    """
    from ensemble.models import builders
    from ensemble.models import cost
    from ensemble.models.optimizer import check_optimizer

    task = task or tasks.get()
    hparams = [member_hparams(cfg, i) for i in range(cfg.members.count)]
    check_optimizer(cfg.training.optimizer, cfg.training.optimizer_params)
    flops = cost.member_costs(hparams, pre.input_shape, task.n_outputs(len(pre.classes)), task,
                              pre.scaling_layer if getattr(pre, "embedded", ()) else None)
    placement, replicas = _placement(cfg, devices, flops)
    model = {"builder": cfg.model.builder, "params": cfg.model.params,
             "builders": {b: builders.source_sha256(b)
                          for b in dict.fromkeys(h["builder"] for h in hparams)}}
    return Manifest.from_dict({
        "run_id": new_run_id(cfg), "mode": mode, "status": "running",
        "pid": os.getpid(), "host": socket.gethostname(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.to_dict(), "config_sha256": cfg.sha256(),
        "dataset": {**dataset, "feature_names": pre.output_names,
                    "classes": pre.classes.tolist(), "input_shape": list(pre.input_shape),
                    "identifiers": list(getattr(pre, "identifiers", ()))},
        "task": task.spec, "model": model,
        "devices": list(devices), "cluster": cluster,
        "placement": {"strategy": cfg.placement.strategy, "replicas": len(replicas[0])},
        "members": [{"index": i, "seed": member_seed(cfg.training.seed, i), "device": d,
                     "replicas": replicas[i],
                     "status": "pending", "hparams": hparams[i], "flops_per_row": flops[i]}
                    for i, d in enumerate(placement)],
        "versions": versions.installed(),
        # the build is TensorFlow's to tell: recorded here when this process has loaded it
        # (in-graph), else from the first between-graph client's report
        "tensorflow_build": build_info() if "tensorflow" in sys.modules else None,
        "timings": {},
    })


def _placement(cfg: Config, devices: list[str], flops: list) -> tuple[list[str], list[list[str]]]:
    """(each member's device, each member's replica devices): one device per member by
    `placement.strategy`, or with `placement.replicas` > 1 `placement.replica_devices`
    (replica 0, the member's home device, round robin).

    Raises:
        UsageError: replicas not in 1..len(devices), or replicas with `balanced`.
    """
    from ensemble.replication.placement import replica_devices

    groups = replica_devices(cfg.members.count, devices, cfg.placement.replicas)
    if len(groups[0]) == 1:
        placement = place(cfg.members.count, devices, cfg.placement.strategy, flops)
        return placement, [[d] for d in placement]
    if cfg.placement.strategy != "round-robin":
        raise UsageError("Expected placement.strategy 'round-robin' with --replicas > 1. "
                         f"Received: {cfg.placement.strategy!r}, which places one device per "
                         "member.")
    return [g[0] for g in groups], groups


def run_config(cfg: Config, manifest: Manifest) -> Config:
    """The concrete config a run of `manifest` trains with: `cfg` with its `"auto"` keys
    resolved for the run's rows, as `prepare` recorded them (`ensemble.config.auto`)."""
    rows = manifest.dataset.rows
    return auto.resolve(cfg, rows["train"], rows.get("validation", 0))[0]


def reopen(run_dir: Path, cfg: Config, mode: Mode) -> RunContext:
    """Reopen an interrupted, failed or prepared run, or a partial ensemble whose other members
    are left to train, for `--resume`; marks it running again.
    Call it holding the run lock: a `running` status then means its driver died.

    Returns:
        The run's context: `cfg` with its `"auto"` keys as `prepare` resolved them, the
        manifest as saved, the task and the run's preprocessing (verified).

    Raises:
        UsageError: not a run, another mode, completed, or a config that differs from the
        run's (names the changed keys: `resume_changes`).
    """
    manifest = Manifest.load(run_dir)
    if manifest.mode != mode.name:
        raise UsageError(f"Run {run_dir} was trained with --mode {manifest.mode}; "
                         f"resume it with that mode, not {mode.name}.")
    from ensemble.replication import divergence

    # a partial ensemble (`aggregate --min-members`) is completed with members left to train
    left = [m for m in manifest.members if m.status not in ("completed", divergence.STATUS)]
    if manifest.status == "completed" and not left:
        raise UsageError(f"Run {run_dir} is already completed; nothing to resume.")
    cfg = run_config(cfg, manifest)  # "auto" keys as `prepare` resolved them
    changes = resume_changes(manifest.config, cfg.to_dict())
    if changes:
        raise UsageError(f"Config changed since run {run_dir} started ({'; '.join(changes)}); "
                         "resume needs the same config.")
    manifest.status, manifest.pid, manifest.host = "running", os.getpid(), socket.gethostname()
    manifest.save(run_dir)
    return RunContext(Path(run_dir), manifest, cfg, tasks.for_run(manifest),
                      kinds.run_preprocessing(run_dir, manifest))
