"""The scikit-learn estimators' public import path (`DeepEnsembleClassifier`, `DeepEnsembleRegressor`).

The estimators live in `ensemble.runs.estimator_base` (the shared base),
`ensemble.runs.estimator` (the classifier) and `ensemble.runs.estimator_regressor`.
"""
from ensemble.runs.estimator import DeepEnsembleClassifier
from ensemble.runs.estimator_regressor import DeepEnsembleRegressor

__all__ = ["DeepEnsembleClassifier", "DeepEnsembleRegressor"]
