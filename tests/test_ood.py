"""Out-of-distribution detection, accuracy against confidence and dataset shift: the metrics
against independent computations, one corruption against a hand-computed case, and
`ensemble evaluate --ood/--shift` end to end on a tiny run (digits 0-4; 5-9 as the OOD set)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import entropy as scipy_entropy
from sklearn.metrics import average_precision_score, roc_auc_score

from ensemble.data import corruptions
from ensemble.tasks import ood
from ensemble.tasks import risk_coverage
from tests.conftest import run_cli


def test_contrast_against_a_hand_computed_case():
    x = np.array([[[0.0, 1.0], [0.5, 0.5]]])  # one 2x2 image, mean 0.5
    # severity 2: c = 0.5, (x - 0.5) * 0.5 + 0.5
    out = corruptions.corrupt_images(x, "contrast", 2, np.random.default_rng(0))
    np.testing.assert_allclose(out, [[[0.25, 0.75], [0.5, 0.5]]], atol=1e-7)


def test_brightness_keeps_hue_and_saturation():
    x = np.zeros((1, 2, 2, 3))
    x[0, 0, 0] = (0.5, 0.25, 0.0)  # HSV value 0.5 -> 0.6 at severity 2 (c = 0.1)
    out = corruptions.corrupt_images(x, "brightness", 2, np.random.default_rng(0))
    np.testing.assert_allclose(out[0, 0, 0], (0.6, 0.3, 0.0), atol=1e-6)
    np.testing.assert_allclose(out[0, 1, 1], (0.1, 0.1, 0.1), atol=1e-6)  # black -> gray


def test_table_corruptions_use_training_statistics():
    x = np.zeros((20000, 2))
    rng = corruptions.rng_for(0, "gaussian_noise", 5)  # severity 5: 1.0 training std
    out = corruptions.corrupt_table(x, "gaussian_noise", 5, rng, np.array([2.0, 0.5]),
                                    np.zeros(2))
    np.testing.assert_allclose(out.std(axis=0), [2.0, 0.5], rtol=0.03)
    out = corruptions.corrupt_table(x, "feature_dropout", 3, np.random.default_rng(1),
                                    np.ones(2), np.array([7.0, -1.0]))
    assert abs((out == 7.0)[:, 0].mean() - 0.3) < 0.02  # severity 3: 30% of entries
    assert set(np.unique(out[:, 1])) == {0.0, -1.0}


def test_accuracy_against_confidence_and_aurc_by_hand():
    y = np.array([0, 1, 1, 0])
    p = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.45, 0.55]])  # rows 1 and 3 wrong
    acc, kept = risk_coverage.accuracy_vs_confidence(y, p, [0.0, 0.58, 0.85, 0.95])
    np.testing.assert_allclose(kept, [1.0, 0.75, 0.25, 0.0])
    np.testing.assert_allclose(acc[:3], [0.5, 2 / 3, 1.0])
    assert np.isnan(acc[3])
    # confidence order 0.9 (right), 0.8 (right), 0.6 (wrong), 0.55 (wrong)
    assert risk_coverage.aurc(y, p) == pytest.approx(np.mean([0, 0, 1 / 3, 2 / 4]))
    rmse = risk_coverage.rmse_vs_kept(np.zeros(4), np.array([1.0, 2.0, 3.0, 4.0]),
                                      np.array([0.1, 0.4, 0.3, 0.2]), [0.5, 1.0])
    np.testing.assert_allclose(rmse, [np.sqrt((1 + 16) / 2), np.sqrt(30 / 4)])


def test_detection_scores_are_oriented_and_match_sklearn():
    rng = np.random.default_rng(0)
    p_in = rng.dirichlet([8, 1, 1], size=(3, 50))  # confident members
    p_out = rng.dirichlet([1, 1, 1], size=(3, 40))
    s_in = ood.uncertainty_scores(p_in, ["mean"])
    s_out = ood.uncertainty_scores(p_out, ["mean"])
    table = ood.ood_table(s_in, s_out, "x", None).to_pylist()
    ens = {r["score"]: r for r in table if r["model"] == "ensemble-mean"}
    h_in, h_out = scipy_entropy(p_in.mean(0), axis=1), scipy_entropy(p_out.mean(0), axis=1)
    labels = np.r_[np.zeros(50), np.ones(40)]
    assert ens["entropy"]["auroc"] == pytest.approx(roc_auc_score(labels, np.r_[h_in, h_out]))
    assert ens["entropy"]["aupr"] == pytest.approx(
        average_precision_score(labels, np.r_[h_in, h_out]))
    assert ens["max_probability"]["auroc"] > 0.8  # uncertain inputs score higher
    member = {r["score"]: r for r in table if r["model"] == "member-0"}
    assert member["mutual_information"]["auroc"] is None


def test_regression_scores_by_hand():
    members = np.array([[[0.0, 1.0]], [[2.0, 1.0]]])  # two members, one row: (mean, variance)
    rows = ood.uncertainty_scores(members, ["mean"], regression=True)
    ens = rows[-1]["scores"]  # mixture: aleatoric var 1, epistemic var ((0-1)^2+(2-1)^2)/2 = 1
    assert ens["std"][0] == pytest.approx(np.sqrt(2.0))
    assert ens["epistemic_std"][0] == pytest.approx(1.0)
    assert rows[0]["scores"]["std"][0] == pytest.approx(1.0)
    assert rows[0]["scores"]["epistemic_std"] is None


def test_shift_table_cells_stay_apart_for_wide_regression_values():
    """RMSE in target units (prices, grams) is wider than the table's 14-character cells: the
    cells once ran together (`362.432/348.562350.356/...`); each is now its own column."""
    import pyarrow as pa

    from ensemble import tasks
    from ensemble.runs.evaluate_ood import format_shift

    rows = [{"model": model, "member": member, "aggregator": agg, "corruption": "gaussian_noise",
             "severity": sev, "n": 88, "accuracy": None, "rmse": rmse * sev, "nll": 14.5}
            for sev in corruptions.SEVERITIES
            for model, member, agg, rmse in (("member-0", 0, None, 563062.4531),
                                             ("ensemble-mean", None, "mean", 559192.3304))]
    line = format_shift(pa.Table.from_pylist(rows), tasks.get("regression")).splitlines()[1]
    cells = line.split()[2:]
    assert cells[0] == "563062.453/559192.330" and len(cells) == 5
    assert [float(c.split("/")[0]) for c in cells] == pytest.approx(
        [563062.4531 * s for s in corruptions.SEVERITIES], abs=1e-3)


def test_blur_sigma_scales_with_the_image_size():
    from scipy.ndimage import gaussian_filter

    x = np.random.default_rng(0).random((2, 64, 64))
    out = corruptions.corrupt_images(x, "gaussian_blur", 5, np.random.default_rng(0))
    # severity 5: sigma 1.0 pixel at 32x32, so 2.0 at 64x64
    np.testing.assert_allclose(out[1], gaussian_filter(x[1], 2.0, mode="nearest"), atol=1e-6)


@pytest.fixture(scope="module")
def ood_run(tmp_path_factory):
    """A 2-member, 2-epoch run on digits 0-4, and the digits 5-9 as a CSV without labels."""
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("ood")
    d = load_digits()
    df = pd.DataFrame(d.data, columns=[f"p{i}" for i in range(64)])
    df["target"] = d.target
    df[df.target < 5].to_csv(root / "in.csv", index=False)
    df[df.target >= 5].drop(columns="target").to_csv(root / "out.csv", index=False)
    run = root / "run"
    assert run_cli("train", "--data", root / "in.csv", "--target", "target", "--members", 2,
                   "--epochs", 2, "--devices", "cpu:2", "--run-dir", run, "--quiet") == 0
    return root, run


def test_evaluate_ood_and_shift_end_to_end(ood_run, capsys):
    root, run = ood_run
    assert run_cli("evaluate", "--run", run, "--ood", root / "out.csv", "--shift",
                   "--plots") == 0
    out = capsys.readouterr().out
    assert "out-of-distribution detection" in out and "dataset shift" in out
    got = pd.read_parquet(run / "ood.parquet")
    assert set(got.score) == {"max_probability", "entropy", "mutual_information"}
    assert (got.n_out == 896).all() and got.ood_sha256.str.len().eq(64).all()
    shift = pd.read_parquet(run / "shift.parquet")
    assert set(shift.corruption) == {"gaussian_noise", "feature_dropout"}
    assert sorted(set(shift.severity)) == [1, 2, 3, 4, 5]
    hashes = json.loads((run / "manifest.json").read_text())["artifacts"]
    for name in ("ood.parquet", "shift.parquet", "ood_entropy.png", "shift.png"):
        assert name in hashes and (run / name).is_file()

    # the same AUROC from the stored predictions of the OOD set, checked against scikit-learn
    preds = root / "out.parquet"
    assert run_cli("predict", "--run", run, "--data", root / "out.csv", "--layout", "long",
                   "--out", preds, "--quiet") == 0
    test = pd.read_parquet(run / "predictions.parquet")
    test = test[(test.split == "test") & (test.model == "member-1")].sort_values("row")
    other = pd.read_parquet(preds)
    other = other[other.model == "member-1"].sort_values("row")
    cols = [c for c in test.columns if c.startswith("p_")]
    scores = np.r_[scipy_entropy(test[cols].to_numpy(), axis=1),
                   scipy_entropy(other[cols].to_numpy(), axis=1)]
    labels = np.r_[np.zeros(len(test)), np.ones(len(other))]
    assert run_cli("evaluate", "--run", run, "--ood", preds) == 0
    stored = pd.read_parquet(run / "ood.parquet")
    row = stored[(stored.model == "member-1") & (stored.score == "entropy")].iloc[0]
    assert row.auroc == pytest.approx(roc_auc_score(labels, scores), abs=1e-6)
    again = got[(got.model == "member-1") & (got.score == "entropy")].iloc[0]
    assert again.auroc == pytest.approx(row.auroc, abs=1e-4)  # predicted here vs stored


def test_evaluate_ood_bad_source_exits_2(ood_run, capsys):
    root, run = ood_run
    before = (run / "ood.parquet").stat().st_mtime_ns if (run / "ood.parquet").exists() else 0
    assert run_cli("evaluate", "--run", run, "--ood", root / "missing.csv") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing.csv" in err
    after = (run / "ood.parquet").stat().st_mtime_ns if (run / "ood.parquet").exists() else 0
    assert before == after
    assert run_cli("evaluate", "--ood", root / "out.csv") == 2


@pytest.mark.parametrize("flag", ["--shift", "--ood"])
def test_a_task_without_the_scores_is_refused_before_its_rows_are_read(ood_run, capsys,
                                                                       monkeypatch, flag):
    """A task keeping `Task`'s refusing `shift_scores` / `ood_scores` is refused up front:
    exit 2, one line naming the task, the run's stored rows never read, nothing written."""
    from ensemble import tasks
    from ensemble.runs import posthoc
    from ensemble.tasks.base import Task
    from ensemble.tasks.classification.task import Classification

    class NoScores(Classification):
        ood_scores = Task.ood_scores
        shift_scores = Task.shift_scores

    root, run = ood_run
    monkeypatch.setattr(tasks, "for_run", lambda manifest: NoScores())

    def unread(*args, **kwargs):
        raise AssertionError("the members' rows were read before the refusal")

    monkeypatch.setattr(posthoc, "read_members", unread)
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    argv = [flag] + ([root / "out.csv"] if flag == "--ood" else [])
    capsys.readouterr()
    assert run_cli("evaluate", "--run", run, *argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"`ensemble evaluate {flag}`" in err, err
    assert "defines none" in err
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
