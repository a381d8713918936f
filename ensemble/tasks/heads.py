"""The import path `ensemble.tasks.heads` of the Task base and the built-in tasks, which
recorded task specs name (`ensemble.tasks.heads:Classification`); new code imports
`ensemble.tasks` (`ensemble.tasks.base`, `ensemble.tasks.registry`)."""

from ensemble.tasks.base import Task
from ensemble.tasks.classification.task import Classification
from ensemble.tasks.regression.task import Regression
from ensemble.tasks.registry import for_run, get, resolve

__all__ = ["Classification", "Regression", "Task", "for_run", "get", "resolve"]
