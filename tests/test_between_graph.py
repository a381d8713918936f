"""Between-graph replication: parity with in-graph, --jobs invariance, standalone clients and
the aggregator. Clients are real separate processes."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli

from ensemble import tasks
from ensemble.core import artifacts
from ensemble.models.members import load_member


def _train(tmp, tiny_config, name, *extra):
    run_dir = tmp / name
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir, *extra) == 0
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_config):
    tmp = tmp_path_factory.mktemp("bg")
    return {
        "in-graph": _train(tmp, tiny_config, "ig"),
        "jobs2": _train(tmp, tiny_config, "bg2", "--mode", "between-graph", "--jobs", "2"),
        "jobs1": _train(tmp, tiny_config, "bg1", "--mode", "between-graph", "--jobs", "1"),
    }


def _table(run_dir, name="predictions.parquet"):
    return pq.read_table(run_dir / name)


def _probs(table):
    return np.column_stack([table.column(f"p_{c}").to_numpy() for c in range(10)])


def test_same_layout_and_schema_as_in_graph(runs):
    ig, bg = runs["in-graph"], runs["jobs2"]
    top = {p.name for p in ig.iterdir()}
    assert top <= {p.name for p in bg.iterdir()}
    for name in ("predictions.parquet", "metrics.parquet", "history.parquet"):
        assert _table(ig, name).schema == _table(bg, name).schema
    assert (bg / "members" / "member-3.predictions.parquet").is_file()
    manifest = artifacts.read_manifest(bg)
    assert manifest["status"] == "completed" and manifest["mode"] == "between-graph"
    assert [m["status"] for m in manifest["members"]] == ["completed"] * 4


def test_mode_parity(runs):
    ig, bg = _table(runs["in-graph"]), _table(runs["jobs2"])
    assert ig.column("model").to_pylist() == bg.column("model").to_pylist()
    assert ig.column("y_pred").to_pylist() == bg.column("y_pred").to_pylist()
    assert np.abs(_probs(ig) - _probs(bg)).max() <= 1e-5
    m_ig = _table(runs["in-graph"], "metrics.parquet").to_pandas()
    m_bg = _table(runs["jobs2"], "metrics.parquet").to_pandas()
    cols = ["accuracy", "nll", "brier", "ece", "disagreement"]
    np.testing.assert_allclose(m_ig[cols].to_numpy(float), m_bg[cols].to_numpy(float), atol=1e-5)
    # the members really were trained: not the same across members
    test = m_ig[m_ig.split == "test"]
    test = test[test.model != "prior"]  # the baseline row
    assert test[test.aggregator != "vote"].nll.nunique() == 5  # vote shares: null NLL
    assert test[test.aggregator == "vote"].nll.isna().all()


def test_both_modes_record_the_same_kernels(runs):
    """Whether oneDNN's kernels ran is recorded in the manifest (`tensorflow_build.onednn`),
    and the clients inherit the launcher's choice (`TF_ENABLE_ONEDNN_OPTS`)."""
    builds = [artifacts.read_manifest(runs[r])["tensorflow_build"] for r in ("in-graph", "jobs2")]
    assert builds[0].get("onednn") == builds[1].get("onednn")
    assert isinstance(builds[0].get("onednn"), bool)


def test_jobs_1_and_2_give_identical_artifacts(runs):
    a, b = runs["jobs1"], runs["jobs2"]
    assert _table(a).equals(_table(b))
    assert _table(a, "metrics.parquet").equals(_table(b, "metrics.parquet"))
    ha, hb = _table(a, "history.parquet"), _table(b, "history.parquet")
    assert ha.drop_columns(["seconds"]).equals(hb.drop_columns(["seconds"]))
    for i in range(4):
        wa = load_member(artifacts.member_model_path(a, i), "/device:CPU:0").get_weights()
        wb = load_member(artifacts.member_model_path(b, i), "/device:CPU:0").get_weights()
        assert all(np.array_equal(x, y) for x, y in zip(wa, wb))


def test_standalone_clients_then_aggregate(runs, tiny_config, tmp_path):
    run_dir = tmp_path / "standalone"
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir,
                   "--mode", "between-graph", "--prepare-only") == 0
    assert not (run_dir / "predictions.parquet").exists()
    clients = [subprocess.Popen([sys.executable, "-m", "pipelines.cli", "client", "--run",
                                 str(run_dir), "--member", str(i), "--threads", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for i in range(4)]  # started independently, as a scheduler would
    assert [c.wait(timeout=300) for c in clients] == [0] * 4
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "aggregate", "--run",
                          str(run_dir)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for name in ("predictions.parquet", "metrics.parquet"):
        assert _table(run_dir, name).equals(_table(runs["jobs2"], name))


def test_aggregator_refuses_missing_member(runs, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(runs["jobs2"], run_dir)
    before = (run_dir / "predictions.parquet").read_bytes()
    (run_dir / "members" / "member-2.predictions.parquet").unlink()
    assert run_cli("aggregate", "--run", run_dir) == 2
    err = capsys.readouterr().err
    assert "member-2.predictions.parquet" in err and len(err.strip().splitlines()) == 1
    assert (run_dir / "predictions.parquet").read_bytes() == before


def test_member_alone_equals_member_of_ensemble_in_both_modes(runs, tiny_config, tmp_path):
    # a between-graph member is trained alone by construction (its own client process);
    # here a 1-member in-graph run is compared with member 0 of both 4-member runs
    alone = _train(tmp_path, tiny_config, "alone", "--members", "1")
    p_alone = _table(alone).to_pandas()
    for mode in ("in-graph", "jobs2"):
        p_full = _table(runs[mode]).to_pandas()
        a = p_alone[p_alone.model == "member-0"]
        f = p_full[p_full.model == "member-0"]
        assert np.abs(a.filter(like="p_").to_numpy() - f.filter(like="p_").to_numpy()).max() \
            <= 1e-5


def test_predict_between_graph_equals_in_graph(runs, tmp_path):
    outs = {}
    for mode in ("in-graph", "between-graph"):
        outs[mode] = tmp_path / f"{mode}.parquet"
        assert run_cli("predict", "--run", runs["jobs2"], "--data", "digits",
                       "--mode", mode, "--out", outs[mode], "--layout", "long") == 0
    a, b = pq.read_table(outs["in-graph"]), pq.read_table(outs["between-graph"])
    assert a.schema == b.schema and a.num_rows == b.num_rows == 1797 * 6
    assert a.column("y_pred").to_pylist() == b.column("y_pred").to_pylist()
    assert np.abs(_probs(a) - _probs(b)).max() <= 1e-5


ALL_AGGREGATORS = "mean,vote,geometric,weighted,greedy,stacking,temperature"


@pytest.fixture(scope="module")
def aggregated(runs, tmp_path_factory):
    """Copies of both modes' runs, re-aggregated with every aggregator by `ensemble aggregate`
    in a fresh process that reports whether TensorFlow was imported."""
    tmp = tmp_path_factory.mktemp("agg")
    out = {}
    for mode, name in (("in-graph", "in-graph"), ("between-graph", "jobs2")):
        run_dir = tmp / mode
        shutil.copytree(runs[name], run_dir)
        code = ("import sys; from pipelines.cli import main; "
                f"rc = main(['aggregate', '--run', {str(run_dir)!r}, '--aggregators', "
                f"{ALL_AGGREGATORS!r}]); print('TF', 'tensorflow' in sys.modules); sys.exit(rc)")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip().endswith("TF False")  # no TensorFlow in the aggregator
        out[mode] = run_dir
    return out


def test_aggregate_gives_the_same_table_in_both_modes(aggregated):
    ig, bg = _table(aggregated["in-graph"]), _table(aggregated["between-graph"])
    models = set(ig.column("model").to_pylist())
    assert {f"ensemble-{a}" for a in ALL_AGGREGATORS.split(",")} <= models
    assert ig.column("model").to_pylist() == bg.column("model").to_pylist()
    assert np.abs(_probs(ig) - _probs(bg)).max() <= 1e-5
    fits = [json.loads((aggregated[m] / "aggregators.json").read_text()) for m in aggregated]
    assert fits[0]["aggregators"] == ALL_AGGREGATORS.split(",")
    assert fits[0]["best_member"] == fits[1]["best_member"]
    for name in ("weighted", "greedy"):
        np.testing.assert_allclose(fits[0]["params"][name]["weights"],
                                   fits[1]["params"][name]["weights"], atol=1e-3)
    curve = _table(aggregated["in-graph"], "ensemble_size.parquet").to_pandas()
    metrics = _table(aggregated["in-graph"], "metrics.parquet").to_pandas()
    first = curve[(curve.order == "first") & (curve.split == "test")].set_index("k")
    test = metrics[metrics.split == "test"].set_index("model")
    assert first.loc[1, "nll"] == pytest.approx(test.loc["member-0", "nll"], abs=1e-6)
    assert first.loc[4, "nll"] == pytest.approx(test.loc["ensemble-mean", "nll"], abs=1e-6)


def test_predict_applies_the_fitted_aggregators_in_both_modes(aggregated, tmp_path):
    from sklearn.datasets import load_digits

    for mode, run_dir in aggregated.items():
        preds = _table(run_dir).to_pandas()
        test = preds[preds.split == "test"]
        rows = test[test.model == "member-0"].sort_values("row").source_row.to_numpy()
        digits = load_digits()
        data = {"target": digits.target[rows],
                **{n: digits.data[rows, i] for i, n in enumerate(digits.feature_names)}}
        src = tmp_path / f"{mode}-test.parquet"
        pq.write_table(pa.table(data), src)
        out = tmp_path / f"{mode}-pred.parquet"
        assert run_cli("predict", "--run", run_dir, "--data", src, "--mode", mode,
                       "--out", out, "--layout", "long") == 0
        got = pq.read_table(out).to_pandas()
        for model in test.model.unique():
            e = test[test.model == model].sort_values("row").filter(like="p_").to_numpy()
            g = got[got.model == model].sort_values("row").filter(like="p_").to_numpy()
            assert np.abs(e - g).max() <= 1e-6, (mode, model)


def test_split_depends_on_split_seed_only(tiny_config, tmp_path):
    from ensemble.config import schema
    from ensemble.replication.modes import TrainRequest
    from ensemble.runs.builtin_modes import InGraph
    from ensemble.runs import prepare

    rows = []
    for seed in (0, 7):
        cfg = schema.load(tiny_config, overrides={"training.seed": seed})
        prepare.prepare(TrainRequest(cfg, tmp_path / f"s{seed}"), InGraph(),
                        ["/device:CPU:0"])
        rows.append(artifacts.read_split(tmp_path / f"s{seed}", "test")[2])
    assert np.array_equal(rows[0], rows[1])
    cfg = schema.load(tiny_config, overrides={"data.split_seed": 1})
    prepare.prepare(TrainRequest(cfg, tmp_path / "other"), InGraph(), ["/device:CPU:0"])
    assert not np.array_equal(rows[0], artifacts.read_split(tmp_path / "other", "test")[2])


def test_member_predictions_by_row_chunks_equal_the_whole_table(runs, monkeypatch):
    # a client writes its member's prediction rows a chunk at a time as it predicts them;
    # the file holds what one whole `predictions_table` of each split holds, bit for bit
    from ensemble.core.manifest import Manifest
    from ensemble.replication import group as G
    from ensemble.replication.client_work import MemberWork, prediction_chunks
    from ensemble.models.members import load_run_member
    from ensemble.config import schema
    from ensemble.tasks import tables
    from ensemble.tasks.predicted import SplitPredictions

    run_dir = runs["jobs2"]
    manifest = Manifest.load(run_dir)
    work = MemberWork.open(run_dir, manifest, schema.from_dict(manifest.config))
    classes = np.asarray(manifest.dataset.classes)
    member = G.MemberGroup([load_run_member(run_dir, manifest, 1, "/cpu:0")], ["/cpu:0"], [1],
                           task=tasks.for_run(manifest))

    def whole():
        return pa.concat_tables([tables.predictions_table(s, SplitPredictions(
            {1: member.predict(work.split[s][0])[0][0]}, None, work.split[s][2],
            work.split[s][1]), classes, task=member.task) for s in artifacts.EVAL_SPLITS])

    written = pq.read_table(artifacts.member_predictions_path(run_dir, 1))
    assert written.equals(whole()) and written.schema.metadata == whole().schema.metadata
    monkeypatch.setattr(G, "PREDICT_ROWS", 7)  # several calls, several chunks per split
    parts = list(prediction_chunks(member, 1, work.split, classes, chunk_rows=15))
    n_eval = sum(len(work.split[s][0]) for s in artifacts.EVAL_SPLITS)
    assert len(parts) >= n_eval // 14 and max(len(p) for p in parts) == 14
    assert pa.concat_tables(parts).equals(whole())
