"""`ensemble compare` building blocks (the full comparison is measured by the benchmark)."""

import tomllib

import numpy as np
import pyarrow as pa
import pytest

from ensemble.config import schema
from ensemble import tasks
from ensemble.tasks import tables
from ensemble.tasks.predicted import SplitPredictions
from pipelines import compare


def test_resolved_config_round_trips_through_toml():
    cfg = schema.load(overrides={"members.hidden": [8, 4], "data.synthetic.rows": 99})
    assert schema.from_dict(tomllib.loads(compare._to_toml(cfg.to_dict()))) == cfg


def _preds(p):
    return tables.predictions_table("test", SplitPredictions({0: p}, None, np.arange(len(p)), None),
                                    np.array([0, 1]), task=tasks.get())


def test_parity_figures():
    p = np.array([[0.9, 0.1], [0.4, 0.6], [0.5, 0.5]], np.float32)
    q = np.array([[0.8, 0.2], [0.6, 0.4], [0.5, 0.5]], np.float32)
    diff, same = compare.parity(_preds(p), _preds(q))
    assert diff == pytest.approx(0.2, abs=1e-6) and same == pytest.approx(2 / 3)


def test_concurrent_peak_counts_the_jobs_largest_clients():
    clients = [{"peak_rss_bytes": b} for b in (5, 9, 7)]
    assert compare.concurrent_peak(100, clients, 2) == 116
    assert compare.concurrent_peak(100, [], 1) == 100


def _runs(walls):
    """Runs rows `{(mode, phase): [wall seconds per repeat]}` as `compare` records them."""
    return [{"mode": m, "phase": ph, "wall_seconds": w, "startup_seconds": w / 4,
             "work_seconds": w * 3 / 4, "member_rows_per_second": 1.0, "peak_rss_bytes": 2**20,
             "test_accuracy": 0.9 if ph == "train" else None}
            for (m, ph), ws in walls.items() for w in ws]


PARITY = {"train": (0.0, 1.0), "predict": (0.0, 1.0)}


def test_verdict_names_the_faster_mode():
    rows = compare.summarise(_runs({("in-graph", "train"): [1.9, 2.1],
                                    ("in-graph", "predict"): [0.9, 1.1],
                                    ("between-graph", "train"): [5.8, 6.2],
                                    ("between-graph", "predict"): [0.45, 0.55]}), PARITY)
    text = compare.verdict(pa.Table.from_pylist(rows))
    assert "train: in-graph is 3.00x faster" in text
    assert "predict: between-graph is 2.00x faster" in text
    assert "parity on: the members' test probabilities agree" in text
    assert "parity max |dp| = 0.00e+00, identical labels 100.00%" in text
    assert text.splitlines()[0].endswith(" test accuracy")  # the metric's whole name
    assert text.splitlines()[1].endswith(" 0.9000")


def test_one_repeat_shows_the_sample_and_calls_no_mode_faster():
    rows = compare.summarise(_runs({("in-graph", "train"): [2.0], ("in-graph", "predict"): [1.0],
                                    ("between-graph", "train"): [6.0],
                                    ("between-graph", "predict"): [0.5]}), PARITY)
    text = compare.verdict(pa.Table.from_pylist(rows))
    assert "faster" not in text.replace("called faster", "")
    assert ("train: one sample per mode (in-graph 2.00 s, between-graph 6.00 s); one sample "
            "gives no spread") in text
    line = next(ln for ln in text.splitlines() if ln.startswith("in-graph       train"))
    assert "2.00" in line and "[" not in line  # the sample, not a median and a range
    assert "one sample per mode and phase (--repeats 1)" in text


def test_verdict_says_when_parity_is_off_or_not_met():
    walls = {(m, ph): [1.0, 1.2] for m in ("in-graph", "between-graph")
             for ph in ("train", "predict")}
    cfg = schema.load(overrides={"training.intra_op_threads": 0})
    assert compare.parity_setting(cfg).startswith("off: training.intra_op_threads = 0")
    assert compare.parity_setting(schema.load()) == "on"
    off = compare.summarise(_runs(walls), {"train": (3e-4, 1.0), "predict": (1e-4, 1.0)},
                            compare.parity_setting(cfg))
    text = compare.verdict(pa.Table.from_pylist(off))
    assert "parity off: training.intra_op_threads = 0" in text and "3.00e-04" in text
    unmet = compare.summarise(_runs(walls), {"train": (3e-4, 1.0), "predict": (1e-4, 1.0)})
    assert "parity on, but NOT met" in compare.verdict(pa.Table.from_pylist(unmet))


def test_train_parity_compares_the_members_test_rows_only():
    p = np.array([[0.9, 0.1], [0.4, 0.6]], np.float32)
    table = tables.predictions_table(
        "test", SplitPredictions({0: p, 1: p[::-1]}, None, np.arange(2), None), np.array([0, 1]),
        task=tasks.get())
    val = tables.predictions_table(
        "validation", SplitPredictions({0: 1 - p}, None, np.arange(2), None), np.array([0, 1]),
        task=tasks.get())
    mine = compare.members_test(pa.concat_tables([val, table]))
    assert mine.column("split").to_pylist() == ["test"] * 4
    assert mine.column("member").to_pylist() == [0, 0, 1, 1]


def test_verdict_says_no_clear_winner_within_the_spread():
    rows = compare.summarise(_runs({("in-graph", "train"): [2.0, 2.6, 3.1],
                                    ("between-graph", "train"): [3.0, 2.9, 4.0],
                                    ("in-graph", "predict"): [1.0, 1.2, 1.4],
                                    ("between-graph", "predict"): [2.0, 2.1, 2.2]}), PARITY)
    by = {(r["mode"], r["phase"]): r for r in rows}
    assert by["in-graph", "train"]["wall_seconds_median"] == 2.6
    assert (by["between-graph", "train"]["wall_seconds_min"],
            by["between-graph", "train"]["wall_seconds_max"]) == (2.9, 4.0)
    text = compare.verdict(pa.Table.from_pylist(rows))
    assert "train: no clear winner" in text and "within the spread of 3 repeats" in text
    assert "predict: in-graph is 1.75x faster" in text
    assert "in-graph start-up 0.30 s, predict and the rest 0.90 s" in text


def test_existing_folder_is_refused_without_overwrite(tmp_path, capsys):
    from conftest import run_cli

    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "comparison.parquet").write_text("earlier")
    assert run_cli("compare", "--run-dir", tmp_path / "cmp", "--data", "iris") == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "cmp" / "comparison.parquet").read_text() == "earlier"


def test_mode_order_alternates_between_repeats():
    assert [compare.mode_order(r) for r in range(3)] == [
        ("in-graph", "between-graph"), ("between-graph", "in-graph"),
        ("in-graph", "between-graph")]


def test_summary_is_median_min_max_over_repeats_rounded_as_printed():
    rows = compare.summarise(_runs({("in-graph", "train"): [2.004, 1.0, 3.0],
                                    ("in-graph", "predict"): [1.0, 1.0, 1.0],
                                    ("between-graph", "train"): [6.0, 5.0, 7.126],
                                    ("between-graph", "predict"): [0.5, 0.5, 0.5]}), PARITY)
    r = next(x for x in rows if x["mode"] == "between-graph" and x["phase"] == "train")
    assert (r["wall_seconds_median"], r["wall_seconds_min"], r["wall_seconds_max"]) == (
        6.0, 5.0, 7.13)
    r = next(x for x in rows if x["mode"] == "in-graph" and x["phase"] == "train")
    assert (r["wall_seconds_median"], r["repeats"]) == (2.0, 3)


def test_compare_end_to_end(tmp_path, capsys):
    """Both modes once on a real regression table whose unlabeled rows hold missing features
    (training drops them; predict would refuse them), each phase its own `ensemble` process:
    compare predicts the rows training used, reports the task's metrics, and the table holds
    exactly the figures of the runs it made and prints them (repeats and their order: the unit
    tests above; each repeat is four more processes)."""
    from sklearn.datasets import load_diabetes

    from conftest import run_cli

    from ensemble.core import artifacts

    frame = load_diabetes(as_frame=True).frame.astype("float64")
    frame.loc[frame.index[::10], "target"] = np.nan  # 45 rows without a label...
    frame.loc[frame.index[::20], "bmi"] = np.nan  # ...23 of which miss a feature
    frame.to_csv(tmp_path / "diabetes.csv", index=False)
    folder = tmp_path / "cmp"
    assert run_cli("compare", "--data", tmp_path / "diabetes.csv", "--task", "regression",
                   "--members", "2", "--epochs", "2", "--devices", "cpu:2", "--repeats", "1",
                   "--run-dir", folder) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "compare predicts the 397 rows" in captured.err
    assert artifacts.read_parquet(folder / "predict-input.parquet").num_rows == 397
    runs = artifacts.read_parquet(folder / "runs.parquet").to_pylist()
    summary = artifacts.read_parquet(folder / "comparison.parquet").to_pylist()
    assert len(runs) == 4 and len(summary) == 4
    assert [(r["mode"], r["phase"]) for r in runs] == [
        ("in-graph", "train"), ("in-graph", "predict"),
        ("between-graph", "train"), ("between-graph", "predict")]
    for s in summary:
        mine = [r for r in runs if r["mode"] == s["mode"] and r["phase"] == s["phase"]]
        assert len(mine) == 1 and s["repeats"] == 1
        wall = mine[0]["wall_seconds"]
        for stat in ("median", "min", "max"):
            assert s[f"wall_seconds_{stat}"] == pytest.approx(wall, abs=0.006)
        # start-up is on the critical path: never more than the wall time
        assert 0 < mine[0]["startup_seconds"] < wall
        line = next(ln for ln in printed.splitlines()
                    if ln.startswith(s["mode"] + " ") and f" {s['phase']} " in ln)
        assert f"{s['wall_seconds_median']:.2f}" in line
        if s["phase"] == "train":  # the task's metrics; wall = fixed + 2 x per epoch
            assert 0 < s["test_rmse"] < 200 and s["test_nll"] is not None
            r = mine[0]
            assert r["fixed_seconds"] + 2 * r["epoch_seconds"] == pytest.approx(wall)
            assert 0 < r["epoch_seconds"] < wall and r["train_rows"] == 277
            # 277 rows x 2 members x the 2 epochs each trained, per wall second
            assert r["member_rows_per_second"] == pytest.approx(277 * 2 * 2 / wall)
            assert f"{s['test_rmse']:.4f}" in line
    assert "test rmse" in printed.splitlines()[0]
    assert "train cost = fixed + epochs x per epoch" in printed
    assert summary[0]["parity_max_abs_diff"] <= 1e-6
    assert f"parity max |d| = {summary[0]['parity_max_abs_diff']:.2e}, equal predictions" \
        in printed  # regression's words: no probabilities, no labels
    assert "the members' test predictions agree within" in printed
    assert f"chart: {folder / 'comparison.png'}" in printed
    assert (folder / "comparison.png").stat().st_size > 0


def test_a_failed_phase_keeps_the_finished_runs_and_says_how_to_continue(tmp_path):
    from ensemble.core import artifacts
    from ensemble.core.errors import UsageError

    (tmp_path / "in-graph").mkdir()
    (tmp_path / "in-graph" / artifacts.MANIFEST).write_text("{}")
    runs = _runs({("in-graph", "train"): [2.0], ("in-graph", "predict"): [1.0]})
    with pytest.raises(UsageError) as err:
        with compare._keeping(runs, tmp_path, ["in-graph", "between-graph"], "data.csv"):
            raise UsageError("between-graph training failed (exit 2): error: bad thing")
    text = str(err.value)
    assert text.startswith("between-graph training failed (exit 2): error: bad thing Kept: "
                           f"2 finished phases in {tmp_path / 'runs.parquet'}")
    assert f"ensemble predict --run {tmp_path / 'in-graph'} --data data.csv" in text
    assert "run the same `ensemble compare` with --overwrite" in text
    kept = artifacts.read_parquet(tmp_path / "runs.parquet").to_pylist()
    assert [(r["mode"], r["phase"]) for r in kept] == [("in-graph", "train"),
                                                         ("in-graph", "predict")]


def test_test_metrics_are_the_tasks_on_the_default_aggregator(tmp_path):
    from ensemble.core import artifacts
    from ensemble.core.manifest import Manifest

    manifest = Manifest(task="classification", config={"aggregation": {
        "aggregators": ["vote", "mean"]}})
    rows = [{"model": m, "split": sp, "accuracy": acc, "nll": nll}
            for m, sp, acc, nll in (("ensemble-vote", "test", 0.5, None),
                                    ("ensemble-vote", "validation", 0.4, None),
                                    ("member-0", "test", 0.7, 0.6))]
    artifacts.write_parquet(tmp_path / artifacts.METRICS, pa.Table.from_pylist(rows))
    assert compare.test_metrics(tmp_path, manifest) == {"test_nll": None, "test_accuracy": 0.5}
    manifest.task = "regression"
    assert compare.test_metrics(tmp_path, manifest) == {"test_nll": None, "test_rmse": None}


def _cost_runs(costs, epochs=3, n_train=1000):
    """Train rows `{mode: [(fixed, per epoch) per repeat]}` (wall = fixed + epochs x per
    epoch) and one predict row per repeat, as `compare` records them."""
    from pipelines import compare_cost as cost

    runs = []
    for mode, pairs in costs.items():
        for fixed, per in pairs:
            wall = fixed + epochs * per
            runs += _runs({(mode, "train"): [wall]})
            runs[-1].update(epochs=epochs, train_rows=n_train,
                            **cost.split_cost(wall, per, epochs, n_train))
            runs += _runs({(mode, "predict"): [1.0]})
    return runs


def test_crossover_is_where_fixed_plus_epochs_times_per_epoch_meet():
    from pipelines import compare_cost as cost

    # in-graph: 2 s + 1 s/epoch; between-graph: 6 s + 0.5 s/epoch: equal at 8 epochs
    assert cost.crossover(2.0, 1.0, 6.0, 0.5) == pytest.approx(8.0)
    assert cost.crossover(6.0, 0.5, 2.0, 1.0) == pytest.approx(8.0)
    assert cost.crossover(2.0, 0.5, 6.0, 1.0) is None  # in-graph cheaper in both parts
    assert cost.crossover(2.0, 1.0, 6.0, 1.0) is None  # parallel lines


def test_verdict_flips_with_the_epoch_count_and_says_it_rests_on_fixed_costs():
    """Built so the faster mode changes with the epochs: at the 3 epochs trained in-graph
    wins on its lower fixed cost (5 s vs 7.5 s), from 9 epochs on between-graph wins on its
    lower per-epoch cost; per row, between-graph's epoch costs 500 us against 1,000 us, so at
    3 epochs it wins from 2,667 training rows (2 + 3n/1000 = 6 + 1.5n/1000)."""
    runs = _cost_runs({"in-graph": [(1.9, 1.1), (2.0, 1.0), (2.1, 0.9)],
                       "between-graph": [(5.8, 0.55), (6.0, 0.5), (6.2, 0.45)]})
    rows = compare.summarise(runs, PARITY)
    by = {(r["mode"], r["phase"]): r for r in rows}
    ig, bg = by["in-graph", "train"], by["between-graph", "train"]
    assert (ig["fixed_seconds_median"], ig["epoch_seconds_median"]) == (2.0, 1.0)
    assert (ig["fixed_seconds_min"], ig["fixed_seconds_max"]) == (1.9, 2.1)
    assert (bg["fixed_seconds_median"], bg["epoch_seconds_median"]) == (6.0, 0.5)
    assert (ig["row_epoch_us_median"], bg["row_epoch_us_median"]) == (1000.0, 500.0)
    assert by["in-graph", "predict"]["fixed_seconds_median"] is None
    text = compare.verdict(pa.Table.from_pylist(rows))
    assert "train: in-graph is 1.50x faster over the 3 epochs trained" in text
    assert "at 3 epochs (as trained): in-graph 5.00 s against between-graph 7.50 s" in text
    assert ("the faster mode changes at 8.0 epochs: in-graph below, between-graph from 9 "
            "epochs on") in text
    assert "the verdict rests on fixed costs: per epoch between-graph is faster" in text
    assert "from about 2,667 training rows" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("  in-graph "))
    assert "fixed 2.00 [1.90-2.10] s, per epoch 1.0000 [0.9000-1.1000] s" in line
    assert "1.00 ms per training row" in line


def test_verdict_without_crossover_names_one_mode_at_every_count():
    runs = _cost_runs({"in-graph": [(2.0, 0.5)] * 2, "between-graph": [(6.0, 1.0)] * 2})
    text = compare.verdict(pa.Table.from_pylist(compare.summarise(runs, PARITY)))
    assert "does not change with the epoch count: in-graph at every count" in text
    assert "rests on fixed costs" not in text and "level within the spread" not in text
    runs = _cost_runs({"in-graph": [(2.0, 0.5), (2.0, 0.7)],
                       "between-graph": [(6.0, 0.6), (6.0, 0.8)]})
    text = compare.verdict(pa.Table.from_pylist(compare.summarise(runs, PARITY)))
    assert "per epoch the two modes are level within the spread of 2 repeats" in text


def test_epoch_cost_from_history_in_both_modes():
    """In-graph: the median epoch after the first (which pays for tracing); between-graph: per
    client the sum of its members' epochs, the slowest client; one epoch: the steady rate."""
    from ensemble.runs.builtin_modes import get
    from pipelines import compare_cost as cost

    hist = [{"member": m, "epoch": e, "seconds": s} for m in (0, 1)
            for e, s in enumerate((5.0, 1.0, 1.2, 0.8))]
    assert cost.epoch_seconds(get("in-graph"), hist, {}, 100) == (1.0, 4)
    between = [{"member": m, "epoch": e, "seconds": s * (m + 1)} for m in (0, 1, 2)
               for e, s in enumerate((5.0, 1.0, 1.0))]
    clients = {"0": {"client": 0}, "1": {"client": 0}, "2": {"client": 1}}
    # client 0 trains members 0 and 1 (1 + 2 s per epoch), client 1 member 2 (3 s)
    assert cost.epoch_seconds(get("between-graph"), between, {"clients": clients},
                              100) == (3.0, 3)
    clients["2"]["client"] = 0
    assert cost.epoch_seconds(get("between-graph"), between, {"clients": clients},
                              100) == (6.0, 3)
    one = [{"member": 0, "epoch": 0, "seconds": 9.0}]
    # one epoch: nothing past the first measured (a steady call's rate was reported instead)
    assert cost.epoch_seconds(get("in-graph"), one, {"steady_rows": 50, "steady_seconds": 0.5},
                              100) == (None, 1)
    assert cost.epoch_seconds(get("between-graph"), one, {"clients": {"0": {
        "client": 0, "steady": {"0": [50, 0.5]}}}}, 100) == (None, 1)
    assert cost.split_cost(10.0, 2.0, 3, 1000) == {"fixed_seconds": 4.0, "epoch_seconds": 2.0,
                                                    "row_epoch_us": 2000.0}


def test_one_epoch_reports_no_per_epoch_cost_and_no_crossover():
    """`--epochs 1`: the per-epoch cost was a steady call's rate times the rows, not a measured
    epoch; now n/a, no fixed/per-epoch split, no crossover, and the text suggests --epochs 2."""
    from ensemble.runs.builtin_modes import get
    from pipelines import compare_cost as cost

    one = [{"member": 0, "epoch": 0, "seconds": 9.0}]
    timings = {"steady_rows": 50, "steady_seconds": 0.5}
    runs = []
    for mode, wall in (("in-graph", 10.0), ("between-graph", 12.0)):
        for _ in range(3):
            per, epochs = cost.epoch_seconds(get(mode), one, timings, 1000)
            runs += _runs({(mode, "train"): [wall]})
            runs[-1].update(epochs=epochs, train_rows=1000,
                            **cost.split_cost(wall, per, epochs, 1000))
            runs += _runs({(mode, "predict"): [1.0]})
    rows = compare.summarise(runs, PARITY)
    train = [r for r in rows if r["phase"] == "train"]
    assert all(r["epoch_seconds_median"] is None and r["fixed_seconds_median"] is None
               for r in train)
    assert cost.crossover_band(*train) is None
    text = compare.verdict(pa.Table.from_pylist(rows))
    assert ("train cost per epoch: n/a, not measured with --epochs 1 (the one epoch also pays "
            "for tracing): no fixed and per-epoch split, no crossover; --epochs 2 or more "
            "measures it") in text
    assert "per epoch 0." not in text and "the faster mode" not in text


def test_compare_with_one_epoch_says_so_before_it_runs(tmp_path, monkeypatch, capsys):
    def stop(*args):
        raise RuntimeError("stopped before any process")

    monkeypatch.setattr(compare, "labelled_rows", stop)
    cfg = schema.load(overrides={"data.source": "iris", "training.epochs": 1})
    with pytest.raises(RuntimeError):
        compare.compare(cfg, tmp_path / "cmp")
    assert ("--epochs 1: compare measures no per-epoch train cost (n/a) and no crossover "
            "epoch count; --epochs 2 or more measures them") in capsys.readouterr().err


def test_one_repeat_calls_the_cost_model_indicative():
    """With --repeats 1 the verdict says no mode is called faster; the crossover line said
    "in-graph at every count" as if it were one, and now says it is indicative."""
    runs = _cost_runs({"in-graph": [(2.0, 0.5)], "between-graph": [(6.0, 1.0)]})
    text = compare.verdict(pa.Table.from_pylist(compare.summarise(runs, PARITY)))
    assert ("does not change with the epoch count: in-graph at every count (one sample of "
            "each: indicative, no verdict)") in text


def _band_rows(costs):
    """The two train summary rows of `_cost_runs(costs)`."""
    rows = compare.summarise(_cost_runs(costs), PARITY)
    by = {(r["mode"], r["phase"]): r for r in rows}
    return by["in-graph", "train"], by["between-graph", "train"], rows


def test_crossover_band_is_the_range_the_spreads_allow():
    from itertools import product

    from pipelines import compare_cost as cost

    ig, bg, _ = _band_rows({"in-graph": [(1.9, 1.1), (2.0, 1.0), (2.1, 0.9)],
                            "between-graph": [(5.8, 0.55), (6.0, 0.5), (6.2, 0.45)]})
    band = cost.crossover_band(ig, bg)
    # by hand: earliest with the closest fixed costs (5.8 - 2.1) over the widest per-epoch
    # gap (1.1 - 0.45), latest with the farthest (6.2 - 1.9) over the narrowest (0.9 - 0.55)
    assert band["epochs"] == pytest.approx(8.0)
    assert band["low"] == pytest.approx(3.7 / 0.65) and band["high"] == pytest.approx(4.3 / 0.35)
    assert not band["uncertain"] and band["word"] is None
    # and by brute force over a grid of the four ranges
    grid = [np.linspace(lo, hi, 7) for lo, hi in ((1.9, 2.1), (0.9, 1.1), (5.8, 6.2),
                                                  (0.45, 0.55))]
    es = [(fb - fa) / (pa - pb) for fa, pa, fb, pb in product(*grid)]
    assert (min(es), max(es)) == pytest.approx((band["low"], band["high"]))


def test_crossover_band_unbounded_or_reaching_zero_is_uncertain():
    from pipelines import compare_cost as cost

    # per epoch level within the spread (0.5-0.7 against 0.6-0.8), fixed 2 against 6: the
    # lines may be parallel, so from 4 / (0.7 - 0.6) = 40 epochs on with no upper bound; the
    # medians' lines (0.6 against 0.7) do not cross
    ig, bg, rows = _band_rows({"in-graph": [(2.0, 0.5), (2.0, 0.7)],
                               "between-graph": [(6.0, 0.6), (6.0, 0.8)]})
    band = cost.crossover_band(ig, bg)
    assert band["epochs"] is None and band["low"] == pytest.approx(40.0)
    assert band["high"] == float("inf") and band["word"] == "uncertain"
    text = compare.verdict(pa.Table.from_pylist(rows))
    assert ("the spreads (min-max) of 2 repeats allow a crossover from 40.0 epochs on "
            "(uncertain)") in text  # the medians' lines do not cross: not "put the crossover"
    assert "in-graph at every count (with the medians)" in text
    assert "level within the spread of 2 repeats: it may change" in text
    # fixed costs level (2-5 against 4-6), per epoch apart (1.0-1.1 against 0.5): the
    # crossover may be anywhere from 0 to (6 - 2) / (1.0 - 0.5) = 8 epochs
    ig, bg, _ = _band_rows({"in-graph": [(2.0, 1.0), (5.0, 1.1)],
                            "between-graph": [(4.0, 0.5), (6.0, 0.5)]})
    band = cost.crossover_band(ig, bg)
    assert (band["low"], band["high"]) == (0.0, pytest.approx(8.0)) and band["uncertain"]


def test_chart_draws_an_uncertain_crossover_dashed_over_its_band():
    """The cost panel drew every crossover as one firm line, even with one repeat (which the
    text calls indicative) or with overlapping spreads."""
    from pipelines import compare_chart

    class Axes:  # records what the panel draws
        def __init__(self):
            self.calls = []

        def __getattr__(self, name):
            return lambda *a, **k: self.calls.append((name, a, k))

    def drawn(costs):
        ax = Axes()
        compare_chart._lines(ax, _band_rows(costs)[2], 3)
        return ({k["label"]: (a, k.get("linestyle")) for n, a, k in ax.calls
                 if n in ("axvline", "axvspan")})

    one = drawn({"in-graph": [(2.0, 1.0)], "between-graph": [(6.0, 0.5)]})
    assert one["crossover (8.0, indicative: one sample)"] == ((pytest.approx(8.0),), "--")
    assert not any(label.startswith("crossover range") for label in one)
    sure = drawn({"in-graph": [(1.9, 1.1), (2.0, 1.0), (2.1, 0.9)],
                  "between-graph": [(5.8, 0.55), (6.0, 0.5), (6.2, 0.45)]})
    assert sure["crossover (8.0)"] == ((pytest.approx(8.0),), "-")
    span = next(a for label, (a, _) in sure.items() if label.startswith("crossover range"))
    assert span == pytest.approx((3.7 / 0.65, 4.3 / 0.35))
    level = drawn({"in-graph": [(2.0, 0.5), (2.0, 0.7)],
                   "between-graph": [(6.0, 0.6), (6.0, 0.8)]})
    # no median crossover; the band from 40 epochs runs to the panel's edge (1.2 x 40 = 48)
    assert list(level) == ["configured (3)",
                           "crossover range the spreads allow (40.0 to no upper bound)"]
    assert level["crossover range the spreads allow (40.0 to no upper bound)"][0] == \
        pytest.approx((40.0, 48.0))


def test_compare_with_auto_epochs_starts_without_the_one_epoch_notice(tmp_path, monkeypatch,
                                                                       capsys):
    """`training.epochs = "auto"` (the default) is resolved by each run from its training rows:
    compare starts (no comparison of "auto" with a number) and says nothing of one epoch."""
    def stop(*args):
        raise RuntimeError("stopped before any process")

    monkeypatch.setattr(compare, "labelled_rows", stop)
    cfg = schema.load(overrides={"data.source": "iris"})
    assert cfg.training.epochs == "auto"
    with pytest.raises(RuntimeError, match="stopped before any process"):
        compare.compare(cfg, tmp_path / "cmp")
    assert "--epochs 1" not in capsys.readouterr().err
