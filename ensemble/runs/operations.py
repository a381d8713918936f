"""The run-level operations of the built-in replication modes (`ensemble.replication.modes`):
importing this module supplies `InGraph` and `BetweenGraph` with their `train`, `predict` and
`train_arrays` (the mode objects live a layer below the runs they compose, see
`modes.implement`). `ensemble.runs.api` imports it; so does any caller of a mode's operation.
"""

from __future__ import annotations

from ensemble.replication import modes
from ensemble.replication.modes import PredictRequest, TrainRequest
from ensemble.runs.run_record import Manifest


def _train_in_graph(request: TrainRequest) -> Manifest:
    from ensemble.core.tfimport import import_tensorflow_quietly
    from ensemble.runs.train import train_in_graph

    import_tensorflow_quietly()
    return train_in_graph(request)


def _train_between_graph(request: TrainRequest) -> Manifest:
    from ensemble.runs.between import train_between_graph

    return train_between_graph(request)


def _predict_in_graph(request: PredictRequest) -> tuple[dict, dict]:
    from ensemble.runs.predict import predict_in_graph

    return predict_in_graph(request), {}


def _predict_between_graph(request: PredictRequest) -> tuple[dict, dict]:
    from ensemble.runs.between import predict_between_graph

    return predict_between_graph(request)


def _arrays(name: str):
    def train_arrays(cfg, x, y, val, pre, run_dir=None) -> dict:
        from ensemble.runs import fit_arrays

        return getattr(fit_arrays, name)(cfg, x, y, val, pre, run_dir)
    return train_arrays


modes.implement("in-graph", train=_train_in_graph, predict=_predict_in_graph,
                train_arrays=_arrays("train_in_graph"))
modes.implement("between-graph", train=_train_between_graph, predict=_predict_between_graph,
                train_arrays=_arrays("train_between_graph"))
