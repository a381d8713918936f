"""The scikit-learn estimators' public import path (`DeepEnsembleClassifier`, `DeepEnsembleRegressor`).

The estimators live in `ensemble.runs.sklearn` (the shared base and the classifier) and
`ensemble.runs.sklearn_regressor`.
"""
from ensemble.runs.sklearn import DeepEnsembleClassifier
from ensemble.runs.sklearn_regressor import DeepEnsembleRegressor

__all__ = ["DeepEnsembleClassifier", "DeepEnsembleRegressor"]
