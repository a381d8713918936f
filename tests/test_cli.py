"""End to end through the CLI: in-graph train, predict (CSV and Parquet), evaluate, errors."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from conftest import run_cli
from sklearn.datasets import load_digits

from ensemble.core import artifacts

PRED_COLUMNS = ["model", "member", "aggregator", "split", "row", "y_true", "y_pred"]
METRIC_COLUMNS = ["model", "member", "aggregator", "split", "n", "accuracy", "nll", "brier", "ece"]


@pytest.fixture(scope="module")
def in_graph_run(tmp_path_factory, tiny_config):
    run_dir = tmp_path_factory.mktemp("runs") / "in-graph"
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir) == 0
    return run_dir


def _probs(table, classes=range(10)):
    return np.column_stack([table.column(f"p_{c}").to_numpy() for c in classes])


def test_manifest_records_placement_and_hashes(in_graph_run):
    manifest = json.loads((in_graph_run / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["mode"] == "in-graph"
    devices = [m["device"] for m in manifest["members"]]
    assert devices == ["/device:CPU:0", "/device:CPU:1", "/device:CPU:0", "/device:CPU:1"]
    assert manifest["dataset"]["rows"] == {"train": 1257, "validation": 180, "test": 360}
    for rel, digest in manifest["artifacts"].items():
        assert artifacts.sha256_file(in_graph_run / rel) == digest
    for name in ("predictions.parquet", "metrics.parquet", "history.parquet",
                 "preprocessing.json", "members/member-3.keras"):
        assert name in manifest["artifacts"]
    assert not list(in_graph_run.rglob(".*.tmp"))


def test_parquet_artifacts_open_in_pyarrow_pandas_duckdb(in_graph_run):
    duckdb = pytest.importorskip("duckdb")
    preds = pq.read_table(in_graph_run / "predictions.parquet")
    assert preds.column_names[:7] == PRED_COLUMNS
    assert preds.schema.field("member").type == pa.int32()
    assert preds.schema.field("row").type == pa.int64()
    assert json.loads(preds.schema.metadata[b"classes"]) == list(range(10))
    assert set(preds.column("model").to_pylist()) == {
        "member-0", "member-1", "member-2", "member-3", "ensemble-mean", "ensemble-vote"}
    np.testing.assert_allclose(_probs(preds).sum(axis=1), 1.0, atol=1e-5)
    frame = pq.read_table(in_graph_run / "metrics.parquet").to_pandas()
    assert list(frame.columns[:9]) == METRIC_COLUMNS
    con = duckdb.connect()
    n = con.execute(f"select count(*) from '{in_graph_run / 'predictions.parquet'}' "
                    "where model = 'ensemble-mean' and split = 'test'").fetchone()[0]
    assert n == 360
    hist = pq.read_table(in_graph_run / "history.parquet")
    assert hist.num_rows == 4 * 2
    assert hist.column_names == ["member", "epoch", "loss", "val_loss", "val_accuracy", "seconds"]


def _independent_metrics(y, p):
    """Every metric from its definition in docs/reference/run-directory.md, written out with numpy
    loops."""
    top = p.max(axis=1)
    correct = p.argmax(axis=1) == y
    ece = 0.0
    for b in range(15):
        in_bin = np.minimum(np.floor(15 * top), 14) == b
        if in_bin.any():
            ece += in_bin.mean() * abs(correct[in_bin].mean() - top[in_bin].mean())
    onehot = np.eye(p.shape[1])[y]
    return {"accuracy": correct.mean(),
            "nll": -np.mean(np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None))),
            "brier": np.mean(((p - onehot) ** 2).sum(axis=1)), "ece": ece}


def test_metrics_recomputed_from_predictions_match(in_graph_run):
    preds = pq.read_table(in_graph_run / "predictions.parquet").to_pandas()
    metrics = pq.read_table(in_graph_run / "metrics.parquet").to_pandas()
    assert len(metrics) == 6 * 2 + 2  # and a prior row per split
    from ensemble.core import artifacts

    y_train = np.asarray(artifacts.read_split(in_graph_run, "train")[1])
    shares = np.bincount(y_train, minlength=10) / len(y_train)
    for _, row in metrics[metrics.model == "prior"].iterrows():
        part = preds[(preds.model == "member-0") & (preds.split == row.split)]
        y = part.y_true.to_numpy()
        expected = _independent_metrics(y, np.tile(shares.astype(np.float32), (len(y), 1)))
        assert abs(row["nll"] - expected["nll"]) <= 1e-6 and row["roc_auc"] == 0.5
    for _, row in metrics[metrics.model != "prior"].iterrows():
        part = preds[(preds.model == row.model) & (preds.split == row.split)]
        p = part[[f"p_{c}" for c in range(10)]].to_numpy(np.float64)
        expected = _independent_metrics(part.y_true.to_numpy(), p)
        assert row.n == len(part)
        for name, value in expected.items():
            if row.aggregator == "vote" and name != "accuracy":  # vote shares: no NLL etc.
                assert np.isnan(row[name]), (row.model, name)
                continue
            assert abs(row[name] - value) <= 1e-6, (row.model, row.split, name)


def _test_rows_file(run_dir, tmp_path, ext):
    """The digits test rows, columns in reversed order, target included, as CSV or Parquet."""
    preds = pq.read_table(run_dir / "predictions.parquet").to_pandas()
    test = preds[(preds.split == "test") & (preds.model == "ensemble-mean")].sort_values("row")
    digits = load_digits()
    rows = test.source_row.to_numpy()
    cols = {"target": digits.target[rows]}
    cols.update({n: digits.data[rows, i] for i, n in enumerate(digits.feature_names)})
    table = pa.table(dict(reversed(list(cols.items()))))
    path = tmp_path / f"test-rows.{ext}"
    (pcsv.write_csv if ext == "csv" else pq.write_table)(table, path)
    return path, preds[preds.split == "test"]


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_predict_matches_run_test_predictions(in_graph_run, tmp_path, ext):
    path, expected = _test_rows_file(in_graph_run, tmp_path, ext)
    out = tmp_path / "pred.parquet"
    assert run_cli("predict", "--run", in_graph_run, "--data", path, "--out", out,
                   "--layout", "long") == 0
    got = pq.read_table(out).to_pandas()
    assert set(got.split) == {"predict"}
    for model in expected.model.unique():
        e = expected[expected.model == model].sort_values("row")
        g = got[got.model == model].sort_values("row")
        assert np.abs(_probs(pa.Table.from_pandas(g)) - _probs(pa.Table.from_pandas(e))).max() \
            <= 1e-6
        assert (g.y_true.to_numpy() == e.y_true.to_numpy()).all()
        assert (g.y_pred.to_numpy() == e.y_pred.to_numpy()).all()


def test_evaluate_prints_the_table(in_graph_run, capsys):
    (in_graph_run / "metrics.parquet").unlink()
    assert run_cli("evaluate", "--run", in_graph_run) == 0
    out = capsys.readouterr().out
    for label in ("member-0", "mean member", "best member", "ensemble-mean", "ensemble-vote",
                  "ensemble-mean vs mean member", "ensemble-mean vs best member"):
        assert label in out
    assert (in_graph_run / "metrics.parquet").is_file()


@pytest.mark.parametrize("argv, match", [
    (["train", "--members", "0"], "--members: expected a positive integer"),
    (["train", "--mode", "sideways"], "invalid choice: 'sideways'"),
    (["train", "--devices", "/TPU:9"], "Unknown device '/device:TPU:9'"),
    (["train", "--devices", "cpu:x"], "cpu:N"),
    (["train", "--data", "missing.csv"], "Data file not found: missing.csv"),
    (["train", "--config", "nope.toml"], "Config file not found: nope.toml"),
    (["evaluate", "--run", "/nonexistent"], "Not a run directory"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line(argv, match, capsys, tmp_path):
    assert run_cli(*argv, *(["--run-dir", tmp_path / "r"] if argv[0] == "train" else [])) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err
    assert not (tmp_path / "r").exists()


def test_predict_errors(in_graph_run, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    pcsv.write_csv(pa.table({"pixel_0_0": [1.0]}), bad)
    assert run_cli("predict", "--run", in_graph_run, "--data", bad, "--out",
                   tmp_path / "o.parquet") == 2
    assert "missing from" in capsys.readouterr().err
    assert run_cli("predict", "--run", in_graph_run, "--data", "digits", "--out",
                   tmp_path / "o.txt") == 2
    assert "--out to end in .parquet or .csv" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()
    # an upper-case suffix is the same format (it was refused)
    assert run_cli("predict", "--run", in_graph_run, "--data", "digits", "--out",
                   tmp_path / "P.CSV") == 0
    assert (tmp_path / "P.CSV").read_text().startswith('"row","y_true"')


def test_existing_run_is_not_overwritten(in_graph_run, tiny_config, capsys):
    before = (in_graph_run / "manifest.json").read_bytes()
    assert run_cli("train", "--config", tiny_config, "--run-dir", in_graph_run) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (in_graph_run / "manifest.json").read_bytes() == before


def _tabular_csv(path, n=90, with_id=False):
    """A CSV with the traits of the Palmer penguins file: string features, missing numbers and
    categories, a missing label; `with_id` adds an id column first (as at predict time)."""
    rng = np.random.default_rng(0)
    species = np.array(["Adelie", "Gentoo", "Chinstrap"])[np.arange(n) % 3]
    island = np.where(species == "Gentoo", "Biscoe", rng.choice(["Dream", "Torgersen"], n))
    bill = np.where(species == "Adelie", 38.0, 47.0) + rng.normal(0, 2, n)
    lines = ["island,bill_length_mm,sex,species"]
    for i in range(n):
        b = "" if i % 17 == 5 else f"{bill[i]:.1f}"
        sex = "" if i % 13 == 7 else rng.choice(["male", "female"])
        label = "" if (i == n - 1 and not with_id) else species[i]
        lines.append(f"{island[i]},{b},{sex},{label}")
    if with_id:
        lines = [f"{'id' if i == 0 else f'P-{i:03d}'},{ln}" for i, ln in enumerate(lines)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_tabular_csv_as_people_have_it(mode, tmp_path, capsys):
    folder = tmp_path / "project"
    folder.mkdir()
    _tabular_csv(folder / "animals.csv")
    _tabular_csv(folder / "animals_with_id.csv", with_id=True)
    (folder / "c.toml").write_text(  # a relative source: beside the config, not the cwd
        '[data]\nsource = "animals.csv"\ntarget = "species"\nimpute = "median"\n'
        '[members]\ncount = 2\nhidden = [8]\n[training]\nepochs = 2\n'
        '[placement]\ndevices = "cpu:2"\n')
    run_dir = tmp_path / "run"
    assert run_cli("train", "--config", folder / "c.toml", "--mode", mode,
                   "--run-dir", run_dir) == 0
    assert "dropped 1 row of" in capsys.readouterr().err
    pre = json.loads((run_dir / "preprocessing.json").read_text())
    assert pre["categories"]["island"] == ["Biscoe", "Dream", "Torgersen"]
    assert pre["impute"] == "median" and "island=Biscoe" in pre["output_names"]
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", run_dir, "--data", folder / "animals_with_id.csv",
                   "--out", out, "--layout", "long") == 0  # either mode's run (see compare)
    captured = capsys.readouterr()
    assert "ignoring column 'id'" in captured.err
    table = pq.read_table(out)
    assert table.filter(pa.compute.equal(table["model"], "ensemble-mean")).num_rows == 90
    assert sorted(set(table.column("y_true").to_pylist())) == ["Adelie", "Chinstrap", "Gentoo"]


def test_evaluate_plots_help_names_every_picture_it_writes():
    """`evaluate --plots` writes confidence.png too (and a regression run's own pictures);
    its help named only reliability, ensemble size and members."""
    from pipelines.cli import COMMANDS
    from pipelines.options import build_parser

    sub = build_parser(COMMANDS).commands["evaluate"]
    text = next(a.help for a in sub._actions if "--plots" in a.option_strings)
    for picture in ("reliability", "ensemble size", "members", "confidence", "PIT", "coverage",
                    "error against std", "ood_entropy.png", "shift.png"):
        assert picture in text, picture


def test_ensemble_alone_and_help_list_the_commands_with_examples(capsys):
    from pipelines.cli import COMMANDS
    from pipelines.options import build_parser

    assert run_cli() == 0
    alone = capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        run_cli("--help")
    assert done.value.code == 0
    helped = capsys.readouterr().out
    for text in (alone, helped):
        for name in ("train", "predict", "evaluate", "aggregate", "compare", "client", "server"):
            line = next(ln for ln in text.splitlines() if ln.strip().startswith(name))
            assert len(line.split()) > 2, line  # the command and its one line
        assert text.count("\n  ensemble ") == 3  # three examples
    # every option has help, with its default
    for name, sub in build_parser(COMMANDS).commands.items():
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                shown = sub.formatter_class("x")._get_help_string(action)
                assert action.help and ("default" in shown or action.required), (name, action)


@pytest.mark.parametrize("argv, needle", [
    (["train", "--member", "3"], "unrecognized arguments: --member 3 (did you mean --members?)"),
    (["train", "--epoch", "3"], "did you mean --epochs?"),
    (["predict", "--run", "r", "--data", "d", "--out", "o.parquet", "--strict-column"],
     "did you mean --strict-columns?"),
    (["trian"], "invalid choice: 'trian'"),
    (["trian"], "(did you mean train?)"),
    (["train", "--mode", "ingraph"], "(did you mean in-graph?)"),
    (["train", "--jobs", "2"], "--jobs applies to --mode between-graph only"),
    (["predict", "--run", "r", "--data", "d", "--out", "o.parquet", "--jobs", "2"],
     "--jobs applies to --mode between-graph only"),
    (["predict", "--run", "r", "--data", "d", "--out", "o.parquet", "--mode", "between-graph",
      "--devices", "cpu:2"], "--devices applies to --mode in-graph only"),
])
def test_cli_guides_abbreviations_typos_and_inapplicable_options(argv, needle, capsys):
    assert run_cli(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_cpu_devices_beyond_the_members_are_capped_with_a_notice(capsys):
    from pipelines.cli import COMMANDS
    from pipelines.flags import load_config
    from pipelines.options import parse

    _, args = parse(["train", "--members", "3", "--devices", "cpu:100"], COMMANDS)
    assert load_config(args).placement.devices == "cpu:3"
    assert "more logical devices than the 3 members; using cpu:3" in capsys.readouterr().err
    _, args = parse(["train", "--members", "3", "--devices", "cpu:2"], COMMANDS)
    assert load_config(args).placement.devices == "cpu:2"


def test_predict_stdout_holds_no_json(in_graph_run, tmp_path, capsys):
    out = tmp_path / "p.parquet"
    capsys.readouterr()
    assert run_cli("predict", "--run", in_graph_run, "--data", "digits", "--out", out) == 0
    printed = capsys.readouterr().out
    assert printed.strip() and "{" not in printed, printed
    assert run_cli("predict", "--run", in_graph_run, "--data", "digits", "--out", out,
                   "--json") == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 1797


def test_predict_reports_input_problems_before_tensorflow(in_graph_run, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    bad = tmp_path / "bad.csv"
    bad.write_text("pixel_0_0,pixel_0_1,note\n1,,x\n")
    code = ("import sys; from pipelines.cli import main; rc = main(['predict', '--run', "
            f"{str(in_graph_run)!r}, '--data', {str(bad)!r}, '--out', 'o.parquet']); "
            "print(rc, 'tensorflow' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ,
                                             "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr
    assert "62 training columns" in proc.stderr and "ignoring column 'note'" in proc.stderr


def test_evaluate_table_reads_well(in_graph_run, capsys):
    from ensemble.tasks.report import number

    assert number(-0.00004) == "0.0000" and number(-0.00004, signed=True) == "0.0000"
    assert number(0.01234, signed=True) == "+0.0123" and number(None) == "n/a"
    assert run_cli("evaluate", "--run", in_graph_run) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "-0.0000" not in out
    assert out.index("validation (") < out.index("test (")
    assert "(better)" in lines[1] and "higher" in lines[1] and "lower" in lines[1]
    flat = " ".join(out.split())
    assert "chosen on validation" in flat and "against the mean member" in flat
    assert lines[-1].endswith("member.")  # the verdict sentence ends the table


def test_verdict_follows_the_runs_aggregators_json(in_graph_run):
    """Without validation rows (a predict file) the verdict named the mean, not the
    aggregator of lowest validation NLL in `aggregators.json` that predict answers with."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ensemble.tasks.classification.evaluation import format_table

    rows = [r for r in pq.read_table(in_graph_run / "metrics.parquet").to_pylist()
            if r["split"] == "test"]
    mean = next(r for r in rows if r["aggregator"] == "mean")
    rows.append({**mean, "model": "ensemble-temperature", "aggregator": "temperature"})
    fit = {"validation_nll": {"mean": 1.0, "vote": None, "temperature": 0.5}}
    text = " ".join(format_table(pa.Table.from_pylist(rows), fit).split())
    assert "ensemble (ensemble-temperature, chosen on validation)" in text


def test_evaluate_plots(in_graph_run, capsys, monkeypatch):
    assert run_cli("evaluate", "--run", in_graph_run, "--plots") == 0
    out = capsys.readouterr().out
    for name in ("reliability.png", "ensemble_size.png", "members.png"):
        assert (in_graph_run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plot: {in_graph_run / name}" in out
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # not installed
    assert run_cli("evaluate", "--run", in_graph_run, "--plots") == 2
    assert "matplotlib" in capsys.readouterr().err


def test_top_level_options(capsys):
    """`ensemble --version` prints the version; an unknown option before any command is an
    error (exit 2), not the help with status 0."""
    from importlib import metadata

    with pytest.raises(SystemExit) as done:
        run_cli("--version")
    assert done.value.code == 0
    version = metadata.version("ensemble-replication")
    assert capsys.readouterr().out.strip() == f"ensemble {version}"
    assert run_cli("--bogus") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: Unknown option '--bogus'; expected a command first: ensemble COMMAND "
                   "[options] (`ensemble --help` lists the commands)."]
