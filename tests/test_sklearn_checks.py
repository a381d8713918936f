"""scikit-learn's own estimator checks on `DeepEnsembleClassifier` (tiny settings).

Every check passes on CPU with these settings but one; a check that cannot pass goes in
`expected_failed_checks` with its reason. `check_array_api_input` is skipped by
scikit-learn itself unless `SCIPY_ARRAY_API=1` (the estimator does not claim array API
support: it converts inputs to numpy for TensorFlow).
"""

from __future__ import annotations

from sklearn.utils.estimator_checks import parametrize_with_checks

from ensemble.sklearn import DeepEnsembleClassifier

# learning_rate 0.02 and 5 epochs: check_classifiers_train wants > 83% training accuracy on
# its blobs; tiny members so the ~100 fits take seconds (the traced graphs are reused).
TINY = DeepEnsembleClassifier(n_members=2, hidden=(8,), dropout=0.0, epochs=5,
                              learning_rate=0.02, random_state=0)
EXPECTED_FAILED: dict[str, str] = {
    # the dict of weights is honoured (tests/test_sklearn_class_weight.py), but TINY's 5 epochs
    # on the check's 50 noisy binary rows are 10 steps: 78% of its test rows go to the
    # heavy class, against the 87% the check asks (with 3 classes: 100%)
    "check_class_weight_classifiers": "5 epochs of 50 rows: too few steps for the binary case"}


@parametrize_with_checks([TINY], expected_failed_checks=lambda est: EXPECTED_FAILED)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)
