"""Bad values, part three: configs outside their domain, numbers beyond float32, duplicate
column names, text that is not UTF-8, options that cannot apply to the run they name. Each is
exit status 2 with one line naming the value, and no run directory or output left behind."""

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from conftest import run_cli

from ensemble.core import artifacts


def _one_line(capsys, *needles):
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if not line.startswith("notice:")]
    assert len(err) == 1, err
    for n in needles:
        assert n in err[0], err[0]
    return err[0]


@pytest.mark.parametrize("toml, needle", [
    ("[training]\nlearning_rate = nan\n", "training.learning_rate` to be a finite number"),
    ("[training]\nlearning_rate = 1e300\n", "`training.learning_rate` <= 10"),
    ("[data]\ntest_size = inf\n", "data.test_size` to be a finite number"),
    ("[members]\ndropout = -inf\n", "members.dropout` to be a finite number"),
    ("[members]\ncount = 2\n[aggregation]\nweights = [1e308, 1e308]\n", "finite sum"),
    ("[training]\nseed = 9223372036854775807\n", "`training.seed` <= 4,294,967,295"),
    ("[data]\nsource = \"synthetic\"\n[data.synthetic]\nclasses = 40\nfeatures = 4\n",
     "`data.synthetic.classes`"),
    ("[[members.override]]\nindex = 0\nlearning_rate = nan\n",
     "members.override[0].learning_rate` to be a finite number"),
])
def test_config_values_outside_their_domain_make_no_run_directory(tmp_path, capsys, toml,
                                                                  needle):
    config = tmp_path / "c.toml"
    config.write_text(toml)
    assert run_cli("train", "--config", config, "--run-dir", tmp_path / "run") == 2
    _one_line(capsys, needle)
    assert not (tmp_path / "run").exists()


def _write(path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_data_problems_at_train_name_the_column_and_row(tmp_path, capsys):
    rows = "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40))
    for name, text, needles in [
        ("dup.csv", "a,a,target\n" + rows, ["column name 'a' twice", "columns 1 and 2"]),
        ("big.csv", "f1,f2,target\n" + rows + "1e39,2,1\n", ["'f1' row 40", "1e+39",
                                                             "beyond float32"]),
        ("label.csv", "f1,f2,target\n" + rows + "1,2,1e300\n", ["target column 'target'"]),
    ]:
        path = _write(tmp_path / name, text)
        assert run_cli("train", "--data", path, "--run-dir", tmp_path / "run") == 2, name
        _one_line(capsys, *needles)
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("nan_rows", [[5, 1500, 2500, 2999], [1500, 2500]])
def test_impute_error_counts_missing_values_over_the_whole_file(tmp_path, capsys, nan_rows):
    """Training streams a Parquet file of three row groups; `--impute error` refused with the
    count of the first bad chunk alone (1 row). The whole file is counted: the missing
    values of every row group, and of a text column, with the first row of each, whether the
    first chunk or a later one holds the first missing value; rows without a label (which
    training drops) are not counted."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    x = rng.normal(size=3000)
    x[nan_rows] = np.nan
    x[7] = np.nan  # unlabelled: dropped, not counted
    kind = rng.choice(["u", "v"], 3000).astype(object)
    kind[2000] = None
    label = np.where(rng.normal(size=3000) > 0, "a", "b").astype(object)
    label[7] = None
    pq.write_table(pa.table({"x": x, "kind": kind.tolist(), "label": label.tolist()}),
                   tmp_path / "t.parquet", row_group_size=1000)
    assert run_cli("train", "--data", tmp_path / "t.parquet", "--target", "label",
                   "--impute", "error", "--run-dir", tmp_path / "run") == 2
    _one_line(capsys, "column 'x' (1 row) holds missing values (empty cells, nulls or NaN;",
              "In the whole input (3,000 rows in the file; its labelled rows counted, the "
              f"rows training reads): column 'x' {len(nan_rows)} rows missing "
              f"(first at row {nan_rows[0]:,}); column 'kind' 1 row missing (first at row "
              "2,000).")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("nan_rows", [[1500, 2500], [10, 2500]])  # a later chunk, the first
def test_impute_error_whole_file_count_leaves_the_identifier_out(tmp_path, capsys, nan_rows):
    """An identifier column (carried through, never a feature: its missing value is not
    refused) was counted and named among the whole file's missing values."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    x = rng.normal(size=3000)
    x[nan_rows] = np.nan
    ids = [f"id{i}" for i in range(3000)]
    ids[20] = ids[2200] = None
    label = np.where(rng.normal(size=3000) > 0, "a", "b")
    pq.write_table(pa.table({"id": ids, "x": x, "label": label}), tmp_path / "t.parquet",
                   row_group_size=1000)
    assert run_cli("train", "--data", tmp_path / "t.parquet", "--target", "label",
                   "--impute", "error", "--run-dir", tmp_path / "run") == 2
    line = _one_line(capsys, "In the whole input (3,000 rows in the file; its labelled rows counted, the rows training reads): column 'x' 2 rows missing "
                     f"(first at row {nan_rows[0]:,}).")
    assert "'id'" not in line, line


def test_a_column_dropped_at_training_is_not_named_as_ignored_at_predict(tmp_path, capsys):
    """`--drop batch` at train: predict named `batch` again among the ignored columns. It is
    carried through to the wide output unnamed (as an id is, `--strict-columns` included);
    a column the run never saw is still named."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 2))
    table = pa.table({"f1": x[:, 0], "f2": x[:, 1], "batch": np.arange(120) % 7,
                      "label": np.where(x[:, 0] > 0, "a", "b")})
    pq.write_table(table, tmp_path / "t.parquet")
    assert run_cli("train", "--data", tmp_path / "t.parquet", "--target", "label", "--drop",
                   "batch", "--members", "2", "--epochs", "1", "--devices", "cpu:2",
                   "--run-dir", tmp_path / "run", "--quiet") == 0
    pq.write_table(table.append_column("note", pa.array(["x"] * 120)), tmp_path / "new.parquet")
    out = tmp_path / "p.parquet"
    capsys.readouterr()
    assert run_cli("predict", "--run", tmp_path / "run", "--data", tmp_path / "new.parquet",
                   "--out", out) == 0
    err = capsys.readouterr().err
    assert "ignoring column 'note' of" in err and "'batch'" not in err, err
    assert pq.read_table(out).column("batch").to_pylist() == table.column("batch").to_pylist()
    assert run_cli("predict", "--run", tmp_path / "run", "--data", tmp_path / "t.parquet",
                   "--out", out, "--strict-columns") == 0
    assert "batch" not in capsys.readouterr().err


def test_latin1_text_in_a_categorical_column_is_named(tmp_path, capsys):
    rows = b"".join(b"%d,%s,%d\n" % (i, [b"caf\xe9", b"th\xe9", b"ok"][i % 3], i % 2)
                    for i in range(40))
    data = _write(tmp_path / "latin1.csv", b"f1,drink,target\n" + rows)
    config = _write(tmp_path / "c.toml", f'[data]\nsource = "{data}"\ncategorical = ["drink"]\n')
    for argv in (["--config", config], ["--data", data]):  # listed, and found by "auto"
        assert run_cli("train", *argv, "--run-dir", tmp_path / "run") == 2
        _one_line(capsys, "column 'drink' row 0 holds text that is not UTF-8", "iconv")
        assert not (tmp_path / "run").exists()


def test_latin1_header_and_labels_are_named_at_train_and_predict(trained, tmp_path, capsys):
    rows = b"".join(b"%d,%d,%s\n" % (i, i % 3, [b"s\xe9tosa", b"ok"][i % 2]) for i in range(40))
    labels = _write(tmp_path / "labels.csv", b"f1,f2,target\n" + rows)
    assert run_cli("train", "--data", labels, "--run-dir", tmp_path / "run") == 2
    # row 0 (the rows counted from 0, as a feature's are), not row 1
    _one_line(capsys, "column 'target' row 0 holds text that is not UTF-8", "iconv")
    header = _write(tmp_path / "header.csv", b"f1,f\xe4rbung,target\n" + b"1,2,0\n" * 40)
    assert run_cli("train", "--data", header, "--run-dir", tmp_path / "run") == 2
    _one_line(capsys, "header of", "not UTF-8", "f\ufffdrbung", "iconv")
    assert not (tmp_path / "run").exists()
    lines = _digits_csv(tmp_path / "in.csv", n=5).read_text().splitlines()
    latin = _write(tmp_path / "latin.csv", "\n".join(
        [lines[0] + ",f\xe4rbung"] + [line + ",1" for line in lines[1:]]).encode("latin-1"))
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", trained, "--data", latin, "--out", out) == 2
    _one_line(capsys, "header of", "not UTF-8", "iconv")
    assert not out.exists()


def _digits_csv(path, n=100, changes=()):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.data[:n].astype(np.float64)
    for row, col, value in changes:
        x[row, col] = value
    cols = {name: x[:, i] for i, name in enumerate(d.feature_names)}
    pcsv.write_csv(pa.table(cols), path)
    return path


@pytest.mark.parametrize("value, needle", [
    (1e39, "'pixel_0_1' row 70 holds 1e+39, beyond float32"),
    (3.3e38, "column 'pixel_0_1' at row 70"),  # fits float32, not once scaled
])
def test_values_beyond_float32_mid_stream_at_predict(trained, tmp_path, capsys, value, needle):
    data = _digits_csv(tmp_path / "in.csv", changes=[(70, 1, value)])
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", trained, "--data", data, "--out", out,
                   "--batch-size", "32") == 2
    _one_line(capsys, needle)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_duplicate_and_latin1_columns_at_predict(trained, tmp_path, capsys):
    data = _digits_csv(tmp_path / "in.csv", n=5)
    lines = data.read_text().splitlines()
    dup = _write(tmp_path / "dup.csv", "\n".join(
        [lines[0] + ',"pixel_0_0"'] + [line + ",0" for line in lines[1:]]) + "\n")
    latin = _write(tmp_path / "latin.csv", "\n".join(
        [lines[0] + ",note"] + [line + ",x" for line in lines[1:]]).encode() + b"\n")
    latin.write_bytes(latin.read_bytes().replace(b",x\n", b",caf\xe9\n"))
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", trained, "--data", dup, "--out", out) == 2
    _one_line(capsys, str(dup), "column name 'pixel_0_0' twice", "columns 1 and 65")  # as train
    import pyarrow.parquet as pq

    table = pcsv.read_csv(data)
    twice = tmp_path / "twice.parquet"
    pq.write_table(pa.Table.from_arrays([*table.columns, table.column(3)],
                                        names=[*table.column_names, "pixel_0_3"]), twice)
    assert run_cli("predict", "--run", trained, "--data", twice, "--out", out) == 2
    _one_line(capsys, "column name 'pixel_0_3' twice", "columns 4 and 65")
    assert not out.exists()
    assert run_cli("predict", "--run", trained, "--data", latin, "--out", out) == 0
    assert "ignoring column 'note'" in capsys.readouterr().err  # not a feature: not read
    assert out.is_file()


def test_options_checked_against_the_run(trained, capsys):
    before = artifacts.read_manifest(trained)
    for k in ("3", "100"):
        assert run_cli("aggregate", "--run", trained, "--min-members", k) == 2
        _one_line(capsys, "Expected --min-members in 1..2", f"has 2 members). Received: {k}")
    assert run_cli("export", "--run", trained, "--out", trained.parent / "m",
                   "--aggregator", "stacking") == 2
    _one_line(capsys, "--aggregator")
    assert run_cli("predict", "--run", trained, "--data", "digits", "--replicas", "9",
                   "--devices", "cpu:2", "--out", trained.parent / "p.parquet") == 2
    _one_line(capsys, "--replicas")
    assert artifacts.read_manifest(trained) == before


def test_an_interruption_before_overwrite_names_the_kept_run_not_a_resume(trained, tmp_path):
    import shutil
    import signal
    from argparse import Namespace

    from ensemble.core.interrupt import Interrupted
    from pipelines.guide import interrupted_line

    args = Namespace(command="train", run_dir=str(trained))
    line = interrupted_line(Interrupted(signal.SIGINT), args)  # completed: --overwrite's start
    assert line == f"interrupted; {trained} holds a completed run"
    broken = tmp_path / "run"
    shutil.copytree(trained, broken)
    manifest = artifacts.read_manifest(broken)
    artifacts.write_manifest(broken, {**manifest, "status": "interrupted"})
    line = interrupted_line(Interrupted(signal.SIGINT, 2, 3), Namespace(command="train",
                                                                        run_dir=str(broken)))
    assert line == f"interrupted at epoch 2 of 3; continue with: ensemble train --resume " \
                   f"--run-dir {broken}"


def test_a_pandas_index_column_is_named_and_left_out_with_drop_empty(tmp_path, capsys):
    rows = "".join(f"{i},{(i * 7) % 11},{i % 3},{i % 2}\n" for i in range(120))
    data = _write(tmp_path / "indexed.csv", ",a,b,target\n" + rows)  # `DataFrame.to_csv()`
    argv = ["train", "--data", data, "--members", "2", "--epochs", "1", "--quiet"]
    assert run_cli(*argv, "--run-dir", tmp_path / "kept") == 0
    err = capsys.readouterr().err
    assert "column '' of" in err and "counts the rows (0, 1, ... in file order" in err, err
    assert run_cli(*argv, "--run-dir", tmp_path / "dropped", "--drop", "") == 0
    assert "column ''" not in capsys.readouterr().err
    import json

    for run in ("kept", "dropped"):  # a row counter is an identifier, never a feature
        pre = json.loads((tmp_path / run / "preprocessing.json").read_text())
        assert pre["feature_names"] == ["a", "b"]


def test_numbers_with_a_text_marker_are_refused_not_one_hot_encoded(tmp_path, capsys):
    rows = "".join(f"{'?' if i in (3, 17) else i * 1.5},{'xy'[i % 2]},{i % 2}\n"
                   for i in range(60))
    data = _write(tmp_path / "marked.csv", "dose,arm,target\n" + rows)
    argv = ["train", "--data", data, "--members", "2", "--epochs", "1", "--quiet"]
    assert run_cli(*argv, "--run-dir", tmp_path / "run") == 2
    _one_line(capsys, "column 'dose' holds numbers but for 2 rows of '?'", "--impute",
              "--categorical dose,arm")
    assert not (tmp_path / "run").exists()
    assert run_cli(*argv, "--run-dir", tmp_path / "run", "--categorical", "dose,arm") == 0
    many = _write(tmp_path / "words.csv", "dose,target\n" + "".join(  # 4 words: categories
        f"{['a', 'b', 'c', 'd', '1'][i % 5]},{i % 2}\n" for i in range(60)))
    assert run_cli("train", "--data", many, "--members", "2", "--epochs", "1", "--quiet",
                   "--run-dir", tmp_path / "words") == 0


@pytest.mark.parametrize("bad_row", [3, 20_000])  # in pyarrow's first block, and far past it
def test_text_in_a_numeric_column_at_predict_names_the_column_and_row(trained, tmp_path,
                                                                      capsys, bad_row):
    from sklearn.datasets import load_digits

    names = load_digits().feature_names
    x = np.random.default_rng(0).integers(0, 16, (bad_row + 50, len(names))).astype(str)
    x[bad_row, 5] = "oops"
    data = _write(tmp_path / "in.csv", "\n".join([",".join(names), *map(",".join, x)]) + "\n")
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", trained, "--data", data, "--out", out) == 2
    _one_line(capsys, f"column {names[5]!r} row {bad_row} holds 'oops'; expected a number")
    assert not out.exists()


def test_dropping_or_one_hot_encoding_the_target_is_refused_as_such(tmp_path, capsys):
    data = _write(tmp_path / "t.csv", "a,label\n" + "".join(f"{i},{i % 2}\n" for i in range(40)))
    assert run_cli("train", "--data", data, "--target", "label", "--drop", "label",
                   "--run-dir", tmp_path / "run") == 2
    _one_line(capsys, "Cannot drop the target column 'label'")
    assert not (tmp_path / "run").exists()
    # was "column 'label' holds text that is not UTF-8; ...; categorical column 'label' not
    # found" for a CSV (Parquet: "not found" alone), of a column that is there
    assert run_cli("train", "--data", data, "--target", "label", "--categorical", "label",
                   "--run-dir", tmp_path / "run") == 2
    _one_line(capsys, "Cannot one-hot encode the target column 'label'")
    assert not (tmp_path / "run").exists()


def test_a_folder_of_csv_files_is_named_as_such_at_train(tmp_path, capsys):
    folder = tmp_path / "tables"
    folder.mkdir()
    _write(folder / "part1.csv", "a,target\n" + "".join(f"{i},{i % 2}\n" for i in range(40)))
    assert run_cli("train", "--data", folder, "--run-dir", tmp_path / "run") == 2
    _one_line(capsys, "holds .csv files", "pass one of the files")


def test_hints_name_the_command_that_continues_a_search_or_a_failed_run(trained, tmp_path):
    import shutil
    import signal
    from argparse import Namespace

    from ensemble.core.errors import ClientFailed
    from ensemble.core.interrupt import Interrupted
    from pipelines.guide import failed_line, interrupted_line

    argv = ["search", "--config", "s.toml", "--candidates", "3", "--overwrite", "--run-dir",
            "old", "--set", "data.source=a b.csv"]
    args = Namespace(command="search", run_dir="runs/s1", argv=argv)
    assert interrupted_line(Interrupted(signal.SIGINT, 4, 30), args) == (
        "interrupted at epoch 4 of 30; continue with: ensemble search --config s.toml "
        "--candidates 3 --set 'data.source=a b.csv' --resume --run-dir runs/s1")
    failed = tmp_path / "run"
    shutil.copytree(trained, failed)
    artifacts.write_manifest(failed, {**artifacts.read_manifest(failed), "status": "failed"})
    line = failed_line(ClientFailed("client of members [1] failed (exit 1): boom"),
                       Namespace(command="train", run_dir=str(failed)))
    assert line == (f"client of members [1] failed (exit 1): boom; run {failed} marked failed "
                    f"(completed members kept): continue with: ensemble train --resume "
                    f"--run-dir {failed}")


def test_hints_quote_column_names_for_the_shell(tmp_path, capsys):
    """A hint is a command line to copy: `--drop visit date` passed `date` as a stray word.
    Column names are quoted as the shell needs (`shlex.quote`), and the estimators' wording
    still turns them into their parameters."""
    import shlex

    import pandas as pd

    rows = "".join(f"P{i:03d},2020-01-{1 + i % 28:02d},{'?' if i == 4 else i * 1.5},"
                   f"{'xy'[i % 2]},{i % 2}\n" for i in range(80))
    data = _write(tmp_path / "visits.csv", "patient id,visit date,dose mg,arm group,target\n"
                  + rows)
    assert run_cli("train", "--data", data, "--run-dir", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err

    def words(after: str, until: str) -> list[str]:
        return shlex.split(err.split(after, 1)[1].split(until, 1)[0])

    assert words("leave it out with ", " (or [data] drop)") == ["--drop", "visit date"]
    assert words("one-hot encode every value with ", ";") == ["--categorical",
                                                              "dose mg,arm group"]
    assert words("to use it as a feature anyway: ", " (or [data] categorical)") == [
        "--categorical", "dose mg,arm group,patient id"]
    from ensemble.sklearn import DeepEnsembleRegressor

    frame = pd.read_csv(data).drop(columns=["target", "dose mg"])
    frame["visit date"] = pd.to_datetime(frame["visit date"])
    with pytest.raises(ValueError, match=r"leave it out of X, or convert"):
        DeepEnsembleRegressor(n_members=1, epochs=1).fit(frame, np.arange(80.0))
    assert "anyway: categorical=['arm group', 'patient id']" in capsys.readouterr().err


def test_a_target_named_at_predict_must_be_in_the_input(trained, tmp_path, capsys):
    """`predict --target COL` with a misspelt COL gave a file with y_true empty and no word of
    it. A target named explicitly is now refused when the input lacks it (closest column
    named); the run's own target stays optional."""
    import pyarrow.parquet as pq

    from sklearn.datasets import load_digits

    table = pcsv.read_csv(_digits_csv(tmp_path / "x.csv", n=20))
    data = tmp_path / "in.csv"  # labelled: column `target`
    pcsv.write_csv(table.append_column("target", pa.array(load_digits().target[:20])), data)
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", trained, "--data", data, "--target", "targte",
                   "--out", out, "--quiet") == 2
    _one_line(capsys, "Target column 'targte' (--target) not found in", "did you mean 'target'")
    assert not out.exists()
    assert run_cli("predict", "--run", trained, "--data", data, "--target", "target",
                   "--out", out, "--quiet") == 0
    assert pq.read_table(out).column("y_true").null_count == 0
    bare = tmp_path / "bare.parquet"
    pq.write_table(pcsv.read_csv(data).drop_columns(["target"]), bare)
    assert run_cli("predict", "--run", trained, "--data", bare, "--out", out, "--quiet") == 0
    assert pq.read_table(out).column("y_true").null_count == 20
    # a feature named as the target was refused as "training column missing from the input"
    assert run_cli("predict", "--run", trained, "--data", data, "--target", "pixel_0_1",
                   "--out", out, "--quiet") == 2
    _one_line(capsys, "Target column 'pixel_0_1' (--target) is a feature of this run")


@pytest.mark.parametrize("body, row, record", [
    ("a,b,y\n1,2,0\n3,4,1\n5,6,7,0\n7,8,1\n", 2, 4),  # a row with one cell too many
    ("a,b,y\n1,2,0\n\"3,4,1\n5,6,0\n", 1, 3),  # an unclosed quote
])
def test_pyarrow_csv_errors_number_rows_as_source_row(tmp_path, capsys, body, row, record):
    """pyarrow's CSV parse errors count the file's records from 1, the header included; the
    message gives the data row (from 0, as `source_row`) and labels pyarrow's count."""
    (tmp_path / "t.csv").write_text(body)
    assert run_cli("train", "--data", tmp_path / "t.csv", "--target", "y", "--mode",
                   "between-graph", "--prepare-only", "--run-dir", tmp_path / "run") == 2
    _one_line(capsys, f"row {row} (data rows from 0, as source_row; pyarrow's CSV record "
                      f"{record}, the header record 1)")
    assert not (tmp_path / "run").exists()
