"""`DeepEnsembleClassifier(class_weight=...)`: a scikit-learn parameter (stored as given,
checked at `fit`) routed to `training.class_weight`."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from ensemble.sklearn import DeepEnsembleClassifier

SMALL = dict(n_members=2, hidden=(8,), dropout=0.0, epochs=3, learning_rate=0.02,
             batch_size=32, random_state=3, validation_fraction=0)


def _imbalanced(n=400, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-(-2.5 + x[:, 0]))), "yes", "no")
    return x, y


def test_balanced_weights_raise_the_minority_class_probability():
    x, y = _imbalanced()
    assert 0.05 < np.mean(y == "yes") < 0.2
    plain = DeepEnsembleClassifier(**SMALL).fit(x, y)
    balanced = DeepEnsembleClassifier(**SMALL, class_weight="balanced").fit(x, y)
    assert plain.config_.training.class_weight == "none"
    assert balanced.config_.training.class_weight == "balanced"
    # the weighted loss pulls the mean predicted share of "yes" towards 1/2
    share = {name: est.predict_proba(x)[:, 1].mean()
             for name, est in (("plain", plain), ("balanced", balanced))}
    assert share["balanced"] > share["plain"] + 0.05
    assert (balanced.predict(x) == "yes").sum() > (plain.predict(x) == "yes").sum()


def test_class_weight_is_a_parameter_checked_at_fit():
    est = DeepEnsembleClassifier(class_weight="balanced")
    assert est.get_params()["class_weight"] == "balanced"
    assert clone(est).class_weight == "balanced"
    bad = DeepEnsembleClassifier(class_weight="heavy")  # stored as given
    with pytest.raises(ValueError, match=r"class_weight.*None, 'balanced' or a dict.*heavy"):
        bad.fit(*_imbalanced(40))
    with pytest.raises(ValueError, match=r"finite weights >= 0.*'yes': -1"):
        DeepEnsembleClassifier(class_weight={"yes": -1}).fit(*_imbalanced(40))
    with pytest.raises(ValueError, match=r"`class_weight` to name classes of y \(no, yes\).*maybe"):
        DeepEnsembleClassifier(**SMALL, class_weight={"maybe": 2}).fit(*_imbalanced(40))


def test_a_dict_of_the_balanced_weights_trains_the_same_members_as_balanced():
    from sklearn.utils.class_weight import compute_class_weight

    x, y = _imbalanced()
    w = compute_class_weight("balanced", classes=np.array(["no", "yes"]), y=y)
    given = DeepEnsembleClassifier(**SMALL, class_weight={"no": w[0], "yes": w[1]}).fit(x, y)
    balanced = DeepEnsembleClassifier(**SMALL, class_weight="balanced").fit(x, y)
    np.testing.assert_allclose(given.predict_proba(x), balanced.predict_proba(x), atol=1e-6)
    heavier = DeepEnsembleClassifier(**SMALL, class_weight={"yes": 3 * w[1]}).fit(x, y)
    assert heavier.predict_proba(x)[:, 1].mean() > balanced.predict_proba(x)[:, 1].mean()
