"""Ensembles from in-memory arrays: what `ensemble.sklearn.DeepEnsembleClassifier` composes.

Preprocessing, training in either replication mode, prediction, and saving/loading as a run
directory (the layout of docs/reference/run-directory.md, so `ensemble.load_run` and
`ensemble predict --run` read it). Unlike `ensemble train`, every row given is a training row: no split is made (scikit-learn
does its own), and validation rows come only from `validation_data`.

In-graph training runs `training.train_loop` over the cached traced call of
`ensemble.replication.graph_cache` (the per-member step and seeds of every other path). Between-graph
training writes a prepared run directory (`data/` splits: train = the rows given,
validation = test = `validation_data`, or the training rows without it) and hands it to
`ensemble.runs.between.train_between_graph`, imported there only: launching client processes is
composition and lives in `pipelines/`.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ensemble.core import artifacts
from ensemble.tasks.classification import fitted, threshold
from ensemble.runs import prepare, run_status
from ensemble.core.manifest import Manifest
from ensemble.tasks import tables
from ensemble import tasks
from ensemble.config.schema import Config, from_dict
from ensemble.data.sources import Dataset
from ensemble.core.errors import UsageError
from ensemble.models.members import member_seed
from ensemble.data import kinds
from ensemble.data.preprocessing import Preprocessing



def dataset(x: np.ndarray, names: Sequence[str]) -> Dataset:
    """`x` `[n_rows, n_features]` as an unlabelled `Dataset` with column names `names`."""
    return kinds.in_memory_rows(x, names)


def fit_preprocessing(x: np.ndarray, y: np.ndarray, classes: np.ndarray,
                      names: Sequence[str]) -> Preprocessing:
    """The preprocessing of `ensemble train`, fitted on all rows of `x` (`kinds.fit_in_memory`)."""
    return kinds.fit_in_memory(x, y, classes, names)


def _configure(cfg: Config) -> list[str]:
    """GPU memory settings (once, before TensorFlow initialises), op determinism, and the
    members' devices (`placement.devices`, round robin)."""
    from ensemble.replication import devices
    from ensemble.replication.placement import place
    from ensemble.core.tfimport import import_tensorflow_quietly

    import_tensorflow_quietly()  # notebooks: no start-up banners, no retracing warnings
    devices.configure(cfg)
    n = cfg.members.count
    return place(n, devices.resolve(cfg.placement.devices, n))


def train_in_graph(cfg: Config, x: np.ndarray, y: np.ndarray, val, pre: Preprocessing,
                   run_dir=None) -> dict[str, Any]:
    """Train every member in one graph on `x` `[n_rows, n_features]` (scaled), `y` class
    indices; `val` is `(x_val, y_val)` or None.

    Returns:
        `{"devices", "weights" ([n_members] lists of arrays), "aggregators" (aggregators.json
        content of a fitted aggregator, else None), "history" (DataFrame)}`.
    """
    from ensemble.replication import graph_cache
    from ensemble.replication.training import Schedule, train_loop

    devs = _configure(cfg)
    task, _ = weighted_task(cfg, y, pre)
    entry = graph_cache.get(cfg, x.shape[1:], len(pre.classes), devs, len(x), task=task)
    group = entry.group
    schedule = Schedule.of(cfg.training)
    with entry.lock:
        entry.reset(cfg.training.seed)
        entry.feed(x, y)
        predict_val = None if val is None else (lambda: group.predict(val[0])[0])
        stopping = group.early_stopping(schedule) if val is not None else None
        try:
            records = train_loop(
                entry.run_steps, group.indices, schedule, len(x), group.task, predict_val,
                None if val is None else val[1], stopping=stopping, gather=entry.gather,
                max_steps=entry.gather.plan_calls(len(group.models), schedule.batch_size,
                                                  schedule.steps_per_epoch(len(x))),
                prepare=entry.run_steps.prepare)
        finally:
            entry.clear()
        weights = entry.weights()
        aggs = None
        name = cfg.aggregation.aggregators[0]
        # this fit's task: a cached graph's may carry another fit's decision threshold
        if task.fitted_names([name]) or task.threshold is not None:
            aggs = task.fit_aggregators(group.predict(val[0])[0], val[1], [name],
                                              group.indices, dataclasses.asdict(cfg.aggregation))
    return {"devices": devs, "weights": weights, "aggregators": aggs,
            "history": tables.history_table(records, group.task.score_names).to_pandas()}


def train_between_graph(cfg: Config, x: np.ndarray, y: np.ndarray, val, pre: Preprocessing,
                        run_dir=None, *, mode) -> dict[str, Any]:
    """Train every member in its own client process through a run directory (`run_dir`, or
    a temporary one removed afterwards); same arguments and result as `train_in_graph`, and
    `mode` the between-graph mode object (`ensemble.replication.modes.Mode`) that launches
    the clients."""
    from ensemble.models.members import load_member
    from ensemble.replication.modes import TrainRequest
    from ensemble.runs.between import train_between_graph as launch  # client processes

    tmp = Path(tempfile.mkdtemp(prefix="ensemble-sklearn-")) if run_dir is None else None
    path = tmp or Path(run_dir).expanduser()
    try:
        prepare.check_run_dir(path, overwrite=True)
        devs = _configure(cfg)
        xv, yv = val if val is not None else (x, y)
        rows = {"train": np.arange(len(x)), "validation": np.arange(len(xv)),
                "test": np.arange(len(xv))}
        artifacts.write_splits(path, {"train": x, "validation": xv, "test": xv},
                               {"train": y, "validation": yv, "test": yv}, rows)
        artifacts.write_text(path / artifacts.PREPROCESSING, pre.to_json())
        manifest = manifest_for(cfg, mode.name, pre,
                                {k: len(v) for k, v in rows.items()}, devs)
        manifest.dataset.update(weighted_task(cfg, y, pre)[1])  # the clients' loss
        manifest.artifacts = artifacts.artifact_hashes(path)  # clients verify the splits
        manifest.save(path)
        launch(TrainRequest(cfg, path, verbosity=0), mode, prepared=manifest)
        n = cfg.members.count
        weights = [load_member(artifacts.member_model_path(path, i), "/device:CPU:0")
                   .get_weights() for i in range(n)]
        history = artifacts.read_parquet(path / artifacts.HISTORY).to_pandas()
        if val is None:
            history[[c for c in history.columns if c.startswith("val_")]] = np.nan  # train rows
        task = _task(cfg, pre)
        aggs = fitted.read(path) if task.fitted_names(cfg.aggregation.aggregators[:1]) \
            or task.threshold is not None else None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"devices": devs, "weights": weights, "aggregators": aggs, "history": history}


def predict(est, x: np.ndarray, members: bool = False) -> np.ndarray:
    """Probabilities of scaled rows `x` with a fitted estimator's weights: the aggregator's
    `[n_rows, n_classes]`, or every member's `[n_members, n_rows, n_classes]` (float32)."""
    from ensemble.replication import graph_cache

    from ensemble.replication import devices
    from ensemble.replication.placement import place

    cfg, name = est.config_, est.aggregator_
    n = len(est.member_weights_)
    try:
        devs = _configure(cfg)
    except UsageError:  # e.g. unpickled where TensorFlow already has fewer logical CPUs
        devs = place(n, devices.resolve("auto", n))
    params = fitted.member_params(est.aggregators_, list(range(n)))
    entry = graph_cache.get(cfg, x.shape[1:], len(getattr(est, "classes_", ())), devs,
                            task=predict_task(est))
    with entry.lock:
        entry.load(est.member_weights_)
        member_p, ens = entry.predictor(name, params).predict(x)
    return member_p if members else ens[name]


def manifest_for(cfg: Config, mode: str, pre: Preprocessing, rows: dict[str, int],
                 devs: Sequence[str], named: bool = False) -> Manifest:
    """The first manifest (`run.new_manifest`, status `running`) of a run from arrays, its
    members placed as `devs` `[n_members]`; `named`: the columns came with names (a
    DataFrame), else they are `x0..`."""
    return prepare.new_manifest(cfg, mode, list(dict.fromkeys(devs)), pre, {
        "name": "arrays", "source": "arrays (an estimator's fit)", "target": "target",
        "rows": rows, "columns": list(pre.columns), "named_columns": named,
        "splits": "train: every row given to fit; validation and test: validation_data "
                  "(the training rows without it)"}, task=_task(cfg, pre))


def weighted_task(cfg: Config, y: np.ndarray, pre: Preprocessing) -> tuple[Any, dict]:
    """The estimator's task for the training targets `y` and the manifest `dataset` entries
    it adds: the loss weights of `training.class_weight` (`Task.with_class_weight`:
    `"balanced"` weights of a classification; `{}` for `"none"`), and under a
    `training.target_transform` the standardisation of `z = log(y + shift)` on `y` (target
    units; `Regression.fit_target`, as `ensemble train`'s), whose head returns the members'
    log-normals on the target's scale."""
    task, entries = _task(cfg, pre), {}
    if task.transform is not None:
        task, entries = task.fit_target(y)
    task, weights = task.with_class_weight(cfg.training.class_weight, y, list(pre.classes))
    return task, {**entries, **weights}


def _task(cfg: Config, pre: Preprocessing):
    """The task of an estimator's run: the config's `data.task` (the estimator's
    `run_task`, `estimator_base._config`), members on the target the estimator
    standardised (on `z` under `training.target_transform`: `weighted_task`), with the
    decision threshold of `training.threshold` (a binary classifier's)."""
    return _with_settings(tasks.get(cfg.data.task, loss=cfg.training.loss), cfg,
                          len(pre.classes))


def _with_settings(task, cfg: Config, n_classes: int):
    """`task` with the config's `training.target_transform` and `training.threshold`."""
    if cfg.training.target_transform != "none":
        task = task.with_transform(cfg.training.target_transform)
    if cfg.training.threshold != "none":
        task = task.with_threshold(cfg.training.threshold, n_classes)
    return task


def predict_task(est):
    """The task whose head and aggregators a fitted (or loaded: its `data.task` may be
    `auto`) estimator's prediction graph applies: its `run_task`'s with the config's
    settings (`_with_settings`), and under a target transform the standardisation of `z`
    it trained with (`target_loc_`, `target_scale_`; the members' log-normals on the
    target's scale)."""
    cfg = est.config_
    task = _with_settings(tasks.get(est.run_task.spec, loss=cfg.training.loss), cfg,
                          len(est.preprocessing_.classes))
    if task.transform is not None:
        task = task.with_target(est.target_loc_, est.target_scale_)
    return task


# `prepare.holds_run`'s hints, in the terms of the estimators' `save(path, overwrite=...)`
OVERWRITE_WORDING = [
    (r"pass --overwrite to replace it or choose another --run-dir",
     "pass save(path, overwrite=True) to replace it, or choose another path"),
    (r"pass --overwrite to replace it", "pass save(path, overwrite=True) to replace it"),
]


def save(est, path: Path, overwrite: bool = False) -> Path:
    """Write a fitted estimator as a completed run directory; returns `path`."""
    from ensemble.config.schema import member_hparams
    from ensemble.models.members import build_member, save_member

    from ensemble.core.notices import reworded

    with reworded(OVERWRITE_WORDING):  # the estimator's argument, not the CLI's flags
        prepare.check_run_dir(path, overwrite)
    path.mkdir(parents=True, exist_ok=True)
    cfg, pre = est.config_, est.preprocessing_
    n_classes = len(pre.classes)
    manifest = manifest_for(cfg, est.mode, pre, dict(est.n_rows_), est.devices_,
                            hasattr(est, "feature_names_in_"))
    task = _task(cfg, pre).with_target(float(getattr(est, "target_loc_", 0.0)),
                                       float(getattr(est, "target_scale_", 1.0)))
    manifest.dataset.update(task.target_entries())  # members predict in target units
    for i, weights in enumerate(est.member_weights_):
        h = member_hparams(cfg, i)
        model = build_member(h["builder"], h["params"], pre.input_shape,
                             task.n_outputs(n_classes), member_seed(cfg.training.seed, i),
                             f"member_{i}", task, pre.scaling_layer(),
                             cfg.training.precision)
        model.set_weights(weights)
        save_member(model, artifacts.member_model_path(path, i))
        manifest.member(i).status = "completed"
    artifacts.write_text(path / artifacts.PREPROCESSING, pre.to_json())
    if est.aggregators_:
        fitted.write(path, est.aggregators_)
    artifacts.write_parquet(path / artifacts.HISTORY, tables.history_table(
        est.history_.to_dict("records"), task.score_names))
    run_status.finish(path, manifest, "completed")
    return path


def check_task(cls, path: Path, manifest: Manifest):
    """The task of the run in `path` (`tasks.for_run`), which estimator class `cls` predicts
    when it is a `cls.run_task` (`Classification`, `Regression`).

    Raises:
        ValueError: a run of another task, naming it and the estimator that loads it.
    """
    task = tasks.for_run(manifest)
    if isinstance(task, cls.run_task):
        return task
    base = next(c for c in cls.__mro__ if "run_task" in vars(c) and c.run_task is None)
    other = next((c for c in base.__subclasses__()  # the estimators (DeepEnsembleBase's)
                  if c.run_task is not None and isinstance(task, c.run_task)), None)
    use = f"load it with {other.__name__}.load({str(path)!r})" if other is not None else \
        f"open it with ensemble.load_run({str(path)!r})"
    raise ValueError(f"Run {path} is a {task.name} run; {cls.__name__} loads "
                     f"{cls.run_task.name} runs only: {use}.")


def load(cls, path: Path):
    """A fitted `cls` (the estimator class) from a completed run directory of its task;
    rows of an array run (`.npz`, image folder, n-d `fit`) are `[n_rows, *input_shape]`.

    Raises:
        ValueError (UsageError): not a completed run, a damaged artifact, or a run of
            another task (`check_task`).
    """
    from ensemble.core.tfimport import import_tensorflow_quietly
    from ensemble.models.members import load_run_member
    from ensemble.runs.posthoc import run_aggregators

    manifest = Manifest.load(path)
    run_status.require_completed(path, manifest)
    import_tensorflow_quietly()  # Keras loads the members: no C++ banners in the notebook
    task = check_task(cls, path, manifest)
    cfg = from_dict(manifest.config)
    pre = kinds.read_preprocessing(artifacts.verify(path, manifest, path / artifacts.PREPROCESSING))
    table = bool(getattr(pre, "categories", None) or getattr(pre, "identifiers", ())
                 or getattr(pre, "impute", "error") != "error")
    n = len(manifest.members)
    weights = [load_run_member(path, manifest, i, "/device:CPU:0").get_weights()
               for i in range(n)]
    names, fit_ = run_aggregators(path, manifest)
    m, t = cfg.members, cfg.training
    est = cls(n_members=m.count, hidden=tuple(m.hidden), activation=m.activation,
              dropout=m.dropout, epochs=t.epochs, batch_size=t.batch_size,
              learning_rate=t.learning_rate, random_state=t.seed, mode=manifest.mode,
              devices=cfg.placement.devices, aggregator=names[0])
    est.classes_, est.preprocessing_, est.config_ = pre.classes, pre, cfg
    rows = kinds.row_shape(pre)  # array rows [*input_shape]: X.shape[1] is their first axis
    est.n_features_in_ = rows[0] if rows else len(pre.feature_names)
    named = manifest.dataset.named_columns
    if not rows and (manifest.dataset.name != "arrays" if named is None else named):
        est.feature_names_in_ = np.asarray(pre.feature_names, dtype=object)
    # a DataFrame, prepared as the run's table, columns matched by name (estimator_tables)
    est.table_input_ = "by-name" if table else False
    if table:  # its input columns: numeric, then categorical (a file's order is not kept)
        est.feature_names_in_ = np.asarray(pre.columns, dtype=object)
        est.n_features_in_ = len(est.feature_names_in_)
        est.categorical, est.impute = tuple(pre.categories) or "none", pre.impute
    est.seed_, est.devices_ = t.seed, [e.device for e in manifest.members]
    est.member_weights_, est.aggregator_ = weights, names[0]
    for key, value in task.target_entries().items():  # members trained on the scaled target
        setattr(est, f"{key}_", value)
    if task.target_entries():  # a regressor has no classes
        del est.classes_
    decided = threshold.of(((fit_ or {}).get("params") or {}).get(names[0]))  # binary runs
    est.aggregators_ = fit_ if task.fitted_names(names[:1]) or decided is not None else None
    est.n_rows_ = dict(manifest.dataset.rows)
    hist = path / artifacts.HISTORY
    est.history_ = artifacts.read_parquet(hist).to_pandas() if hist.is_file() else None
    return est
