import numpy as np
import pytest

from ensemble.tasks.classification.aggregators import aggregate, disagreement, hard_vote, soft_vote
from ensemble.core.errors import UsageError

# 3 members, 2 rows, 3 classes
PROBS = np.array([
    [[0.7, 0.2, 0.1], [0.1, 0.5, 0.4]],
    [[0.2, 0.6, 0.2], [0.1, 0.3, 0.6]],
    [[0.6, 0.3, 0.1], [0.3, 0.3, 0.4]],
], dtype=np.float32)


def test_soft_vote_by_hand():
    expected = [[1.5 / 3, 1.1 / 3, 0.4 / 3], [0.5 / 3, 1.1 / 3, 1.4 / 3]]
    np.testing.assert_allclose(soft_vote(PROBS), expected, atol=1e-7)


def test_hard_vote_by_hand():
    # row 0 votes: 0, 1, 0 -> class 0 with 2/3; row 1 votes: 1, 2, 2 -> class 2 with 2/3
    np.testing.assert_allclose(hard_vote(PROBS), [[2 / 3, 1 / 3, 0], [0, 1 / 3, 2 / 3]], atol=1e-7)


def test_hard_vote_ties_go_to_smallest_class():
    tie = np.array([[[0.9, 0.1]], [[0.2, 0.8]]], dtype=np.float32)
    shares = hard_vote(tie)
    np.testing.assert_allclose(shares, [[0.5, 0.5]])
    assert np.argmax(shares, axis=1)[0] == 0


def test_rows_sum_to_one():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5), size=(4, 100)).astype(np.float32)
    for name in ("mean", "vote"):
        np.testing.assert_allclose(aggregate(p, name).sum(axis=1), 1.0, atol=1e-5)


def test_unknown_aggregator_and_bad_shape():
    with pytest.raises(UsageError, match="median"):
        aggregate(PROBS, "median")
    with pytest.raises(UsageError, match="shape"):
        soft_vote(PROBS[0])


def test_disagreement_by_hand():
    # labels: m0 = [0, 1], m1 = [1, 2], m2 = [0, 2]; pairs: (0,1) 1.0, (0,2) 0.5, (1,2) 0.5
    assert disagreement(PROBS) == pytest.approx(2 / 3)
    assert disagreement(PROBS[:1]) == 0.0


@pytest.mark.parametrize("name", ["mean", "vote"])
def test_tensorflow_twin_agrees_with_numpy(name):
    from ensemble.tasks.classification.aggregators_tf import aggregate_tf

    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(10), size=(5, 300)).astype(np.float32)
    np.testing.assert_allclose(aggregate_tf(p, name).numpy(), aggregate(p, name), atol=1e-6)


def test_verdict_counts_the_members_greedy_selection_kept():
    """With greedy selection answering, the closing sentence counts the members it kept
    (weight above 0 in `aggregators.json`), not every member of the run."""
    import pyarrow as pa

    from ensemble.tasks.classification.evaluation import verdict

    def row(split, model, nll, member=None, aggregator=None):
        return {"split": split, "model": model, "member": member, "aggregator": aggregator,
                "best_member": 1, "accuracy": 0.9, "nll": nll, "brier": 0.1, "ece": 0.05}

    rows = [row(s, f"member-{i}", 0.5 + i / 10, member=i) for s in ("validation", "test")
            for i in range(3)]
    rows += [row(s, "ensemble-mean", 0.45, aggregator="mean") for s in ("validation", "test")]
    rows += [row(s, "ensemble-greedy", 0.40, aggregator="greedy")
             for s in ("validation", "test")]
    table = pa.Table.from_pylist(rows)
    fit = {"members": [0, 1, 2], "n_rows": 10,
           "params": {"greedy": {"weights": [0.5, 0.5, 0.0], "size": 2, "order": [0, 1]}}}
    assert verdict(table, "test", fit).startswith(
        "The ensemble of 2 of the 3 members (ensemble-greedy, chosen on validation)")
    assert verdict(table, "test").startswith("The 3-member ensemble (ensemble-greedy")
    kept_all = {**fit, "params": {"greedy": {**fit["params"]["greedy"],
                                             "weights": [0.4, 0.3, 0.3]}}}
    assert verdict(table, "test", kept_all).startswith("The 3-member ensemble (ensemble-greedy")


def test_the_verdict_names_the_aggregator_predict_answers_with():
    """A NaN validation NLL is skipped and the others compared, by the rule of
    `choice.default_aggregator`: the verdict named `temperature` (NaN) over `mean` (1.4)."""
    import pyarrow as pa

    from ensemble.tasks.choice import default_aggregator
    from ensemble.tasks.classification.evaluation import verdict

    rows = [{"split": "test", "model": f"member-{i}", "member": i, "aggregator": None,
             "best_member": None, "accuracy": 0.8, "nll": 0.6, "brier": 0.2, "ece": 0.05}
            for i in range(2)]
    rows += [{"split": "test", "model": f"ensemble-{a}", "member": None, "aggregator": a,
              "best_member": None, "accuracy": 0.8, "nll": 0.5, "brier": 0.2, "ece": 0.05}
             for a in ("mean", "temperature")]
    fit = {"validation_nll": {"mean": 1.4, "temperature": float("nan")}}
    assert default_aggregator(["mean", "temperature"], fit) == "mean"
    assert verdict(pa.Table.from_pylist(rows), "test", fit).startswith(
        "The 2-member ensemble (ensemble-mean, chosen on validation)")
    fit = {"validation_nll": {"mean": 1.4, "temperature": 1.2}}
    assert verdict(pa.Table.from_pylist(rows), "test", fit).startswith(
        "The 2-member ensemble (ensemble-temperature, chosen on validation)")


def test_a_gain_of_a_thousand_percent_keeps_its_cells_apart():
    """Against a best member with a tiny Brier score the relative gain runs to four digits
    (`-0.0500 (-2133%)`, 16 characters in a 16-character column): the cell touched the one
    before it (`-0.0576 (-646%)-0.0500 (-2133%)`)."""
    import pyarrow as pa

    from ensemble.tasks.classification.evaluation import format_table

    def row(model, nll, brier, member=None, aggregator=None):
        return {"split": "test", "model": model, "member": member, "aggregator": aggregator,
                "best_member": 0, "n": 22, "accuracy": 1.0, "nll": nll, "brier": brier,
                "ece": 0.01, "gain_vs_mean_accuracy": 0.0, "gain_vs_mean_nll": 0.0,
                "gain_vs_mean_brier": 0.0, "gain_vs_mean_ece": 0.0,
                "gain_vs_best_accuracy": 0.0, "gain_vs_best_nll": -0.0576,
                "gain_vs_best_brier": -0.05, "gain_vs_best_ece": 0.0}

    rows = [row("member-0", 0.0089, 0.0023, member=0), row("member-1", 0.2, 0.09, member=1),
            row("ensemble-mean", 0.0665, 0.0523, aggregator="mean")]
    text = format_table(pa.Table.from_pylist(rows))
    line = next(x for x in text.splitlines() if x.startswith("ensemble-mean vs best member"))
    assert "(-647%) -0.0500 (-2174%)" in line and "%)-" not in line, line


def test_the_plots_refusal_names_the_checkout_install_first(monkeypatch):
    """Without matplotlib, `--plots` named only `pip install 'ensemble-replication[bench]'`,
    a distribution on no package index: the README's user installed from a checkout."""
    import sys

    from ensemble.tasks.report import pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    with pytest.raises(UsageError, match=r"pip install '\.\[bench\]' in a checkout"):
        pyplot()
