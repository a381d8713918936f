"""ensemble search: the [search] space (sampling, bad spaces before TensorFlow), the search
run end to end (members.parquet, the greedy selection predict applies), --stratify, and a
search resuming only its unfinished run."""

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_cli, set_status

from ensemble.core import artifacts, runlock
from ensemble.config import search_space
from ensemble.core.errors import UsageError

SPACE = {"seed": 3, "hidden": [[16], [24, 8]], "activation": ["relu", "tanh"],
         "dropout": {"low": 0.0, "high": 0.2},
         "learning_rate": {"low": 1e-3, "high": 1e-2, "log": True}}

SEARCH = """
[data]
source = "digits"
[training]
epochs = 1
batch_size = 64
seed = 2
[placement]
devices = "cpu:2"
[search]
seed = 3
hidden = [[16], [24, 8]]
activation = ["relu", "tanh"]
dropout = { low = 0.0, high = 0.2 }
learning_rate = { low = 1e-3, high = 1e-2, log = true }
"""


def test_sampling_is_deterministic_and_prefix_stable():
    seed, space = search_space.parse_space(SPACE)
    a, b = search_space.sample(space, seed, 8), search_space.sample(space, seed, 8)
    assert a == b
    assert search_space.sample(space, seed, 5) == a[:5]  # candidate i depends on (seed, i) only
    assert search_space.sample(space, seed + 1, 8) != a
    for c in a:
        assert c["hidden"] in ([16], [24, 8]) and c["activation"] in ("relu", "tanh")
        assert 0.0 <= c["dropout"] <= 0.2 and 1e-3 <= c["learning_rate"] <= 1e-2


def test_log_and_integer_ranges_draw_their_distributions():
    _, space = search_space.parse_space({"learning_rate": {"low": 1e-4, "high": 1.0, "log": True},
                                         "hidden": {"low": 2, "high": 4, "integer": True}})
    draws = search_space.sample(space, 0, 400)
    lr = np.array([d["learning_rate"] for d in draws])
    # log-uniform over 4 decades: half the draws below 1e-2 (a uniform range: 1%)
    assert 0.4 < np.mean(lr < 1e-2) < 0.6
    widths = [d["hidden"] for d in draws]
    assert {w[0] for w in widths} == {2, 3, 4} and all(len(w) == 1 for w in widths)


def _bad_space_config(tmp_path, line: str):
    path = tmp_path / "bad.toml"
    path.write_text(SEARCH.split("[search]")[0] + "[search]\n" + line + "\n")
    return path


@pytest.mark.parametrize("line, key", [
    ("hiden = [[16]]", "search.hiden"),
    ("dropout = []", "search.dropout"),
    ("dropout = { low = 0.3, high = 0.1 }", "search.dropout"),
    ("learning_rate = { low = 0.0, high = 0.1, log = true }", "search.learning_rate"),
    ("l2 = { low = -1e-4, high = 1e-3, log = true }", "search.l2"),
    ("activation = ['relu', 'soft']", "search.activation"),
    ("hidden = { low = 8, high = 32 }", "search.hidden"),
])
def test_bad_spaces_exit_2_with_one_line_naming_the_key_before_tensorflow(
        tmp_path, capsys, monkeypatch, line, key):
    def no_tensorflow():
        raise AssertionError("TensorFlow loaded before the search space was checked")

    monkeypatch.setattr("pipelines.cli.import_tensorflow_quietly", no_tensorflow)
    path = _bad_space_config(tmp_path, line)
    assert run_cli("search", "--config", path, "--candidates", 2, "--select", 1,
                   "--run-dir", tmp_path / "run") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"`{key}" in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_config_without_search_table_is_refused(tmp_path, tiny_config):
    with pytest.raises(UsageError, match=r"no \[search\] table"):
        search_space.load_space(tiny_config)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("search")
    path = tmp / "search.toml"
    path.write_text(SEARCH)
    run_dir = tmp / "run"
    assert run_cli("search", "--config", path, "--candidates", 4, "--select", 2,
                   "--run-dir", run_dir, "--quiet") == 0
    return path, run_dir


def test_search_trains_the_sampled_candidates_and_records_them(searched):
    _, run_dir = searched
    seed, space = search_space.parse_space(SPACE)
    expected = search_space.sample(space, seed, 4)
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "completed" and manifest["search"]["candidates"] == 4
    table = pq.read_table(run_dir / "members.parquet").to_pandas()
    assert list(table.member) == [0, 1, 2, 3]
    for row, cand, m in zip(table.itertuples(), expected, manifest["members"]):
        assert list(row.hidden) == cand["hidden"] and row.activation == cand["activation"]
        assert row.dropout == cand["dropout"] and row.learning_rate == cand["learning_rate"]
        assert row.device == m["device"] and row.flops_per_row == m["flops_per_row"]
        # parameters of a 64-feature, 10-class MLP: weights and biases of every Dense layer
        widths = [64, *cand["hidden"], 10]
        assert row.parameters == sum(a * b + b for a, b in zip(widths, widths[1:]))
        assert row.train_seconds > 0
    weights = table.weight.to_numpy()
    assert weights.sum() == pytest.approx(1.0) and 1 <= (weights > 0).sum() <= 2
    # greedy's first pick is the candidate with the lowest validation NLL
    assert weights[int(np.argmin(table.val_nll))] > 0


def test_predict_applies_the_selection(searched, tmp_path):
    path, run_dir = searched
    weights = pq.read_table(run_dir / "members.parquet").column("weight").to_numpy()
    assert json.loads((run_dir / "aggregators.json").read_text())["aggregators"][0] == "greedy"
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", run_dir, "--data", "digits",
                   "--out", out, "--layout", "long") == 0
    t = pq.read_table(out).to_pandas()
    cols = [f"p_{c}" for c in range(10)]
    members = np.stack([t[t.model == f"member-{i}"][cols].to_numpy() for i in range(4)])
    greedy = t[t.model == "ensemble-greedy"][cols].to_numpy()
    assert np.abs(np.tensordot(weights, members, axes=1) - greedy).max() < 1e-5


def test_evaluate_shows_selection_against_references(searched, capsys):
    _, run_dir = searched
    assert run_cli("evaluate", "--run", run_dir) == 0
    out = capsys.readouterr().out
    assert "hyperparameter search: 4 candidates, greedy selection of at most 2" in out
    lines = out.splitlines()  # the comparison has the metrics' header, as the table above
    at = next(i for i, line in enumerate(lines) if line.startswith("hyperparameter search:"))
    assert lines[at + 1].split() == ["model", "accuracy", "nll", "brier", "ece"]
    assert "mean of first" in out and "best candidate (member-" in out


def test_resume_of_a_completed_search_with_other_flags_is_refused(searched, capsys):
    """`--resume` of a completed search kept the run but recorded the new flags (a 4-candidate
    run said '5 candidates'); other flags are one line, the same ones keep the run as it is."""
    path, run_dir = searched
    before = (run_dir / "manifest.json").read_text()
    assert run_cli("search", "--config", path, "--candidates", 5, "--select", 2,
                   "--run-dir", run_dir, "--resume", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "members.count: 4 -> 5" in err[0], err
    assert (run_dir / "manifest.json").read_text() == before
    assert run_cli("search", "--config", path, "--candidates", 4, "--select", 2,
                   "--run-dir", run_dir, "--resume", "--quiet") == 0
    assert json.loads((run_dir / "manifest.json").read_text())["search"]["candidates"] == 4


def test_stratify_retrains_the_selected_configurations_with_new_seeds(searched, tmp_path):
    path, _ = searched
    run_dir = tmp_path / "strat"
    assert run_cli("search", "--config", path, "--candidates", 4, "--select", 2,
                   "--stratify", 2, "--run-dir", run_dir, "--quiet") == 0
    cands = pq.read_table(run_dir / "candidates" / "members.parquet").to_pandas()
    strat = pq.read_table(run_dir / "members.parquet").to_pandas()
    chosen = sorted(cands.member[cands.weight > 0])
    assert list(strat.candidate) == [c for c in chosen for _ in range(2)]
    for row in strat.itertuples():
        src = cands.iloc[row.candidate]
        assert list(row.hidden) == list(src.hidden) and row.learning_rate == src.learning_rate
        assert row.seed not in set(cands.seed)
    assert strat.weight.sum() == pytest.approx(1.0)

    # killed in the stratified run: --resume keeps the finished candidates' run as it is
    # and finishes the stratified one (from its checkpoint) to the same predictions
    set_status(run_dir, "failed")
    cand_model = artifacts.member_model_path(run_dir / "candidates", 0)
    before = (cand_model.stat().st_mtime_ns, pq.read_table(run_dir / "predictions.parquet"))
    assert run_cli("search", "--config", path, "--candidates", 4, "--select", 2,
                   "--stratify", 2, "--run-dir", run_dir, "--quiet", "--resume") == 0
    assert cand_model.stat().st_mtime_ns == before[0]
    assert artifacts.read_manifest(run_dir)["status"] == "completed"
    assert pq.read_table(run_dir / "predictions.parquet").equals(before[1])

    # --overwrite while another process writes the run: refused, and nothing of it removed
    with runlock.Lock(run_dir, None, "ensemble evaluate"):
        token = os.environ.pop(runlock.ENV)  # the lock of another process, not a delegate's
        try:
            assert run_cli("search", "--config", path, "--candidates", 4, "--select", 2,
                           "--stratify", 2, "--run-dir", run_dir, "--quiet",
                           "--overwrite") == 2
        finally:
            os.environ[runlock.ENV] = token
    assert cand_model.stat().st_mtime_ns == before[0]
    assert pq.read_table(run_dir / "predictions.parquet").equals(before[1])
    # a good --overwrite replaces both runs; the old stratified run's files go, not the
    # candidates trained into its folder
    (run_dir / "stale.txt").write_text("of the old run")
    assert run_cli("search", "--config", path, "--candidates", 2, "--select", 1,
                   "--stratify", 1, "--run-dir", run_dir, "--quiet", "--overwrite") == 0
    assert not (run_dir / "stale.txt").exists()
    for d, n in ((run_dir, 1), (run_dir / "candidates", 2)):
        manifest = artifacts.read_manifest(d)
        assert manifest["status"] == "completed" and len(manifest["members"]) == n


def test_resume_of_a_search_that_is_not_there_is_refused(tmp_path, capsys):
    """A mistyped --run-dir with --resume started a fresh search; `train --resume` refuses it."""
    path = tmp_path / "search.toml"
    path.write_text(SEARCH)
    assert run_cli("search", "--config", path, "--candidates", 2, "--select", 1,
                   "--run-dir", tmp_path / "typo", "--resume", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Not a run directory (no manifest.json)" in err[0], err
    assert "nothing to resume" in err[0] and not (tmp_path / "typo").exists()


def test_a_flag_for_a_sampled_key_is_refused(tmp_path, capsys):
    """`--learning-rate 0.5` with `learning_rate` in [search] was recorded in the manifest
    while every candidate trained with its sampled rate."""
    path = tmp_path / "search.toml"
    path.write_text(SEARCH)
    for flag, words in ((["--learning-rate", "0.5"], "Expected no --learning-rate"),
                        (["--set", "members.hidden=[8]"], "Expected no --set members.hidden")):
        assert run_cli("search", "--config", path, "--candidates", 2, "--select", 1, *flag,
                       "--run-dir", tmp_path / "run", "--quiet") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and "[search] samples" in err[0], err
    assert not (tmp_path / "run").exists()
