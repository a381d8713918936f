"""Replication modes as strategy objects: `Mode` (what a run needs of a mode), `InGraph`,
`BetweenGraph`, and the registry (`register`, `get`, `names`) every caller asks instead of
comparing mode strings.

A mode answers the questions a run, the CLI, the estimators, the memory budget and `ensemble
compare` ask of it (does its launcher load TensorFlow, do its members train in processes of
their own, which options apply, how many TensorFlow processes it runs, what one epoch costs)
and carries the operations (`train`, `predict`, `train_arrays`). The operations of `InGraph`
and `BetweenGraph` compose run-level code (`ensemble.runs`), which this layer cannot import:
`ensemble.runs.operations` supplies them (`implement`) when it is imported, as
`ensemble.runs.api` does. A third mode is one class, registered; nothing else changes:

    class Sequential(Mode):
        name = "sequential"
        def train(self, request): ...    # -> the run's manifest
        def predict(self, request): ...  # -> (prediction record, measurements)
    register(Sequential)

A mode registered outside `ensemble` is found again in the processes a run or `compare` starts:
`register` adds its file to `$ENSEMBLE_MODE_FILES` (inherited by child processes), which
`names` and `get` import first (adanet's placement strategies are the model of the design).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

from ensemble.core.errors import UsageError
from ensemble.replication.epoch_cost import one_graph_epoch_seconds, queued_epoch_seconds

FILES_ENV = "ENSEMBLE_MODE_FILES"  # os.pathsep-separated files of modes registered elsewhere
DEFAULT = "in-graph"


@dataclass(frozen=True)
class TrainRequest:
    """What `Mode.train` trains: the resolved `cfg` (`ensemble.config.schema.Config`) into
    `run_dir`; `resume` continues the run there; `jobs` (clients at once) and `prepare_only`
    apply to modes whose members train in processes of their own; `cluster` a cluster spec;
    `verbosity` 0 quiet, 1 progress lines, 2 more."""

    cfg: Any
    run_dir: Path
    overwrite: bool = False
    resume: bool = False
    jobs: int | None = None
    cluster: dict | None = None
    prepare_only: bool = False
    verbosity: int = 1


@dataclass(frozen=True)
class PredictRequest:
    """What `Mode.predict` predicts: the completed run `run_dir` applied to `source`, streamed
    in batches of `batch_size` rows, written to `out` (`.parquet` or `.csv`) in `layout`
    (`wide` or `long`, the wide layout's `aggregator`). `devices` and `replicas` place the
    members (in-graph), `jobs` the clients at once (between-graph), `cluster_file` a cluster
    spec file; `cluster` a spec already loaded (wins over `cluster_file`)."""

    run_dir: Path
    source: str
    out: Path
    target: str | None = None
    devices: str = "auto"
    batch_size: int | None = None
    cluster_file: str | None = None
    cluster: dict | None = None
    strict_columns: bool = False
    replicas: int | str = "auto"
    jobs: int | None = None
    verbosity: int = 0
    layout: str = "wide"
    trust_builder: bool = False
    aggregator: str | None = None


class Mode(ABC):
    """A replication mode: how an ensemble's members are trained and applied.

    Class attributes (facts callers ask instead of comparing names):
        name: the mode's name (`--mode`, the manifest's `mode`).
        launcher_loads_tensorflow: the process the user started trains or predicts itself
            (False: it only starts client processes, which load TensorFlow).
        member_processes: members train in processes of their own: the builder must import
            by name, and `--jobs` sets how many processes run at once.
        prepare_only: `--prepare-only` applies (clients started by hand or a scheduler).
        trains_in_memory: `train_arrays` returns the members without writing a run
            directory (the estimators then save it themselves).
        member_files: each member writes its own history and predictions
            (`members/member-<i>.*`), which the aggregator (`ensemble aggregate`) combines;
            else the run's `predictions.parquet` holds every member's rows.
        refused: `(command, option) -> the reason` the option does not apply to this mode.
    """

    name: ClassVar[str]
    launcher_loads_tensorflow: ClassVar[bool] = True
    member_processes: ClassVar[bool] = False
    prepare_only: ClassVar[bool] = False
    trains_in_memory: ClassVar[bool] = True
    member_files: ClassVar[bool] = False
    refused: ClassVar[Mapping[tuple[str, str], str]] = {}

    @abstractmethod
    def train(self, request: TrainRequest) -> dict:
        """Train and write the run directory; returns its final manifest.

        Raises:
            UsageError: bad config, data or run directory.
        """

    @abstractmethod
    def predict(self, request: PredictRequest) -> tuple[dict, dict]:
        """Predict `request.source`; returns (the prediction's manifest, also written to
        `<out>.manifest.json`; this mode's measurements, e.g. `{"jobs", "clients"}`)."""

    def train_arrays(self, cfg, x, y, val, pre, run_dir=None) -> dict:
        """The estimators' training from arrays (`ensemble.runs.fit_arrays.train_in_graph`'s
        contract); by default refused.

        Raises:
            UsageError: this mode has no array training.
        """
        raise UsageError("Expected a mode that trains from arrays: "
                         f"{', '.join(n for n in names() if get(n).trains_arrays())}. "
                         f"Received: mode {self.name!r}.")

    def trains_arrays(self) -> bool:
        """Whether `train_arrays` is implemented (the estimators' `mode`)."""
        return type(self).train_arrays is not Mode.train_arrays

    def refusal(self, command: str, given: Sequence[str]) -> str | None:
        """The reason the first of the options `given` (dest names, e.g. `jobs`) does not
        apply to `command` in this mode, or None. By default `jobs` and `prepare_only` are
        refused unless the facts say otherwise."""
        for option in given:
            reason = self.refused.get((command, option))
            if reason is None and option == "jobs" and not self.member_processes:
                reason = f"--jobs does not apply to --mode {self.name}: it starts no clients"
            if reason is None and option == "prepare_only" and not self.prepare_only:
                reason = f"--prepare-only does not apply to --mode {self.name}"
            if reason is not None:
                return reason
        return None

    def devices(self, cfg, cluster: dict | None = None) -> list[str]:
        """The devices a run of `cfg` (`schema.Config`) places its members on
        (`devices.resolve` of `placement.devices`, on `cluster`'s tasks with a spec); names
        only, without loading TensorFlow, when the launcher leaves it to its clients.

        Raises:
            UsageError: a bad device spec or one this machine does not have.
        """
        from ensemble.replication import devices

        return devices.resolve(cfg.placement.devices, cfg.members.count, cluster,
                               names_only=not self.launcher_loads_tensorflow)

    def processes(self, members: int, devices: Sequence[str], jobs: int | None = None) -> int:
        """TensorFlow processes a run of `members` on `devices` holds at once (the memory
        budget's count), `jobs` being the clients at once the user asked for (None: the
        mode's default): 1 by default."""
        return 1

    def epoch_seconds(self, history: Sequence[dict], timings: dict, n_train: int
                      ) -> float | None:
        """The marginal seconds of one more epoch of a trained run (`ensemble compare`'s cost
        model, `pipelines.compare_cost`; `ensemble.replication.epoch_cost`). By default
        members train one after another: one queue (`queued_epoch_seconds`).

        Args:
            history: `history.parquet` rows (`member`, `epoch`, `seconds`).
            timings: the manifest's `timings`.
        """
        return queued_epoch_seconds(history, timings, n_train, lambda member: 0)


_implementations: dict[str, dict[str, Callable]] = {}


def implement(name: str, **operations: Callable) -> None:
    """Supply the run-level operations (`train`, `predict`, `train_arrays`) of built-in mode
    `name`; called by `ensemble.runs.operations` when it is imported."""
    _implementations.setdefault(name, {}).update(operations)


class _Implemented(Mode, ABC):
    """A built-in mode whose operations `ensemble.runs.operations` supplies."""

    def _operation(self, what: str) -> Callable:
        try:
            return _implementations[self.name][what]
        except KeyError:
            raise RuntimeError(f"mode {self.name}: no {what} operation; import "
                               "ensemble.runs.operations first") from None

    def train(self, request: TrainRequest) -> dict:
        return self._operation("train")(request)

    def predict(self, request: PredictRequest) -> tuple[dict, dict]:
        return self._operation("predict")(request)

    def train_arrays(self, cfg, x, y, val, pre, run_dir=None) -> dict:
        return self._operation("train_arrays")(cfg, x, y, val, pre, run_dir)


class InGraph(_Implemented):
    """In-graph replication: every member in one graph of one process."""

    name = "in-graph"
    refused = {
        **{(c, "jobs"): "--jobs applies to --mode between-graph only: in-graph replication "
                        "runs every member in one process" for c in ("train", "predict", "search")},
        ("train", "prepare_only"): "--prepare-only is for --mode between-graph: it writes the "
                                   "run directory for clients started by hand or by a scheduler"}

    def epoch_seconds(self, history, timings, n_train):
        """One graph trains every member (`one_graph_epoch_seconds`)."""
        return one_graph_epoch_seconds(history, timings, n_train)


class BetweenGraph(_Implemented):
    """Between-graph replication: one graph per member, in long-lived client processes
    (`ensemble.replication.client`), then the aggregator."""

    name = "between-graph"
    launcher_loads_tensorflow = False
    member_processes = True
    prepare_only = True
    trains_in_memory = False
    member_files = True
    refused = {
        ("predict", "devices"): "--devices applies to --mode in-graph only: between-graph "
                                "clients predict on the members' own devices (or --cluster's)",
        ("predict", "replicas"): "--replicas applies to --mode in-graph only: a between-graph "
                                 "client runs one graph per member on its own device"}

    def processes(self, members: int, devices: Sequence[str], jobs: int | None = None) -> int:
        """The clients the launcher starts (`placement.client_count`): `jobs` at most, one
        per member at most; by default one per core (or GPU); a cluster's task gets one."""
        from ensemble.replication.placement import client_count

        return client_count(members, devices, jobs)

    def epoch_seconds(self, history, timings, n_train):
        """Clients run at once, each member in its own client unless `timings.clients`
        says otherwise: the slowest client's sum (`queued_epoch_seconds`)."""
        return queued_epoch_seconds(history, timings, n_train, lambda member: member)


_registry: dict[str, type[Mode]] = {}


def register(cls: type[Mode]) -> type[Mode]:
    """Register mode class `cls` under `cls.name` (usable as a class decorator). A mode
    defined outside `ensemble` is also found by the processes this one starts
    (`$ENSEMBLE_MODE_FILES`).

    Raises:
        TypeError: `cls` is not a `Mode` subclass or has no `name`.
    """
    if not (isinstance(cls, type) and issubclass(cls, Mode)) or not getattr(cls, "name", None):
        raise TypeError(f"Expected a Mode subclass with a `name`. Received: {cls!r}")
    _registry[cls.name] = cls
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if path and not cls.__module__.startswith(("ensemble.", "_ensemble_mode_")):
        files = [f for f in os.environ.get(FILES_ENV, "").split(os.pathsep) if f]
        if str(Path(path).resolve()) not in files:
            os.environ[FILES_ENV] = os.pathsep.join([*files, str(Path(path).resolve())])
    return cls


def unregister(name: str) -> None:
    """Remove mode `name` from the registry (and its file from `$ENSEMBLE_MODE_FILES` when no
    other registered mode comes from it); an unknown name is ignored."""
    cls = _registry.pop(name, None)
    path = getattr(sys.modules.get(getattr(cls, "__module__", "")), "__file__", None)
    if path is None or any(c.__module__ == cls.__module__ for c in _registry.values()):
        return
    files = [f for f in os.environ.get(FILES_ENV, "").split(os.pathsep)
             if f and f != str(Path(path).resolve())]
    if files:
        os.environ[FILES_ENV] = os.pathsep.join(files)
    else:
        os.environ.pop(FILES_ENV, None)


def _load_files() -> None:
    """Import the files of modes registered by a parent process (once each)."""
    for k, path in enumerate(f for f in os.environ.get(FILES_ENV, "").split(os.pathsep) if f):
        loaded = {str(Path(m.__file__).resolve()) for m in list(sys.modules.values())
                  if getattr(m, "__file__", None)}
        if path in loaded or not Path(path).is_file():
            continue
        spec = importlib.util.spec_from_file_location(f"_ensemble_mode_{k}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)


def names() -> tuple[str, ...]:
    """The registered modes' names, in-graph (the default) first."""
    _load_files()
    return tuple(_registry)


def get(name: str) -> Mode:
    """The mode registered as `name`.

    Raises:
        UsageError: no such mode (names the registered ones).
    """
    if name not in _registry:
        _load_files()
    if name not in _registry:
        raise UsageError(f"Expected `mode` to be one of {', '.join(_registry)}. "
                         f"Received: mode={name!r}")
    return _registry[name]()


register(InGraph)
register(BetweenGraph)
