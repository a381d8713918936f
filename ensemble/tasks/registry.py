"""The tasks a run can have: the registry of built-in tasks, `resolve` (the task of a target
under `[data] task = "auto"`) and `get` / `for_run` (the task object of a name or a run).

A task of the user's is named by a spec (`[data] task = "package.module:Class"` or
`"path/to/file.py:Class"`, as builders are): `get` imports it in every process of the run (a
between-graph client too), and the manifest records the spec. Such a task subclasses
`ensemble.tasks.Task` (directly, or through `Classification` or `Regression`); every other
module asks the run's task object (`for_run`), never the class list or the metrics' columns.
"""

from __future__ import annotations

import copy

import numpy as np

from ensemble.core import specs
from ensemble.core.labels import text_among_numbers
from ensemble.core.notices import few
from ensemble.core.manifest import Manifest
from ensemble.tasks.base import Task, all_aggregator_names
from ensemble.tasks.classification.task import Classification
from ensemble.tasks.regression.task import Regression

REGISTRY: dict[str, type[Task]] = {"classification": Classification, "regression": Regression}
TASKS = tuple(REGISTRY)
LOSSES = ("auto", *dict.fromkeys(loss for t in REGISTRY.values() for loss in t.losses))
AGGREGATOR_NAMES = all_aggregator_names(list(REGISTRY.values()))  # every task's, each once
BUILTIN_TASKS = {"diabetes": "regression"}  # built-in sources whose task `auto` knows
MANY_VALUES = 10  # `auto`: integer targets with more distinct values may be regression
MIN_CLASS_ROWS = 3  # rows a class needs to appear in each of the stratified train/val/test
RARE_SHARE = 0.1  # `auto`: more than this share of distinct whole numbers that rare: regression


def score_units() -> dict[str, tuple[str, str]]:
    """`{second validation score: (unit after the loss, unit after the score)}` of every
    built-in task (`Task.score_units`), for progress lines."""
    return {t.score_names[1]: t.score_units for t in REGISTRY.values()}


def resolve(y: np.ndarray | None, requested: str = "auto", source: str = "") -> str:
    """The task of a target `y` `[n_rows]` under `[data] task = requested`.

    `auto`: text labels and integer labels with few distinct values are classification;
    non-integer numbers are regression; whole numbers with more than `MANY_VALUES` distinct
    values of which more than `RARE_SHARE` occur on fewer than `MIN_CLASS_ROWS` rows (too
    rare for a stratified split: prices, counts) are regression, with a notice naming
    `--task classification`. Built-in sources of `BUILTIN_TASKS` have their known task.

    Raises:
        UsageError: a text target asked to be regression, or a non-integer one asked to be
            classification.
    """
    from ensemble.core.errors import UsageError

    if specs.is_spec(requested):
        get(requested)  # importable, and a task
        return requested
    if requested not in ("auto", *TASKS):
        raise UsageError(f"Expected `data.task` to be auto, classification, regression or a "
                         f"task spec (module:Class). Received: {requested!r}")
    if y is None:
        return "classification" if requested == "auto" else requested
    y = np.asarray(y)
    text = y.dtype.kind in "USOb"
    whole = not text and bool(np.all(np.isfinite(y)) and np.all(y == np.round(y)))
    if requested == "regression":
        if text:
            raise UsageError(_text_refusal(y, source))
        return requested
    if requested == "classification":
        if not text and not whole:
            raise UsageError(f"Target of {source or 'the data'} holds non-integer numbers; "
                             "--task classification needs class labels (or use --task "
                             "regression).")
        return requested
    if source in BUILTIN_TASKS:
        return BUILTIN_TASKS[source]
    if text:
        return "classification"
    if not whole:
        return "regression"
    _, counts = np.unique(y, return_counts=True)
    rare = float(np.mean(counts < MIN_CLASS_ROWS))
    if len(counts) > MANY_VALUES and rare > RARE_SHARE:
        from ensemble.core.notices import notice

        notice(f"the target of {source or 'the data'} holds {len(counts):,} distinct whole "
               f"numbers, {rare:.0%} of them on fewer than {MIN_CLASS_ROWS} rows: trained as "
               "regression (--task classification to take them as classes)", once=True)
        return "regression"
    return "classification"


def _text_refusal(y: np.ndarray, source: str) -> str:
    """The refusal of text target `y` `[n_rows]` for `--task regression`: the values that are
    not numbers when most are (`labels.text_among_numbers`: markers such as `unknown`)."""
    markers = text_among_numbers(y)
    if not markers:
        return (f"Target of {source or 'the data'} holds text labels; --task regression needs "
                "numbers.")
    return (f"Target of {source or 'the data'} holds numbers but for "
            + few(list(markers.items()), show=lambda m: f"{m[1]} row{'s' * (m[1] != 1)} of "
                  f"{m[0]!r}")
            + "; --task regression needs numbers: leave those cells empty (rows without a "
            "label are dropped at training) or correct them.")


def get(name: str = "classification", **options) -> Task:
    """The task object of `name` (a key of `REGISTRY` or a spec); `options` go to the task's
    class (`Regression`: `loc`, `scale`, `loss`; `loss = "auto"` is every task's default).

    Raises:
        ValueError: an unknown task name.
        UsageError: a spec that does not name a `Task` with every method.
    """
    if specs.is_spec(name):
        return _user_task(name)
    if name not in REGISTRY:
        raise ValueError(f"Expected a task in {', '.join(TASKS)}. Received: {name!r}")
    if options.get("loss") in ("auto", None) or options.get("loss") not in REGISTRY[name].losses:
        options.pop("loss", None)
    return REGISTRY[name](**options)


def _user_task(spec: str) -> Task:
    """The task a spec names (a `Task` subclass or instance), with its `spec` set."""
    from ensemble.core.errors import UsageError

    task = specs.load(spec, "task")
    abstract = sorted(getattr(task, "__abstractmethods__", ())) if isinstance(task, type) else []
    if abstract:
        raise UsageError(f"Task {spec!r} lacks {', '.join(abstract)}; subclass "
                         "ensemble.tasks.Task and implement them (docs/guides/tasks.md).")
    task = task() if isinstance(task, type) else task
    if not isinstance(task, Task):
        missing = sorted(m for m in Task.__abstractmethods__
                         if not callable(getattr(task, m, None)))
        raise UsageError(f"Task {spec!r} lacks {', '.join(missing) or 'the Task base'}; "
                         "subclass ensemble.tasks.Task (or Classification or "
                         "Regression).")
    task.spec = spec
    return task


def for_run(manifest: Manifest) -> Task:
    """The task of a run from its manifest (`task`, the target's standardisation in
    `dataset.target_loc` / `target_scale`, `config.training.loss`, `target_transform` and
    `threshold`,
    the class weights in
    `dataset.class_weight`)."""
    options = {} if manifest.task is None else {"name": manifest.task}
    task = get(**options, loss=manifest.config.get("training", {}).get("loss", "auto"))
    d = manifest.dataset
    task = task.with_target(_or(d.target_loc, 0.0), _or(d.target_scale, 1.0))
    transform = manifest.config.get("training", {}).get("target_transform", "none")
    if transform != "none" and isinstance(task, Regression):  # log-normal members
        task = task.with_transform(transform)
    threshold = manifest.config.get("training", {}).get("threshold", "none")
    if threshold != "none":  # binary classification: the `y_pred` rule
        task = task.with_threshold(threshold, len(d.classes or ()))
    if d.extra.get("class_weight") is not None:  # `training.class_weight = "balanced"`
        task = copy.copy(task)
        task.class_weight = tuple(map(float, d.extra["class_weight"]))
    return task


def _or(value, default):
    return default if value is None else value


def for_target(y: np.ndarray | None, requested: str = "auto", source: str = "",
               loss: str = "auto", aggregators=("mean",)) -> Task:
    """The task of a run's targets `y` `[n_rows]` under `[data] task = requested` (`resolve`),
    checked against the run's `training.loss` and `aggregation.aggregators`.

    Raises:
        UsageError: an ambiguous target, a single class, an aggregator or loss of another task
            (one line).
    """
    from ensemble.core.errors import UsageError

    name = resolve(y, requested, source)
    task = get(name, loss=loss)
    if task.stratified and y is not None and len(np.unique(y)) < 2:  # a task of classes
        raise UsageError(f"Data {source} has fewer than two classes; expected at least two.")
    task.check_aggregators(task.applied_aggregators(aggregators))
    if loss != "auto" and loss not in task.losses:
        raise UsageError(f"`training.loss = \"{loss}\"` does not fit a {name} run; expected "
                         + (" or ".join(task.losses) + "." if task.gaussian else
                            f"{' or '.join(task.losses)} (or auto)."))
    return task


def of_file(metadata: dict | None) -> Task:
    """The task a predictions file's key-value `metadata` names (`task`: the spec its run's
    task wrote, `Task.predictions_metadata`); a file without the key is a classification
    run's (the built-in regression task has always written its name there).

    Raises:
        UsageError: a spec that does not name a task (`get`).
    """
    spec = (metadata or {}).get(b"task", b"classification").decode()
    return get(spec)
