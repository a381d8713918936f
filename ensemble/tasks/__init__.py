"""Tasks: what a member's outputs mean and everything that follows from it (head, loss, scores, metrics, aggregators, tables, evaluation); `classification` and `regression` subclass the `Task` base.

`Task`, `Aggregator`, `Classification`, `Regression` and the registry's functions (`get`,
`for_run`, `resolve`, ...) are re-exported here lazily (module `__getattr__`, PEP 562), so that
importing one task module does not import every task.
"""

from ensemble.core import lazy

_BASE = ("Task", "Aggregator")
_REGISTRY = ("Classification", "Regression", "REGISTRY", "TASKS", "LOSSES", "AGGREGATOR_NAMES",
             "resolve", "get", "for_run", "for_target", "of_file")
__all__ = [*_BASE, *_REGISTRY]
__getattr__, __dir__ = lazy.exports(__name__, {"ensemble.tasks.base": _BASE,
                                               "ensemble.tasks.registry": _REGISTRY})
