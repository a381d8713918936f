import numpy as np
import pytest

from ensemble.tasks.classification import metrics as M

Y = np.array([0, 1, 2, 1])
P = np.array([
    [0.8, 0.1, 0.1],
    [0.3, 0.6, 0.1],
    [0.5, 0.2, 0.3],  # wrong: predicts 0
    [0.0, 1.0, 0.0],
])


def test_accuracy():
    assert M.accuracy(Y, P) == 0.75


def test_nll_by_hand_with_clip():
    expected = -(np.log(0.8) + np.log(0.6) + np.log(0.3) + np.log(1.0)) / 4
    assert M.nll(Y, P) == pytest.approx(expected)
    zero = np.array([[1.0, 0.0]])
    assert M.nll(np.array([1]), zero) == pytest.approx(-np.log(1e-12))


def test_brier_by_hand():
    rows = [0.04 + 0.01 + 0.01, 0.09 + 0.16 + 0.01, 0.25 + 0.04 + 0.49, 0.0]
    assert M.brier(Y, P) == pytest.approx(np.mean(rows))


def test_ece_by_hand():
    # top probabilities 0.8, 0.6, 0.5, 1.0 -> bins 12, 9, 7, 14 (1.0 clamps to the last bin)
    # every bin holds one row: |acc - conf| = 0.2, 0.4, 0.5, 0.0 -> mean 0.275
    assert M.ece(Y, P) == pytest.approx(0.275)


def test_ece_shared_bin():
    y = np.array([0, 1])
    p = np.array([[0.9, 0.1], [0.92, 0.08]])  # both in bin 13, acc 0.5, conf 0.91
    assert M.ece(y, p) == pytest.approx(0.41)


def test_perfect_predictions():
    y = np.array([0, 1, 2])
    p = np.eye(3)
    assert M.all_metrics(y, p) == pytest.approx({"accuracy": 1.0, "nll": 0.0, "brier": 0.0,
                                                "ece": 0.0})


def test_shape_mismatch():
    with pytest.raises(ValueError, match="n_rows"):
        M.accuracy(Y[:2], P)


@pytest.mark.parametrize("n_classes", [2, 3, 10])
def test_brier_matches_scikit_learn(n_classes):
    """The numpy Brier score is scikit-learn's `brier_score_loss` with every class listed
    on the float64 copy of float32 rows that sum to 1 only within 1e-6, as the members'
    outputs do (scikit-learn computes in the dtype it is given)."""
    import warnings

    from sklearn.metrics import brier_score_loss

    rng = np.random.default_rng(n_classes)
    p = rng.dirichlet(np.ones(n_classes), size=500).astype(np.float32)
    y = rng.integers(0, n_classes, size=500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = brier_score_loss(y, p.astype(np.float64), labels=np.arange(n_classes))
    assert M.brier(y, p) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_reliability_diagram_counts_each_bins_rows_and_keeps_the_legend_off_the_data():
    """Each point of the reliability diagram carries its bin's row count (15 equal-width
    bins of the top probability), and the legend sits below the axes."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ensemble.tasks.classification.plots import _reliability
    from ensemble.tasks.report import legend_below

    top = np.array([0.55] * 3 + [0.95] * 5 + [0.99] * 2)  # bins 8 (3 rows) and 14 (7 rows)
    p = np.stack([top, 1 - top], axis=1)
    fig, ax = plt.subplots()
    _reliability(ax, np.zeros(10, int), p, "m")
    legend_below(ax)
    assert sorted(int(t.get_text()) for t in ax.texts) == [3, 7]
    fig.canvas.draw()
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.y1 <= axes.y0  # under the axes, not over the points
    plt.close(fig)
