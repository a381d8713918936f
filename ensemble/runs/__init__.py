"""Runs: prepare a run directory, train, predict, aggregate post hoc, evaluate, export; the Python API and the scikit-learn estimators."""
