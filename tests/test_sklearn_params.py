"""The estimators' parameters through scikit-learn's model selection: a keyword `fit` refuses
(a misspelt parameter) stays refused in every clone, so cross-validation and grid search do not
train with the default in its place; `devices` beyond what the process's TensorFlow has say
what it can take."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, cross_val_score

from ensemble.sklearn import DeepEnsembleClassifier, DeepEnsembleRegressor

TINY = dict(n_members=2, hidden=(4,), epochs=1, random_state=0)
X = np.random.default_rng(0).normal(size=(20, 2))
Y = (X[:, 0] > 0).astype(int)
REFUSED = r"unexpected keyword argument 'n_member'"


@pytest.mark.parametrize("make", [
    lambda: DeepEnsembleClassifier(**TINY, n_member=3),
    lambda: DeepEnsembleClassifier(**TINY).set_params(n_member=3),
    lambda: DeepEnsembleClassifier(**TINY).set_params(n_member=3).set_params(epochs=1),
    lambda: DeepEnsembleRegressor(**TINY, n_member=3),
])
def test_a_misspelt_parameter_is_refused_by_every_fit(make):
    est = make()
    for fit in (lambda: est.fit(X, Y), lambda: clone(est).fit(X, Y),
                lambda: cross_val_score(est, X, Y, cv=2, error_score="raise"),
                lambda: GridSearchCV(est, {"epochs": [1]}, cv=2, error_score="raise").fit(X, Y)):
        with pytest.raises(ValueError, match=REFUSED):
            fit()


def test_routed_builder_parameters_survive_clone():
    est = clone(DeepEnsembleClassifier(**TINY, model__dropout=0.0)).fit(X, Y)
    assert est.get_params()["model__dropout"] == 0.0 and est.config_.model.params == {
        "dropout": 0.0}


def test_more_devices_than_the_process_has_name_what_it_can_take():
    from conftest import N_LOGICAL_CPUS

    DeepEnsembleClassifier(**TINY).fit(X, Y)  # TensorFlow initialised, as in a notebook
    more = N_LOGICAL_CPUS * 2
    with pytest.raises(ValueError, match=rf"cannot split into cpu:{more} \(expected at most "
                                         rf"cpu:{N_LOGICAL_CPUS} in this process; cpu:{more} "
                                         r"needs a new one, e.g. a restarted notebook kernel\)"):
        DeepEnsembleClassifier(**TINY, devices=f"cpu:{more}").fit(X, Y)


@pytest.mark.parametrize("make, name", [("classifier", "std-scaling"), ("classifier", "foo"),
                                        ("regressor", "vote")])
def test_an_aggregator_of_another_task_is_refused_by_name(make, name):
    """One name, quoted as given, against the estimator's own task's names (the classifier
    printed `Received: ['foo']`, the config's list, and took the regressor's names)."""
    from ensemble.sklearn import DeepEnsembleClassifier, DeepEnsembleRegressor

    est = (DeepEnsembleClassifier if make == "classifier" else DeepEnsembleRegressor)(
        aggregator=name, epochs=1)
    x = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match=rf"^Expected `aggregator` from mean, .*\. "
                                         rf"Received: aggregator='{name}'$"):
        est.fit(x, (x[:, 0] > 0).astype(int) if make == "classifier" else x[:, 0])


@pytest.mark.parametrize("spec", ["gpu", "", "cpu:0"])
def test_a_bad_devices_spec_names_the_parameter(spec):
    """The estimator's parameter, as scikit-learn reports parameters (a ValueError naming
    `devices`), not the CLI's `--devices` in a UsageError."""
    x = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match=rf"^Expected `devices(='cpu:N')?` .*Received: "
                                         rf"devices='{spec}'$"):
        DeepEnsembleClassifier(devices=spec, epochs=1).fit(x, x[:, 0] > 0)
