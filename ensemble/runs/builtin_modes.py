"""The built-in replication modes, in-graph and between-graph, and `get`: the mode object a
run uses, from a mode object, a built-in name or a `module:Class` / `file.py:Class` spec.

The modes are strategy objects (`ensemble.replication.modes.Mode`); these two compose the
run-level code of `ensemble.runs`, so they live here, a layer above the `Mode` interface.
"""

from __future__ import annotations

from ensemble.core import specs
from ensemble.core.errors import UsageError
from ensemble.replication.epoch_cost import one_graph_epoch_seconds, queued_epoch_seconds
from ensemble.replication.modes import Mode, PredictRequest, TrainRequest
from ensemble.core.manifest import Manifest


class InGraph(Mode):
    """In-graph replication: every member in one graph of one process."""

    name = "in-graph"
    refused = {
        **{(c, "jobs"): "--jobs applies to --mode between-graph only: in-graph replication "
                        "runs every member in one process" for c in ("train", "predict", "search")},
        ("train", "prepare_only"): "--prepare-only is for --mode between-graph: it writes the "
                                   "run directory for clients started by hand or by a scheduler"}

    def train(self, request: TrainRequest) -> Manifest:
        """Train every member in this process (`ensemble.runs.train.train_in_graph`); under
        the Ray engine on the TensorFlow servers it starts on the cluster's nodes
        (`ray_engine.TensorFlowServers`), ended with the run."""
        import dataclasses

        from ensemble.core.tfimport import import_tensorflow_quietly
        from ensemble.runs.train import train_in_graph

        from ensemble.replication import ray_engine

        ray_engine.check(request, self.name)
        import_tensorflow_quietly()
        placement = request.cfg.placement
        if placement.engine != "ray":
            return train_in_graph(request, self)
        ray_engine.connect(placement.address or None)
        with ray_engine.TensorFlowServers(request.cfg.training.deterministic) as servers:
            return train_in_graph(dataclasses.replace(request, cluster=servers.spec), self)

    def predict(self, request: PredictRequest) -> tuple[dict, dict]:
        """Predict with every member in this process (`ensemble.runs.predict`)."""
        from ensemble.runs.predict import predict_in_graph

        return predict_in_graph(request), {}

    def train_arrays(self, cfg, x, y, val, pre, run_dir=None) -> dict:
        """`ensemble.runs.fit_arrays.train_in_graph`."""
        from ensemble.runs import fit_arrays

        return fit_arrays.train_in_graph(cfg, x, y, val, pre, run_dir)

    def epoch_seconds(self, history, timings, n_train):
        """One graph trains every member (`one_graph_epoch_seconds`)."""
        return one_graph_epoch_seconds(history, timings, n_train)


class BetweenGraph(Mode):
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

    def train(self, request: TrainRequest) -> Manifest:
        """Start the clients, then aggregate (`ensemble.runs.between.train_between_graph`)."""
        from ensemble.runs.between import train_between_graph

        return train_between_graph(request, self)

    def predict(self, request: PredictRequest) -> tuple[dict, dict]:
        """Predict in client processes (`ensemble.runs.between.predict_between_graph`)."""
        from ensemble.runs.between import predict_between_graph

        return predict_between_graph(request)

    def train_arrays(self, cfg, x, y, val, pre, run_dir=None) -> dict:
        """`ensemble.runs.fit_arrays.train_between_graph`."""
        from ensemble.runs import fit_arrays

        return fit_arrays.train_between_graph(cfg, x, y, val, pre, run_dir, mode=self)

    def processes(self, members, devices, jobs=None) -> int:
        """The clients the launcher starts (`placement.client_count`): `jobs` at most, one
        per member at most; by default one per core (or GPU); a cluster's task gets one."""
        from ensemble.replication.placement import client_count

        return client_count(members, devices, jobs)

    def epoch_seconds(self, history, timings, n_train):
        """Clients run at once, each member in its own client unless `timings.clients`
        says otherwise: the slowest client's sum (`queued_epoch_seconds`)."""
        return queued_epoch_seconds(history, timings, n_train, lambda member: member)


BUILTIN: dict[str, type[Mode]] = {"in-graph": InGraph, "between-graph": BetweenGraph}


def names() -> tuple[str, ...]:
    """The built-in modes' names, in-graph (the default) first."""
    return tuple(BUILTIN)


def get(mode: Mode | type[Mode] | str) -> Mode:
    """The mode object `mode` stands for: itself (a `Mode`), an instance of a `Mode` subclass,
    the built-in mode of that name, or the `Mode` subclass that a `package.module:Class` or
    `path/file.py:Class` spec names (`Mode.spec`, how a child process finds a mode).

    Raises:
        UsageError: an unknown name, a spec that does not load, or an object that is not a
            mode (names the value and what was expected).
    """
    if isinstance(mode, Mode):
        return mode
    if isinstance(mode, str) and mode in BUILTIN:
        return BUILTIN[mode]()
    found = specs.load(mode, "mode") if isinstance(mode, str) and specs.is_spec(mode) else mode
    if isinstance(found, type) and issubclass(found, Mode) and getattr(found, "name", None):
        return found()
    raise UsageError(f"Expected `mode` to be one of {', '.join(BUILTIN)}, a Mode object or "
                     f"a `module:Class` (`file.py:Class`) spec of a Mode subclass. "
                     f"Received: mode={mode!r}")
