"""Ensemble training and aggregation with in-graph and between-graph replication.

Blocks only: configuration, data, device placement, members, the two builders, aggregators,
metrics and artifacts. The pipelines and the CLI live in the `pipelines` package.

The notebook API is re-exported here lazily (module `__getattr__`, PEP 562): `ensemble.train`,
`ensemble.load_run` and `ensemble.Run` come from `ensemble.runs.api` the first time they are used,
so `import ensemble` imports neither TensorFlow nor the pipelines (clients and the aggregator
start lean). `ensemble.DeepEnsembleClassifier` and `ensemble.DeepEnsembleRegressor`, the
scikit-learn estimators, are lazy too (from `ensemble.sklearn`, which imports scikit-learn but not
TensorFlow).
"""

from ensemble.core import VERSION as __version__

_API = ("train", "load_run", "Run")
_ESTIMATORS = ("DeepEnsembleClassifier", "DeepEnsembleRegressor")
__all__ = ["__version__", *_API, *_ESTIMATORS]


def __getattr__(name: str):
    if name in _API:
        from ensemble.runs import api

        return getattr(api, name)
    if name in _ESTIMATORS:
        from ensemble import sklearn

        return getattr(sklearn, name)
    raise AttributeError(f"module 'ensemble' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API, *_ESTIMATORS])
