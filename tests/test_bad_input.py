"""Bad input, over every command: exit status 2, one clear line, nothing existing overwritten."""

import ast
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from conftest import ROOT, run_cli, set_status

from ensemble.core import artifacts


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_config):
    run_dir = tmp_path_factory.mktemp("bad") / "run"
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir,
                   "--members", "2") == 0
    return run_dir


def _one_line(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


@pytest.mark.parametrize("argv, needle", [
    (["train", "--seed", "-1"], "--seed: expected an integer >= 0"),
    (["train", "--epochs", "-3"], "--epochs: expected a positive integer"),
    (["train", "--members", "two"], "--members: expected a positive integer"),
    (["train", "--devices", ""], "--devices"),
    (["train", "--data", "table.xlsx"], "Unknown data source 'table.xlsx'"),
    (["train", "--resume"], "Expected --run-dir PATH of the run to continue with --resume"),
    (["train", "--prepare-only"], "--prepare-only is for --mode between-graph"),
    (["predict", "--run", "x"], "the following arguments are required"),
    (["aggregate", "--run", "/nonexistent"], "Not a run directory"),
    (["client", "--run", "/nonexistent", "--member", "0"], "Not a run directory"),
    (["aggregate", "--run", "/tmp", "--min-members", "0"], "--min-members"),
])
def test_usage_errors(argv, needle, capsys):
    assert run_cli(*argv) == 2
    _one_line(capsys, needle)


def test_data_file_problems_at_train(tmp_path, capsys):
    cases = {
        "empty.csv": "",
        "notcsv.csv": "a,b\n1,2,3,4\n\x00\x01",
        "nan.csv": "f1,f2,target\n1,2,0\nnan,3,1\n",
        "inf.csv": "f1,f2,target\n1,2,0\ninf,3,1\n",
        "strings.csv": "f1,f2,target\n1,a,0\n2,,1\n",
        "oneclass.csv": "f1,f2,target\n1,2,0\n3,4,0\n",
        "notarget.csv": "f1,f2,label\n1,2,0\n3,4,1\n",
    }
    needles = {"empty.csv": "empty", "notcsv.csv": "Cannot read", "nan.csv": "missing values",
               "inf.csv": "NaN or inf", "strings.csv": "'f2'", "oneclass.csv": "two classes",
               "notarget.csv": "Target column 'target' not found"}
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert run_cli("train", "--data", path, "--run-dir", tmp_path / "r") == 2, name
        _one_line(capsys, needles[name])
        assert not (tmp_path / "r").exists()
    (tmp_path / "dir.csv").mkdir()  # exists but is not a readable file
    assert run_cli("train", "--data", tmp_path / "dir.csv", "--run-dir", tmp_path / "r") == 2
    _one_line(capsys, "dir.csv")
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(b"PAR1 but not really")
    assert run_cli("train", "--data", fake, "--run-dir", tmp_path / "r") == 2
    _one_line(capsys, "as Parquet")


@pytest.mark.parametrize("options, needle", [
    (["--target", "late"], "Target column 'late' not found (did you mean 'Late'?)"),
    (["--target", "Late", "--drop", "arr_dely"], "(did you mean 'arr_delay'?)"),
    (["--target", "Late", "--categorical", "carier"], "(did you mean 'carrier'?)"),
])
def test_misspelt_column_names_get_did_you_mean(options, needle, tmp_path, capsys):
    """Issue 40: --target, --drop and --categorical name the closest column, as options do."""
    path = tmp_path / "flights.csv"
    path.write_text("carrier,arr_delay,dep_delay,Late\nAA,2,1,0\nUA,30,25,1\n" * 10)
    assert run_cli("train", "--data", path, *options, "--run-dir", tmp_path / "run") == 2
    _one_line(capsys, needle)
    assert not (tmp_path / "run").exists()


def test_wrong_features_at_predict(trained, tmp_path, capsys):
    from sklearn.datasets import load_digits

    d = load_digits()
    cols = {n: d.data[:5, i] for i, n in enumerate(d.feature_names)}
    fewer = tmp_path / "fewer.csv"
    pcsv.write_csv(pa.table({k: v for k, v in list(cols.items())[:-1]}), fewer)
    more = tmp_path / "more.csv"
    pcsv.write_csv(pa.table({**cols, "extra": np.zeros(5)}), more)
    out = tmp_path / "out.parquet"
    assert run_cli("predict", "--run", trained, "--data", fewer, "--out", out) == 2
    _one_line(capsys, "'pixel_7_7' missing")
    assert run_cli("predict", "--run", trained, "--data", more, "--out", out,
                   "--strict-columns") == 2
    _one_line(capsys, "extra column 'extra'", "--strict-columns")
    assert not out.exists()


def _replace_member(run_dir, data: bytes):
    """Swap member 0's file for `data` and record its sha256, as a forged run would."""
    path = artifacts.member_model_path(run_dir, 0)
    path.write_bytes(data)
    manifest = artifacts.read_manifest(run_dir)
    manifest["artifacts"]["members/member-0.keras"] = artifacts.sha256_file(path)
    artifacts.write_manifest(run_dir, manifest)


def test_model_file_that_is_not_keras(trained, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    _replace_member(run_dir, b"this is not a zip archive")
    assert run_cli("predict", "--run", run_dir, "--data", "digits", "--out",
                   tmp_path / "o.parquet") == 2
    _one_line(capsys, "Cannot load member model", "member-0.keras")


def test_model_that_needs_unsafe_loading_is_refused(trained, tmp_path, capsys):
    import keras

    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    evil = keras.Sequential([keras.Input((64,)), keras.layers.Lambda(lambda x: x[:, :10] * 0),
                             keras.layers.Softmax()])
    path = tmp_path / "evil.keras"
    evil.save(path)
    _replace_member(run_dir, path.read_bytes())
    assert run_cli("predict", "--run", run_dir, "--data", "digits", "--out",
                   tmp_path / "o.parquet") == 2
    _one_line(capsys, "Cannot load member model", "safely")
    assert not (tmp_path / "o.parquet").exists()


def test_overwrite_is_explicit(trained, tmp_path, tiny_config, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir) == 2
    _one_line(capsys, "already holds a run", "--overwrite")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir, "--members", "1",
                   "--overwrite") == 0
    assert len(artifacts.read_manifest(run_dir)["members"]) == 1
    assert not artifacts.member_model_path(run_dir, 1).exists()


def test_predict_refuses_an_unfinished_run(trained, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    set_status(run_dir, "failed")
    assert run_cli("predict", "--run", run_dir, "--data", "digits", "--out",
                   tmp_path / "o.parquet") == 2
    _one_line(capsys, "is failed, not completed", "--resume")


def test_bad_paths_and_files_at_predict(trained, tmp_path, capsys):
    out = tmp_path / "o.parquet"
    folder = tmp_path / "folder.parquet"
    folder.mkdir()
    a_file = tmp_path / "file.txt"
    a_file.write_text("not a folder")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"\x00\x01" * 64)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    for argv, needle in [
        (["--data", "digits", "--out", folder], f"{folder} (a folder)"),
        (["--data", "digits", "--out", a_file / "o.parquet"], f"{a_file} is a file"),
        (["--data", "digits", "--out", tmp_path / "o.json"], "end in .parquet or .csv"),
        (["--data", garbage, "--out", out], str(garbage)),
        (["--data", empty, "--out", out], "empty"),
        (["--data", tmp_path / "missing.csv", "--out", out], "missing.csv"),
        (["--data", tmp_path / "nothing-here", "--out", out], "nothing-here"),
    ]:
        assert run_cli("predict", "--run", trained, *argv) == 2, argv
        _one_line(capsys, needle)
    assert not out.exists() and not any(folder.iterdir())
    assert run_cli("predict", "--run", trained, "--data", "digits", "--out", folder,
                   "--mode", "between-graph") == 2
    _one_line(capsys, "(a folder)")


def test_bad_input_at_aggregate(trained, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert run_cli("aggregate", "--run", run_dir, "--aggregators", "mean,median") == 2
    _one_line(capsys, "Expected --aggregators", "'mean,median'")
    assert run_cli("aggregate", "--run", a_file) == 2
    _one_line(capsys, "Not a run directory")
    manifest = artifacts.read_manifest(run_dir)
    del manifest["artifacts"]["predictions.parquet"]
    artifacts.write_manifest(run_dir, manifest)
    before = (run_dir / "metrics.parquet").read_bytes()
    assert run_cli("aggregate", "--run", run_dir) == 2
    _one_line(capsys, f"No sha256 recorded for {run_dir / 'predictions.parquet'}")
    assert (run_dir / "metrics.parquet").read_bytes() == before


def test_bad_input_at_client(trained, tmp_path, capsys):
    out = tmp_path / "o.parquet"
    not_npz = tmp_path / "x.npz"
    not_npz.write_bytes(b"not a zip")
    no_x = tmp_path / "nox.npz"
    np.savez(no_x, y=np.zeros(3))
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.zeros((3, 5), np.float32))
    for argv, needle in [
        (["--member", "5"], "Expected `--member` in 0..1"),
        (["--member", "0", "--out", out], "--out applies with --predict only"),
        (["--member", "0", "--predict", not_npz, "--out", out], f"cannot read --predict {not_npz}"),
        (["--member", "0", "--predict", no_x, "--out", out], "holds no array `x`"),
        (["--member", "0", "--predict", wrong, "--out", out], "shape [n_rows, 64]"),
        (["--member", "0", "--predict", tmp_path / "gone.npz", "--out", out], "gone.npz"),
        (["--member", "0", "--predict", wrong], "--predict needs --out"),
    ]:
        assert run_cli("client", "--run", trained, *argv) == 2, argv
        _one_line(capsys, needle)
    assert not out.exists()


def test_bad_input_at_evaluate(trained, tmp_path, capsys):
    folder = tmp_path / "p.parquet"
    folder.mkdir()
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1" + b"\x00" * 32)
    metrics = tmp_path / "metrics.parquet"
    shutil.copy(trained / "metrics.parquet", metrics)
    (tmp_path / "preds.csv").write_text("row,y_pred\n0,1\n")
    for argv, needle in [
        ([], "Expected --run PATH or --predictions"),
        (["--predictions", folder], "(a folder)"),
        (["--predictions", tmp_path / "gone.parquet"], "gone.parquet (missing)"),
        (["--predictions", garbage], f"Damaged or invalid Parquet file {garbage}"),
        (["--predictions", metrics], "is not a predictions file of `ensemble predict`"),
        (["--predictions", tmp_path / "preds.csv"], "a .parquet file of `ensemble predict` (either layout). Received:"),
        (["--run", tmp_path], "Not a run directory"),
    ]:
        assert run_cli("evaluate", *argv) == 2, argv
        _one_line(capsys, needle)


PREFIXES = ("ensemble ", "client: ")  # argparse's frame (`ensemble train: ...`); a client's own


def _usage_errors():
    """(place, opening text) of every `UsageError(...)` in the packages whose message opens
    with text (not a value)."""
    for path in sorted([*ROOT.glob("ensemble/**/*.py"), *ROOT.glob("pipelines/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args and "UsageError" in (
                    getattr(node.func, "id", None), getattr(node.func, "attr", None))):
                continue
            first = node.args[0]
            while isinstance(first, (ast.BinOp, ast.JoinedStr)):  # "..." + x, f"...{x}"
                first = first.left if isinstance(first, ast.BinOp) else first.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield f"{path.relative_to(ROOT)}:{node.lineno}", first.value


def test_usage_errors_open_with_a_capital_as_sentences_do():
    found = list(_usage_errors())
    assert len(found) > 300  # the walk sees the messages
    assert [f"{where} {text[:30]!r}" for where, text in found if (text[:1].islower() or
            text.startswith("-")) and not text.startswith(PREFIXES)] == []


def test_engine_ray_without_ray_is_refused_before_the_run_directory(tmp_path, capsys,
                                                                    monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    run_dir = tmp_path / "run"
    assert run_cli("train", "--data", "digits", "--members", "2", "--epochs", "1", "--mode",
                   "between-graph", "--engine", "ray", "--run-dir", run_dir, "--quiet") == 2
    _one_line(capsys, "Expected the `ray` package for --engine ray", "no module named ray")
    assert not run_dir.exists()


def test_evaluate_data_given_predicts_output_points_to_predictions(trained, tmp_path, capsys):
    """`ensemble predict`'s output passed as --data (new features to predict) is refused in
    one line that names the flag which scores it."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True, as_frame=True)
    data, preds = tmp_path / "new.csv", tmp_path / "preds.parquet"
    x.head(30).assign(target=y.head(30)).to_csv(data, index=False)
    assert run_cli("predict", "--run", trained, "--data", data, "--out", preds) == 0
    capsys.readouterr()
    assert run_cli("evaluate", "--run", trained, "--data", preds) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "missing from the input" in err, err
    assert f"score it with `ensemble evaluate --predictions {preds}`" in err, err
    assert run_cli("evaluate", "--predictions", preds) == 0


def test_evaluate_of_unlabelled_data_names_the_data(trained, tmp_path, capsys):
    from sklearn.datasets import load_digits

    x, _ = load_digits(return_X_y=True, as_frame=True)
    data = tmp_path / "unlabelled.csv"
    x.head(20).to_csv(data, index=False)
    assert run_cli("evaluate", "--run", trained, "--data", data) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{data} has no rows with a known y_true" in err and "--target COL" in err, err
    assert "ensemble-evaluate-" not in err  # not the temporary predictions file
