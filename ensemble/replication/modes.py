"""Replication modes as strategy objects: `Mode`, what a run needs of a mode, and the requests
its operations take (`TrainRequest`, `PredictRequest`).

A mode answers the questions a run, the CLI, the estimators, the memory budget and `ensemble
compare` ask of it (does its launcher load TensorFlow, do its members train in processes of
their own, which options apply, how many TensorFlow processes it runs, what one epoch costs)
and carries its operations (`train`, `predict`, `train_arrays`). The caller passes the object
in (adanet's placement strategies are the model). The built-in modes, in-graph and
between-graph, compose run-level code and live with it (`ensemble.runs.builtin_modes`, whose
`get` also turns a name or a `module:Class` / `file.py:Class` spec into a mode). A third mode
is one class:

    class Sequential(Mode):
        name = "sequential"
        def train(self, request): ...    # -> the run's manifest
        def predict(self, request): ...  # -> (prediction record, measurements)

    ensemble.train(config, mode=Sequential())
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from ensemble.core.errors import UsageError
from ensemble.replication.epoch_cost import queued_epoch_seconds

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
        raise UsageError("Expected a mode that trains from arrays (in-graph, between-graph). "
                         f"Received: mode {self.name!r}, which has no array training.")

    def trains_arrays(self) -> bool:
        """Whether `train_arrays` is implemented (the estimators' `mode`)."""
        return type(self).train_arrays is not Mode.train_arrays

    def spec(self) -> str:
        """The name a child process finds this mode by (`--mode SPEC`): the mode's `name` for
        a built-in mode, else `path/file.py:Class` of the file that defines its class."""
        module = sys.modules.get(type(self).__module__)
        path = getattr(module, "__file__", None)
        if type(self).__module__.startswith("ensemble.") or path is None:
            return self.name
        return f"{Path(path).resolve()}:{type(self).__qualname__}"

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
