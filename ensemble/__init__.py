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
from ensemble.core import lazy

_API = ("train", "load_run", "Run")
_ESTIMATORS = ("DeepEnsembleClassifier", "DeepEnsembleRegressor")
__all__ = ["__version__", *_API, *_ESTIMATORS]
__getattr__, __dir__ = lazy.exports(__name__, {"ensemble.runs.api": _API,
                                               "ensemble.sklearn": _ESTIMATORS})
